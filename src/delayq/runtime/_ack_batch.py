"""Coalesced acknowledgements for the worker: the acks of jobs that finish close together
go to the queue as one ``ack_many`` call instead of one round trip each.

A finished job hands its message to :meth:`AckBatcher.ack` and waits for the outcome.
The first ack while no call is in flight starts a flush task, which runs on the next
turn of the event loop, so every job finishing in the same turn joins the batch; acks
that arrive while a call is in flight wait for it to return and then go out together at
once. No timer holds an ack back, and nothing is acked before its job has finished.
"""

from __future__ import annotations

import asyncio

from ..durable._constants import MAX_ACK_MANY
from ..durable.message import Message
from ..durable.queue import AsyncQueue

__all__ = ["AckBatcher"]


class AckBatcher:
    """Batches the acks of one queue (one per queue of a worker, on its event loop)."""

    def __init__(self, queue: AsyncQueue) -> None:
        self._queue = queue
        self._pending: list[tuple[Message, asyncio.Future[bool]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def ack(self, msg: Message) -> bool:
        """Ack ``msg`` with the next batch: True once acked, False when its lease was lost
        (nothing changed); any other error of the batch's call is raised. A cancelled
        caller stops waiting; the ack still goes out with its batch."""
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[bool] = loop.create_future()
        self._pending.append((msg, outcome))
        if self._flushing is None:
            self._flushing = loop.create_task(self._flush(), name="delayq-ack-batch")
        return await outcome  # cancelled, it is skipped: the ack still goes out

    async def drain(self) -> None:
        """Wait until every ack handed in so far has been sent."""
        while self._flushing is not None:
            await asyncio.wait({self._flushing})

    def _next_batch(self) -> list[tuple[Message, asyncio.Future[bool]]]:
        """Up to :data:`MAX_ACK_MANY` pending acks with distinct ids (a message reserved
        again after its lease expired may be pending twice: its lost-or-acked outcome
        could not be told apart in one call, so the second copy waits for the next)."""
        batch: list[tuple[Message, asyncio.Future[bool]]] = []
        later: list[tuple[Message, asyncio.Future[bool]]] = []
        ids: set[str] = set()
        for entry in self._pending:
            if len(batch) < MAX_ACK_MANY and entry[0].id not in ids:
                ids.add(entry[0].id)
                batch.append(entry)
            else:
                later.append(entry)
        self._pending = later
        return batch

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = self._next_batch()
                try:
                    lost = set(await self._queue.ack_many([msg for msg, _ in batch]))
                except asyncio.CancelledError:
                    for _, outcome in batch:
                        outcome.cancel()
                    raise
                except Exception as exc:
                    for _, outcome in batch:
                        if not outcome.done():
                            outcome.set_exception(exc)
                    continue
                for msg, outcome in batch:
                    if not outcome.done():
                        outcome.set_result(msg.id not in lost)
        finally:
            self._flushing = None
            for _, outcome in self._pending:  # only left when cancelled
                if not outcome.done():
                    outcome.cancel()
            self._pending = []
