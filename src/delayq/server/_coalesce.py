"""Group the single puts of concurrent requests into one backend call.

Under load, many ``POST /v1/queues/{queue}/messages`` requests reach the put in the
same event-loop iteration. :class:`PutCoalescer` collects the puts of one queue that
arrive before the loop next runs its ready callbacks and stores them with one
``put_many`` (one Redis round trip, one SQLite transaction) instead of one call each.

Each request still gets its own answer. ``put_many`` is all or nothing and its
requests see the effect of earlier ones of the batch, exactly as if they had been put
one after the other; when it raises an error that may belong to one request (a bad
argument, :class:`~delayq.DuplicateId`, :class:`~delayq.PayloadTooLarge`), nothing
was stored, so the batch is put again one by one, in order, and each request gets its
own outcome (its id, and whether it stored its message or kept an existing one: a
request whose id an earlier request of the batch stored keeps that message, as it would
one by one) or its own error. Any other error (the backend is down, the queue closed)
is every request's answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..durable import AsyncQueue, PutResult
from ..errors import DuplicateId, PayloadTooLarge

__all__ = ["PutCoalescer"]

# Errors that may come from one request of a batch (and leave nothing stored).
_PER_REQUEST_ERRORS = (DuplicateId, PayloadTooLarge, TypeError, ValueError)

_Pending = tuple[dict[str, Any], "asyncio.Future[PutResult]"]


class PutCoalescer:
    """Puts to one queue, sent in batches of up to ``max_batch``.

    :meth:`put` takes the keyword arguments of :meth:`AsyncQueue.put` and returns what
    :meth:`AsyncQueue.put_outcome` would return, or raises what that put would raise.
    Must be used from one event loop.
    """

    def __init__(self, queue: AsyncQueue, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        self.queue = queue
        self.max_batch = max_batch
        self._pending: list[_Pending] = []
        self._running: set[asyncio.Task[None]] = set()

    async def put(self, arguments: dict[str, Any]) -> PutResult:
        """Put one message (``AsyncQueue.put_outcome(**arguments)``), batched with the
        puts that arrive in the same loop iteration."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[PutResult] = loop.create_future()
        self._pending.append((arguments, done))
        if len(self._pending) == 1:
            loop.call_soon(self._send)
        elif len(self._pending) >= self.max_batch:
            self._send()
        return await done

    def _send(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return  # already sent when it reached max_batch
        task = asyncio.get_running_loop().create_task(self._store(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _store(self, batch: list[_Pending]) -> None:
        try:
            if len(batch) == 1:
                await self._store_one(*batch[0])
                return
            try:
                results = await self.queue.put_many_outcomes([arguments for arguments, _ in batch])
            except _PER_REQUEST_ERRORS:
                for arguments, done in batch:
                    await self._store_one(arguments, done)
                return
            for (_, done), result in zip(batch, results, strict=True):
                if not done.done():
                    done.set_result(result)
        except Exception as exc:
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc)
        except BaseException:  # cancelled (shutdown): so are the waiting requests
            for _, done in batch:
                done.cancel()
            raise

    async def _store_one(self, arguments: dict[str, Any], done: asyncio.Future[PutResult]) -> None:
        try:
            result = await self.queue.put_outcome(**arguments)
        except Exception as exc:
            if not done.done():
                done.set_exception(exc)
            return
        if not done.done():
            done.set_result(result)

    @property
    def idle(self) -> bool:
        """True when no put is waiting or being stored."""
        return not self._pending and not self._running

    async def wait_idle(self) -> None:
        """Return once every batch sent so far is stored (or failed)."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
