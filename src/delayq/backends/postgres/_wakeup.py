"""How a waiting ``reserve`` on ``postgresql://`` is woken, without polling.

Every statement that makes a message due (put, nack, release, reschedule,
retry_dead) ends with the schema's ``wake()``: a ``pg_notify`` on the schema's
channel, payload ``"<due_ms> <queue>"`` (the earliest due time it wrote), sent only
when a consumer registered in ``waiters`` sleeps past it. A waiter about to sleep
registers with its claim (its :attr:`Waiter.token` and how long it may sleep); the
queue's advisory lock makes the registration and the put's check see each other (see
:func:`delayq.backends.postgres.statements.wake_function`). A token names one row of
``waiters`` for as long as the backend object lives: a ``reserve`` takes a free token
of its queue from the object (a new one only when every token is taken by a
``reserve`` running at the same time) and gives it back when it returns, so a
consumer that sleeps again and again updates its row in place instead of inserting
and deleting one per sleep. Each backend object that
has a waiting consumer holds one connection that LISTENs on that channel, read by one
thread (both faces: a sleeping thread or a parked asyncio task is woken the same way).

A waiter is registered *before* its claim looks at the table (:meth:`Wakeup.enter`,
:meth:`Wakeup.look`), so a notification that arrives while the claim runs is kept as
``woken``; after the claim it sleeps until the next event the server reported, or a
notification for its queue due *before* that event, whichever comes first
(:meth:`Wakeup.arm`). When the listening connection is lost the thread reconnects with
a doubling pause, LISTENs again, and then wakes every waiter once: what happened while
nobody listened is found by their next claim. A waiter also looks again after
``safety`` seconds at most, in case a notification was lost all the same.

With ``notify=off`` (a PgBouncer in transaction mode, where LISTEN does not work)
nothing listens: waiters look again every ``poll_interval``; puts through the same
backend object still wake its waiters at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time

import psycopg

from ..._log import LOGGER_NAME
from ..._timer import call_later_precisely
from ..._waiters import LoopSleeper, resolve

__all__ = ["Waiter", "Wakeup"]

_log = logging.getLogger(LOGGER_NAME)

#: How long the listening thread waits for a notification before it checks whether
#: its backend closed (no query is sent), seconds.
_LISTEN_SLICE = 0.5
#: First and longest pause between two attempts to reconnect the listener, seconds.
_FIRST_PAUSE = 0.05
_MAX_PAUSE = 2.0


class Waiter:
    """One waiting ``reserve``: its queue, the server time it sleeps until, and how to
    wake it (a thread's event or a task's sleeper); ``token`` names its registration
    in the ``waiters`` table, ``registered`` says that this row may sleep past now
    (then a claim that finds messages marks it awake)."""

    __slots__ = ("event", "queue", "registered", "sleeper", "token", "until", "woken")

    def __init__(self, queue: str, token: str, registered: bool) -> None:
        self.queue = queue
        self.token = token
        self.registered = registered
        self.until: int | None = None
        self.woken = False
        self.event = threading.Event()
        self.sleeper: LoopSleeper | None = None

    def wake(self) -> None:
        """Mark it woken and wake it (lock held)."""
        self.woken = True
        self.event.set()
        if self.sleeper is not None:
            self.sleeper.wake()


class Wakeup:
    """The waiters of one backend object and, while some wait, its listener."""

    def __init__(self, conninfo: str, channel: str, *, listen: bool, interval: float) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._listen = listen
        #: The longest sleep of a waiter between two looks, seconds.
        self.interval = interval
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Waiter]] = {}
        # The tokens of each queue no reserve holds now, with whether their row may
        # still sleep (Waiter.registered).
        self._free: dict[str, list[tuple[str, bool]]] = {}
        # Every token drawn, by queue: the rows of ``waiters`` this object may own.
        self._drawn: list[tuple[str, str]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.listening = False
        """True while the LISTEN connection is up (tests read it)."""

    @property
    def listens(self) -> bool:
        """Whether waiters are woken by notifications (``notify`` on): only then do
        they register in ``waiters``, asking puts to notify."""
        return self._listen

    def enter(self, queue: str) -> Waiter:
        """Register a waiter of ``queue`` (before its first look), under a free token
        of the queue (a new one when none is free)."""
        with self._lock:
            free = self._free.get(queue)
            if free:
                token, registered = free.pop()
            else:
                token, registered = secrets.token_hex(8), False
                self._drawn.append((queue, token))
            waiter = Waiter(queue, token, registered)
            self._waiters.setdefault(queue, set()).add(waiter)
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """Unregister ``waiter``; its token is free for the next one."""
        with self._lock:
            self._free.setdefault(waiter.queue, []).append((waiter.token, waiter.registered))
            waiters = self._waiters.get(waiter.queue)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[waiter.queue]

    def look(self, waiter: Waiter) -> None:
        """Before a look at the table: any notification from now on wakes ``waiter``."""
        with self._lock:
            waiter.until = None
            waiter.woken = False
            waiter.event.clear()

    def arm(self, waiter: Waiter, until: int | None) -> bool:
        """After a look that found nothing: sleep until ``until`` (server epoch ms, None:
        no event known). False when a notification came meanwhile: look again now."""
        with self._lock:
            if waiter.woken or self._closed:
                return False
            waiter.until = until
            if self._listen and self._thread is None:
                # Started by the first waiter that sleeps; once it LISTENs it wakes every
                # waiter, so nothing notified before that is missed.
                self._thread = threading.Thread(
                    target=self._run, name="delayq-postgres-listener", daemon=True
                )
                self._thread.start()
            return True

    def notify(self, queue: str, due: int | None) -> None:
        """Something of ``queue`` is due at ``due`` (None: look anyway): wake its waiters
        that sleep until later."""
        with self._lock:
            for waiter in self._waiters.get(queue, ()):
                if due is None or waiter.until is None or due < waiter.until:
                    waiter.wake()

    def notify_all(self) -> None:
        """Wake every waiter (a reconnect, a close)."""
        with self._lock:
            for waiters in self._waiters.values():
                for waiter in waiters:
                    waiter.wake()

    def close(self) -> list[tuple[str, str]]:
        """Wake every waiter for good; the listener stops within a moment. Returns
        the (queue, token) of every token drawn: the rows of ``waiters`` to delete."""
        self._closed = True
        self.notify_all()
        with self._lock:
            return list(self._drawn)

    def wait(self, waiter: Waiter, timeout: float | None) -> None:
        """Block the calling thread until ``waiter`` is woken or ``timeout`` passed."""
        waiter.event.wait(timeout)

    async def wait_async(self, waiter: Waiter, timeout: float | None) -> None:
        """:meth:`wait` for a task: the event loop runs meanwhile; cancelling the task
        just stops the wait."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if waiter.woken:
                return
            sleeper = waiter.sleeper = LoopSleeper(loop)
        timer = (
            None
            if timeout is None
            else call_later_precisely(loop, timeout, resolve, sleeper.future)
        )
        try:
            await sleeper.future
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                waiter.sleeper = None

    # -- the listener thread ----------------------------------------------------------

    def _run(self) -> None:
        pause = _FIRST_PAUSE
        failed = False
        while not self._closed:
            try:
                with psycopg.Connection.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(f'LISTEN "{self._channel}"')
                    self.listening = True
                    if failed:
                        _log.info("delayq: the postgres listener is back")
                    pause, failed = _FIRST_PAUSE, False
                    # Whatever was notified while nobody listened: every waiter looks.
                    self.notify_all()
                    while not self._closed:
                        for note in conn.notifies(timeout=_LISTEN_SLICE):
                            self._heard(note.payload)
            except (psycopg.Error, OSError) as exc:
                self.listening = False
                if self._closed:
                    break
                if not failed:
                    _log.warning("delayq: the postgres listener lost its connection: %s", exc)
                failed = True
                time.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE)
            finally:
                self.listening = False
        with self._lock:
            self._thread = None

    def _heard(self, payload: str) -> None:
        due, _, queue = payload.partition(" ")
        with contextlib.suppress(ValueError):
            self.notify(queue, int(due))
            return
        self.notify(queue, None)
