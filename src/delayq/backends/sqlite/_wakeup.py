"""How a waiting ``reserve`` learns that something changed, without busy polling.

Waiters (threads and asyncio tasks) note :attr:`Wakeup.generation`, look at the
database, then sleep until the next due time or until the generation moves. It moves

* at once when this backend object puts, nacks, reschedules or revives a message,
  or closes (:meth:`Wakeup.bump`, by way of :meth:`Wakeup.announce`);
* when *any other connection* (another process, or another backend object) commits:
  while somebody waits, one watcher thread per backend object reads
  ``PRAGMA data_version`` on its own connection. That pragma changes exactly when
  another connection has committed; reading it costs a few microseconds and takes
  no lock that could block a writer. The watcher reads it as soon as a writer's
  notification comes (:mod:`._notify`: a datagram on the watcher's socket beside the
  file, sent after the commit), and every ``poll_interval`` in any case, so that a
  lost notification only delays the wake-up to that poll.

The watcher lingers for a moment after the last waiter left, so a consumer looping
on ``reserve`` does not reopen its connection each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable

from ..._log import LOGGER_NAME
from ..._waiters import LoopSleeper, resolve
from ._connection import Pool
from ._constants import SQLITE_WATCHER_LINGER
from ._notify import Listener, Notifier, wake_directory

__all__ = ["Wakeup"]

_log = logging.getLogger(LOGGER_NAME)
_WAKEUPS: weakref.WeakSet[Wakeup] = weakref.WeakSet()


class Wakeup:
    """A generation counter that waiting threads and tasks sleep on."""

    def __init__(self, pool: Pool, poll_interval: float, *, notify: bool = True) -> None:
        self._pool = pool
        self._poll_interval = poll_interval
        self._notifier = Notifier(wake_directory(pool.path)) if notify else None
        self._listener: Listener | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers: set[LoopSleeper] = set()
        self._waiters = 0
        self._queues: Counter[str] = Counter()  # what the waiters wait for
        self._wanted_queues: set[str] = set()  # what the listener asked writers for
        self._watcher: threading.Thread | None = None
        #: The watcher's connection (None: not open), and the lock of its every use: a
        #: fork closes it first and holds the lock through (_before_fork).
        self._conn: sqlite3.Connection | None = None
        self._conn_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self.generation = 0
        """Moves whenever a waiter should look at the database again."""
        _WAKEUPS.add(self)

    def bump(self) -> None:
        """Wake every waiter now."""
        with self._lock:
            self.generation += 1
            self._cond.notify_all()
            sleepers = list(self._sleepers)
        for sleeper in sleepers:
            sleeper.wake()

    def announce(self, queue: str) -> None:
        """This backend object committed a change of ``queue`` a waiter may want: wake
        its own waiters, and notify those of other backend objects and processes."""
        self.bump()
        if self._notifier is not None:
            self._notifier.notify(queue)

    def close(self) -> None:
        """Wake every waiter for good and stop the watcher. Idempotent.

        Waits (briefly) for the watcher to close its connection, so the last
        connection of the process closes and SQLite removes the -wal/-shm files.
        """
        self._closed = True
        self._stop.set()
        self.bump()
        listener = self._listener
        if listener is not None:
            listener.poke()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=1.0)

    def after_fork(self) -> None:
        """In a child process: fresh locks, no watcher, no waiters of the parent."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = set()
        self._waiters = 0
        self._queues = Counter()
        self._wanted_queues = set()
        self._watcher = None
        self._conn = None  # closed before the fork (_before_fork)
        self._conn_lock = threading.Lock()
        self._listener = None  # the parent's (its thread is not in this process)
        if self._notifier is not None:
            self._notifier.after_fork()
        self._stop = threading.Event()
        if self._closed:
            self._stop.set()

    def wait(self, generation: int, timeout: float | None, queue: str) -> None:
        """Block the calling thread until the generation is no longer ``generation``,
        or ``timeout`` seconds passed (None: no limit); it waits for ``queue``."""
        with self._lock:
            if self._sleeps(generation, queue):
                try:
                    self._cond.wait(timeout)
                finally:
                    self._leave(queue)

    async def wait_async(self, generation: int, timeout: float | None, queue: str) -> None:
        """:meth:`wait` for a task: the event loop keeps running meanwhile, and
        cancelling the task just stops the wait."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._sleeps(generation, queue):
                return
            sleeper = LoopSleeper(loop)
            self._sleepers.add(sleeper)
        timer = None if timeout is None else loop.call_later(timeout, resolve, sleeper.future)
        try:
            await sleeper.future
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._sleepers.discard(sleeper)
                self._leave(queue)

    def _sleeps(self, generation: int, queue: str) -> bool:
        """What both waits do first (lock held): True when a waiter of ``queue`` that
        saw ``generation`` is to sleep, counted in (it leaves with :meth:`_leave`);
        False when it is to look again at once."""
        if self.generation != generation or self._closed:
            return False
        if self._enter(queue):
            return True
        self._leave(queue)
        return False

    def _enter(self, queue: str) -> bool:
        """Count a waiter in (lock held) and make sure the watcher runs. False when
        the waiter should look once more rather than sleep: writers were only just
        asked to notify its queue, so a commit of theirs before that went unsaid."""
        self._waiters += 1
        self._queues[queue] += 1
        if self._watcher is None and not self._closed:
            self._watcher = threading.Thread(
                target=self._watch, name="delayq-sqlite-watcher", daemon=True
            )
            self._watcher.start()
        listener = self._listener
        if listener is None or queue in self._wanted_queues:
            return True
        self._wanted_queues.add(queue)
        with contextlib.suppress(OSError):  # then the poll serves the queue
            listener.want(self._wanted_queues)
        return False

    def _leave(self, queue: str) -> None:
        """Count a waiter out (lock held)."""
        self._waiters -= 1
        self._queues[queue] -= 1
        if not self._queues[queue]:
            del self._queues[queue]

    def _wanted(self, names: set[bytes]) -> bool:
        """Whether a notification of ``names`` concerns a waiter (b"": any queue)."""
        with self._lock:
            return any(
                not name or name.decode("utf-8", "surrogatepass") in self._queues for name in names
            )

    def _version(self) -> tuple[int, bool]:
        """``PRAGMA data_version`` on the watcher's connection, and whether it was
        opened for this reading (first, or again after a fork closed it): then there is
        no earlier reading to compare it with."""
        with self._conn_lock:
            conn, opened = self._conn, self._conn is None
            if conn is None:
                conn = self._conn = self._pool.connect()
            return _data_version(conn), opened

    def close_for_fork(self) -> None:
        """Before a fork (its lock held from now until after it): close the watcher's
        connection; the watcher opens another at its next reading."""
        self._conn_lock.acquire()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def forked(self) -> None:
        """In the parent, once the fork :meth:`close_for_fork` preceded is done."""
        self._conn_lock.release()

    def _watch(self) -> None:
        stop = self._stop
        listener = self._listen()
        wait: Callable[[float], set[bytes]] = _sleep if listener is None else listener.wait
        interval = self._poll_interval
        try:
            version, _ = self._version()
            # Commits between a waiter's last look and this first reading are not
            # seen as a change: have every waiter look once more.
            self.bump()
            idle_since: float | None = None
            poll_at = time.monotonic() + interval
            while True:
                names = wait(max(0.0, poll_at - time.monotonic()))
                if stop.is_set():
                    return
                # A notification of a queue nobody here waits for is not worth a
                # look. Nor is data_version read for it: that could swallow the
                # commit of a writer that does not notify; the poll sees both.
                if time.monotonic() < poll_at and not self._wanted(names):
                    continue
                poll_at = time.monotonic() + interval
                with self._lock:
                    if self._waiters:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > SQLITE_WATCHER_LINGER:
                        self._watcher = None
                        return
                current, opened = self._version()
                if opened or current != version:
                    version = current
                    self.bump()
        except Exception:  # the next waiter starts a new watcher
            _log.warning("delayq: the SQLite change watcher failed", exc_info=True)
            with self._lock:
                self._watcher = None
            self.bump()
        finally:
            with self._conn_lock:
                conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            with self._lock:
                if self._watcher is threading.current_thread():
                    self._watcher = None
                if listener is not None and self._listener is listener:
                    self._listener = None
            if listener is not None:
                listener.close()

    def _listen(self) -> Listener | None:
        """The watcher's socket for notifications, or None (polling alone) when
        they are off or this platform or path cannot have one."""
        notifier = self._notifier
        if notifier is None:
            return None
        try:
            listener = Listener(wake_directory(self._pool.path))
        except OSError as exc:
            _log.debug("delayq: SQLite waiters poll only (no wake-up socket: %s)", exc)
            return None
        notifier.own = listener.path
        with self._lock:
            # The first reading that follows has every waiter look once more.
            self._wanted_queues = set(self._queues)
            with contextlib.suppress(OSError):
                listener.want(self._wanted_queues)
            self._listener = listener
        return listener


def _sleep(seconds: float) -> set[bytes]:
    """The watcher's wait without a listener: cheaper in CPU than Event.wait
    (close() is seen after it)."""
    time.sleep(seconds)
    return set()


def _data_version(conn: sqlite3.Connection) -> int:
    rows = conn.execute("PRAGMA data_version").fetchall()
    return int(rows[0][0])


#: The change watchers whose connection lock a fork under way holds (_before_fork).
_HELD: list[Wakeup] = []


def _before_fork() -> None:
    # Closed with their locks held through the fork, so that no watcher opens its
    # connection again before the child is made (a connection open at the fork would
    # leave the child SQLite's lock table of the parent: _connection.py).
    for wakeup in list(_WAKEUPS):
        wakeup.close_for_fork()
        _HELD.append(wakeup)


def _after_fork_in_parent() -> None:
    while _HELD:
        _HELD.pop().forked()


def _after_fork_in_child() -> None:
    _HELD.clear()
    for wakeup in list(_WAKEUPS):
        wakeup.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
