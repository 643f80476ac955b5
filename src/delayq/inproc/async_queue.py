"""AsyncDelayQueue: the asyncio face of the in-process delay queue.

Everything that does not wait is :class:`~delayq.inproc.queue.QueueCore`, shared
with the thread face and safe to call from any thread. A waiting getter parks a
future (and, on a real clock, a loop timer for the head's deadline); a producer on
another thread wakes it through ``loop.call_soon_threadsafe``, a producer on the
loop's own thread sets the future directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from math import inf
from typing import Any, TypeVar

from .._clock import Clock
from .._waiters import LoopSleeper, resolve
from ..errors import QueueClosed
from ._constants import DEFAULT_GET_MANY
from .queue import QueueCore, check_max
from .store import VALUE, Handle, TimerStore

__all__ = ["AsyncDelayQueue"]

T = TypeVar("T")


class AsyncDelayQueue(QueueCore[T]):
    """An asyncio delay queue: ``await get()`` returns items once due, earliest first.

    ``put``, ``cancel``, ``reschedule``, ``clear`` and ``close`` may be called from
    any thread. Like :class:`asyncio.Queue`, ``get`` has no timeout: use
    :func:`asyncio.wait_for` or ``asyncio.timeout``. Cancelling a waiting ``get``
    leaves nothing behind.
    """

    def __init__(self, store: TimerStore[T] | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(store, clock=clock)
        self._sleepers: deque[LoopSleeper] = deque()

    def _notify_one(self) -> None:
        sleepers = self._sleepers
        while sleepers:
            if sleepers.popleft().wake():
                return

    def _notify_all(self) -> None:
        sleepers, self._sleepers = self._sleepers, deque()
        for sleeper in sleepers:
            sleeper.wake()

    async def get(self) -> T:
        """Wait until an item is due and return it (:class:`QueueClosed` once the
        queue is closed and empty)."""
        lock = self._lock
        lock.acquire()
        try:
            handle = self._pop_due(self._monotonic())
        finally:
            lock.release()
        if handle is None:
            handle = (await self._wait(1))[0]
        return handle[VALUE]  # type: ignore[no-any-return]

    async def get_many(self, max: int = DEFAULT_GET_MANY) -> list[T]:
        """Wait until at least one item is due; return every due item, up to ``max``."""
        limit = check_max(max)
        with self._lock:
            handles = self._store.pop_due_many(self._monotonic(), limit)
        if not handles:
            handles = await self._wait(limit)
        return [handle[VALUE] for handle in handles]

    async def _wait(self, limit: int) -> list[Handle[T]]:
        loop = asyncio.get_running_loop()
        clock = self._clock
        sleeper: LoopSleeper | None = None
        timer: asyncio.TimerHandle | None = None
        with self._lock:
            self._waiters += 1
        try:
            while True:
                with self._lock:
                    if sleeper is not None:
                        self._forget(sleeper)
                    now = self._monotonic()
                    handles = self._store.pop_due_many(now, limit)
                    if handles:
                        return handles
                    self._raise_if_drained()
                    head = self._store.next_deadline()
                    self._wake_at = inf if head is None else head
                    sleeper = LoopSleeper(loop)
                    self._sleepers.append(sleeper)
                if head is not None:
                    seconds = clock.wait_timeout(head - now)
                    if seconds is not None:
                        timer = loop.call_later(seconds, resolve, sleeper.future)
                try:
                    await sleeper.future
                finally:
                    if timer is not None:
                        timer.cancel()
                        timer = None
        finally:
            with self._lock:
                if sleeper is not None:
                    self._forget(sleeper)
                self._leave_wait()

    def _forget(self, sleeper: LoopSleeper) -> None:
        with contextlib.suppress(ValueError):  # already taken by a notifier
            self._sleepers.remove(sleeper)

    def __aiter__(self) -> AsyncDelayQueue[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.get()
        except QueueClosed:
            raise StopAsyncIteration from None

    def _debug_state(self) -> dict[str, Any]:
        """Internal counters, for tests that check nothing is left behind."""
        with self._lock:
            return {"waiters": self._waiters, "sleepers": len(self._sleepers)}
