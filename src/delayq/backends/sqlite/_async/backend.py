"""The ``sqlite:///`` backend, written once as its asyncio face: the source of the
generated sync face (:mod:`delayq.backends.sqlite._sync.backend`).

Every operation is one transaction of :class:`~delayq.backends.sqlite._core.Core`, run
through the face's runner (:mod:`delayq.backends.sqlite._runner`: on a thread pool, or
on the calling thread); a waiting ``reserve`` sleeps on the backend's
:class:`~delayq.backends.sqlite._wakeup.Wakeup`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ....durable.message import Claimed, Position, PutRequest, Record, State, Stats
from ....durable.reserves import AsyncReserves
from .._constants import SQLITE_FIRE_AHEAD_MS
from .._core import Core
from .._runner import AsyncRunner

__all__ = ["AsyncSQLiteBackend", "open_async_backend"]


def _seconds_until(next_ms: int | None, give_up: float | None) -> float | None:
    """How long to sleep: until ``next_ms`` (epoch ms) or ``give_up`` (monotonic)."""
    timeout: float | None = None
    if next_ms is not None:
        timeout = max(0.0, next_ms / 1000.0 - time.time())
    if give_up is not None:
        left = max(0.0, give_up - time.monotonic())
        timeout = left if timeout is None else min(timeout, left)
    return timeout


class AsyncSQLiteBackend(AsyncReserves):
    """A face of ``sqlite:///`` (see :class:`~delayq.durable.backend.AsyncBackend`).

    Each call borrows a connection of the object's pool for one transaction. The sync
    face runs it on the calling thread (it is safe to share between threads; opening
    creates the file and schema if needed); the asyncio face on a small thread pool of
    its own, so the event loop never waits for SQLite, and creating it does no I/O (the
    file is opened on first use). A cancelled ``reserve`` claims nothing; a cancelled
    call of another operation may still take effect.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self._core = Core(url, **options)
        self._runner = AsyncRunner(self._core)
        #: See delayq.durable.backend.AsyncFiresAhead.
        self.fire_ahead_ms = SQLITE_FIRE_AHEAD_MS

    @property
    def path(self) -> str:
        """The absolute path of the database file."""
        return self._core.pool.path

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.put` (``outcome`` is a hint this
        backend does not need: it always decides before it returns)."""
        return await self._runner.call(self._core.put, queue, requests)

    async def _reserve(
        self, queue: str, limit: int, lease_ms: int, wait: float | None, ahead_ms: int
    ) -> Claimed:
        wake = self._core.wake
        give_up = None if wait is None else time.monotonic() + wait
        peek = False
        while True:
            generation = wake.generation
            records, next_ms, now_us, arrived = await self._runner.claim(
                queue, limit, lease_ms, peek, ahead_ms
            )
            if records or (give_up is not None and time.monotonic() >= give_up):
                return Claimed(records, now_us, arrived)
            timeout = _seconds_until(next_ms, give_up)
            if timeout is None or timeout > 0.0:
                await wake.wait_async(generation, timeout, queue)
            peek = True

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack`."""
        await self._runner.call(self._core.ack, queue, id, token)

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack_many`."""
        return await self._runner.call(self._core.ack_many, queue, items)

    async def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`~delayq.durable.backend.AsyncBackend.nack`."""
        return await self._runner.call(
            self._core.nack, queue, id, token, delay_ms, error, dead=dead
        )

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.release`."""
        await self._runner.call(self._core.release, queue, id, token)

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.extend`."""
        return await self._runner.call(self._core.extend, queue, id, token, lease_ms)

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.cancel`."""
        return await self._runner.call(self._core.cancel, queue, id)

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reschedule`."""
        return await self._runner.call(self._core.reschedule, queue, id, delay_ms, at_ms)

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.get`."""
        return await self._runner.call(self._core.get, queue, id)

    async def stats(self, queue: str) -> Stats:
        """See :meth:`~delayq.durable.backend.AsyncBackend.stats`."""
        return await self._runner.call(self._core.stats, queue)

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.dead`."""
        return await self._runner.call(self._core.dead, queue, limit, after_seq)

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.retry_dead`."""
        return await self._runner.call(self._core.retry_dead, queue, ids)

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.purge`."""
        return await self._runner.call(self._core.purge, queue, state)

    async def queues(self) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.queues`."""
        return await self._runner.call(self._core.queues)

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.peek`."""
        return await self._runner.call(self._core.peek, queue, state, limit, after)

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.due_counts`."""
        return await self._runner.call(self._core.due_counts, queue, horizon_ms, buckets)

    async def close(self) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.close`; the file and its
        messages stay."""
        core = self._core
        if core.closed:
            return
        core.closed = True
        core.wake.close()
        await self._runner.close()


def open_async_backend(url: str, **options: Any) -> AsyncSQLiteBackend:
    """Open this face of ``sqlite:///path`` (options: see :mod:`delayq.backends.sqlite`)."""
    return AsyncSQLiteBackend(url, **options)
