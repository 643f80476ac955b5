"""How a waiting ``reserve`` learns that something changed, without busy polling.

Waiters (threads and asyncio tasks) note :attr:`Wakeup.generation`, look at the
database, then sleep until the next due time or until the generation moves. It moves

* at once when this backend object puts, nacks, reschedules or revives a message,
  or closes (:meth:`Wakeup.bump`);
* within ``poll_interval`` when *any other connection* (another process, or another
  backend object) commits: while somebody waits, one watcher thread per backend object
  reads ``PRAGMA data_version`` on its own connection every ``poll_interval``. That
  pragma changes exactly when another connection has committed; reading it costs a
  few microseconds and takes no lock that could block a writer.

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

from ..._log import LOGGER_NAME
from ..._waiters import LoopSleeper, resolve
from ._connection import Pool
from ._constants import SQLITE_WATCHER_LINGER

__all__ = ["Wakeup"]

_log = logging.getLogger(LOGGER_NAME)
_WAKEUPS: weakref.WeakSet[Wakeup] = weakref.WeakSet()


class Wakeup:
    """A generation counter that waiting threads and tasks sleep on."""

    def __init__(self, pool: Pool, poll_interval: float) -> None:
        self._pool = pool
        self._poll_interval = poll_interval
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers: set[LoopSleeper] = set()
        self._waiters = 0
        self._watcher: threading.Thread | None = None
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

    def close(self) -> None:
        """Wake every waiter for good and stop the watcher. Idempotent.

        Waits (briefly) for the watcher to close its connection, so the last
        connection of the process closes and SQLite removes the -wal/-shm files.
        """
        self._closed = True
        self._stop.set()
        self.bump()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout=1.0)

    def after_fork(self) -> None:
        """In a child process: fresh locks, no watcher, no waiters of the parent."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleepers = set()
        self._waiters = 0
        self._watcher = None
        self._stop = threading.Event()
        if self._closed:
            self._stop.set()

    def wait(self, generation: int, timeout: float | None) -> None:
        """Block the calling thread until the generation is no longer ``generation``,
        or ``timeout`` seconds passed (None: no limit)."""
        with self._lock:
            if self.generation != generation or self._closed:
                return
            self._enter()
            try:
                self._cond.wait(timeout)
            finally:
                self._waiters -= 1

    async def wait_async(self, generation: int, timeout: float | None) -> None:
        """:meth:`wait` for a task: the event loop keeps running meanwhile, and
        cancelling the task just stops the wait."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.generation != generation or self._closed:
                return
            sleeper = LoopSleeper(loop)
            self._sleepers.add(sleeper)
            self._enter()
        timer = None if timeout is None else loop.call_later(timeout, resolve, sleeper.future)
        try:
            await sleeper.future
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._sleepers.discard(sleeper)
                self._waiters -= 1

    def _enter(self) -> None:
        """Count a waiter in (lock held) and make sure the watcher runs."""
        self._waiters += 1
        if self._watcher is None and not self._closed:
            self._watcher = threading.Thread(
                target=self._watch, name="delayq-sqlite-watcher", daemon=True
            )
            self._watcher.start()

    def _watch(self) -> None:
        stop = self._stop
        sleep, interval = time.sleep, self._poll_interval
        conn: sqlite3.Connection | None = None
        try:
            conn = self._pool.connect()
            version = _data_version(conn)
            # Commits between a waiter's last look and this first reading are not
            # seen as a change: have every waiter look once more.
            self.bump()
            idle_since: float | None = None
            while True:
                sleep(interval)  # cheaper in CPU than Event.wait; close() is seen after it
                if stop.is_set():
                    return
                with self._lock:
                    if self._waiters:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > SQLITE_WATCHER_LINGER:
                        self._watcher = None
                        return
                current = _data_version(conn)
                if current != version:
                    version = current
                    self.bump()
        except Exception:  # the next waiter starts a new watcher
            _log.warning("delayq: the SQLite change watcher failed", exc_info=True)
            with self._lock:
                self._watcher = None
            self.bump()
        finally:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            with self._lock:
                if self._watcher is threading.current_thread():
                    self._watcher = None


def _data_version(conn: sqlite3.Connection) -> int:
    rows = conn.execute("PRAGMA data_version").fetchall()
    return int(rows[0][0])


def _after_fork_in_child() -> None:
    for wakeup in list(_WAKEUPS):
        wakeup.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
