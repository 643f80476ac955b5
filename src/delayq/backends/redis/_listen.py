"""Waking waiting consumers without polling: one listener per queue and backend object.

A waiting ``reserve`` sleeps in the process, on a condition (threads) or a future
(asyncio), until the next due time or lease expiry the reserve script reported, measured
from the server's clock, so it wakes on time (asyncio: :mod:`delayq._timer`, not
``epoll``'s whole milliseconds). Changes made elsewhere
reach it through the queue's wake-up marker: every script that makes something due
earlier pushes one element to the ``wake`` list (put, nack, reschedule, retry_dead,
release, a claim that leaves work or new leases behind, a lease expiry). The listener
blocks on that list with ``BLPOP`` on a connection of its own, and on each marker bumps a
generation that wakes every local waiter of the queue; they run the reserve script
again, and that run re-arms their wait.

Redis's own BLPOP timeout is only as fine as its event loop (100 ms at ``hz 10``), which
is why the precise sleep happens here and BLPOP only carries news. When BLPOP times out
(every :data:`REDIS_LISTEN_TIMEOUT` s) the waiters look again too, which bounds any missed
wake-up. A marker is taken by one listener only: one that finds no local waiter puts it
back and parks, its connection kept, until a reserve here waits again (it would take the
marker straight back if it blocked at once). A lost connection (or bytes that are no
Redis reply: :data:`~._transport.LISTEN_ERRORS`) wakes the waiters (they meet the
error, back off and retry) and is retried with backoff; the first BLPOP after a
reconnect re-arms everything. The listener runs while a waiting reserve is in progress,
and lingers one BLPOP (or one park) after: a consumer that reserves again and again keeps
one connection and one thread, not one per wait.
A sharded queue runs one listener per shard and learns through ``on_news`` which shard
had news (a marker, or a lost connection; a BLPOP timeout is no news).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..._log import LOGGER_NAME
from ..._timeout import within
from ..._timer import call_later_precisely
from ...errors import QueueClosed
from ._settings import REDIS_LISTEN_TIMEOUT, REDIS_RECONNECT_FIRST, REDIS_RECONNECT_MAX
from ._transport import CONNECTION_ERRORS, LISTEN_ERRORS

__all__ = ["AsyncListener", "Listener", "log_lost", "next_backoff"]

logger = logging.getLogger(LOGGER_NAME)


def next_backoff(backoff: float) -> float:
    """The backoff after ``backoff`` seconds of it."""
    return min(backoff * 2.0, REDIS_RECONNECT_MAX)


def log_lost(what: str, exc: BaseException, backoff: float) -> None:
    """Log that ``what`` lost Redis and tries again in ``backoff`` seconds: a warning
    for the first failure of a run (``backoff`` at its first step), debug for the
    others, so that an outage is one line here, not one a second (a consumer above,
    such as the Worker, logs its progress with its own backoff)."""
    level = logging.WARNING if backoff == REDIS_RECONNECT_FIRST else logging.DEBUG
    logger.log(level, "%s (%s); retrying in %.2f s", what, exc, backoff)


class Listener:
    """The thread face: waiters sleep on a condition; a daemon thread BLPOPs."""

    def __init__(
        self,
        make_client: Callable[[], Any],
        key: bytes,
        rewake: Callable[[], None],
        on_news: Callable[[], None] | None = None,
    ) -> None:
        self._make_client = make_client
        self._key = key
        self._rewake = rewake
        self._on_news = on_news
        self._cond = threading.Condition()
        self._generation = 0
        self._active = 0
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._closed = False
        self._parked = False
        # Held while the marker is put back, so nothing is written once close() returned.
        self._rewake_lock = threading.Lock()

    @property
    def generation(self) -> int:
        """Changes whenever waiters should look at the queue again."""
        return self._generation

    @property
    def running(self) -> bool:
        """True while the listener blocks on the marker (or is about to); not while it
        is parked, when it hears nothing (news may wait for a consumer to look)."""
        return self._thread is not None and not self._parked

    def bump(self) -> None:
        """Wake every waiter of this listener."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Around a waiting ``reserve``: the listener runs while one is in progress."""
        with self._cond:
            self._active += 1
            if self._parked:
                self._cond.notify_all()
            elif self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="delayq-redis-listener", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1

    def wait(self, generation: int, timeout: float | None) -> None:
        """Sleep up to ``timeout`` s (None: no limit) unless the generation moved on
        from ``generation`` or the listener is closed (call inside :meth:`session`)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._generation != generation, timeout)

    def close(self) -> None:
        """Wake every waiter for good and break the listener's BLPOP."""
        with self._cond:
            self._closed = True
            self._generation += 1
            self._cond.notify_all()
            client = self._client
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        with self._rewake_lock:
            pass

    def _news(self) -> None:
        if self._on_news is not None:
            self._on_news()

    def _stop_if(self, idle: bool = False, inactive: bool = False) -> bool:
        """Retire this thread when closed, ``idle``, or ``inactive`` and no session is
        in progress (a session that starts after this starts a new thread)."""
        with self._cond:
            if self._closed or idle or (inactive and not self._active):
                if self._thread is threading.current_thread():
                    self._thread = None
                return True
            return False

    def _park(self) -> bool:
        """Wait, connection kept, until a waiting reserve starts here (at most one BLPOP
        timeout); True when the thread retired instead."""
        with self._cond:
            self._parked = True
            self._cond.wait_for(lambda: self._closed or self._active, REDIS_LISTEN_TIMEOUT)
            self._parked = False
        return self._stop_if(inactive=True)

    def _connect(self) -> Any:
        """A new client, or None when closed meanwhile (close() closes the client it
        finds, so one made after that is closed here)."""
        client = self._make_client()
        with self._cond:
            if not self._closed:
                self._client = client
                return client
        with contextlib.suppress(Exception):
            client.close()
        return None

    def _run(self) -> None:
        backoff = REDIS_RECONNECT_FIRST
        client: Any = None
        idle = 0
        try:
            while True:
                idle = 0 if self._active else idle + 1
                if self._stop_if(idle=idle > 1):
                    return
                try:
                    if client is None:  # made here, so a failure is retried as a lost one
                        client = self._connect()
                        if client is None:
                            self._stop_if()
                            return
                    got: Any = client.blpop([self._key], timeout=REDIS_LISTEN_TIMEOUT)
                except Exception as exc:
                    # close() closes the client under a BLPOP, which may then fail in any
                    # way (redis-py polls a socket that is gone): that is the end.
                    if self._stop_if():
                        return
                    if not isinstance(exc, LISTEN_ERRORS):
                        raise
                    log_lost("redis listener lost its connection", exc, backoff)
                    self._news()
                    self.bump()
                    with self._cond:
                        self._cond.wait(backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if got is not None and not self._active:
                    # Nobody here will look: hand the marker to another consumer.
                    with self._rewake_lock, contextlib.suppress(QueueClosed, *CONNECTION_ERRORS):
                        if not self._closed:
                            self._rewake()
                    if self._park():
                        return
                    continue
                if got is not None:
                    self._news()
                self.bump()
        finally:
            with self._cond:
                if self._client is client:
                    self._client = None
                if self._thread is threading.current_thread():  # ended by an error
                    self._thread = None
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()


class AsyncListener:
    """The asyncio face: waiters sleep on futures; a task of the loop BLPOPs."""

    def __init__(
        self,
        make_client: Callable[[], Any],
        key: bytes,
        rewake: Callable[[], Awaitable[None]],
        on_news: Callable[[], None] | None = None,
    ) -> None:
        self._make_client = make_client
        self._key = key
        self._rewake = rewake
        self._on_news = on_news
        self._generation = 0
        self._futures: set[asyncio.Future[None]] = set()
        self._active = 0
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._parked: asyncio.Future[None] | None = None

    @property
    def generation(self) -> int:
        """Changes whenever waiters should look at the queue again."""
        return self._generation

    @property
    def running(self) -> bool:
        """True while the listener blocks on the marker (or is about to); not while it
        is parked, when it hears nothing (news may wait for a consumer to look)."""
        return self._task is not None and self._parked is None

    def bump(self) -> None:
        """Wake every waiter of this listener."""
        self._generation += 1
        for future in self._futures:
            if not future.done():
                future.set_result(None)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Around a waiting ``reserve``: the listener runs while one is in progress."""
        self._active += 1
        if self._parked is not None:
            _resolve(self._parked)
        elif self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            yield
        finally:
            self._active -= 1

    async def wait(self, generation: int, timeout: float | None) -> None:
        """Sleep up to ``timeout`` s (None: no limit) unless the generation moved on
        from ``generation`` or the listener is closed (call inside :meth:`session`)."""
        if self._closed or self._generation != generation:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._futures.add(future)
        timer = None if timeout is None else call_later_precisely(loop, timeout, _resolve, future)
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
            self._futures.discard(future)

    async def close(self) -> None:
        """Wake every waiter for good and stop the listener task."""
        self._closed = True
        self.bump()
        if self._parked is not None:
            _resolve(self._parked)
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _news(self) -> None:
        if self._on_news is not None:
            self._on_news()

    def _stop_if(self, condition: bool) -> bool:
        if self._closed or condition:
            if self._task is asyncio.current_task():
                self._task = None
            return True
        return False

    async def _park(self) -> bool:
        """Wait, connection kept, until a waiting reserve starts here (at most one BLPOP
        timeout); True when the task retired instead."""
        if not self._active and not self._closed:
            parked = self._parked = asyncio.get_running_loop().create_future()
            with contextlib.suppress(asyncio.TimeoutError):
                await within(parked, REDIS_LISTEN_TIMEOUT)
            self._parked = None
        return self._stop_if(not self._active)

    async def _run(self) -> None:
        backoff = REDIS_RECONNECT_FIRST
        client = self._make_client()
        idle = 0
        try:
            while True:
                idle = 0 if self._active else idle + 1
                if self._stop_if(idle > 1):
                    return
                try:
                    got: Any = await client.blpop([self._key], timeout=REDIS_LISTEN_TIMEOUT)
                except LISTEN_ERRORS as exc:
                    if self._stop_if(False):
                        return
                    log_lost("redis listener lost its connection", exc, backoff)
                    self._news()
                    self.bump()
                    await asyncio.sleep(backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if got is not None and not self._active:
                    # Nobody here will look: hand the marker to another consumer.
                    if not self._closed:
                        with contextlib.suppress(QueueClosed, *CONNECTION_ERRORS):
                            await self._rewake()
                    if await self._park():
                        return
                    continue
                if got is not None:
                    self._news()
                self.bump()
        finally:
            if self._task is asyncio.current_task():
                self._task = None
            with contextlib.suppress(Exception):
                await asyncio.shield(client.aclose())


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
