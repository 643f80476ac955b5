"""Coalesced acknowledgements for the worker: the acks of jobs that finish close together
go to the queue as one ``ack_many`` call instead of one round trip each.

A finished job hands its message to :meth:`AckBatcher.ack` and waits for the outcome
(or to :meth:`AckBatcher.ack_soon` with a function that the outcome is given to).
The first ack while no call is in flight starts a flush task, which runs on the next
turn of the event loop, so every job finishing in the same turn joins the batch; acks
that arrive while a call is in flight wait for it to return and then go out together at
once. No timer holds an ack back, and nothing is acked before its job has finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..durable.constants import MAX_ACK_MANY
from ..durable.message import Message
from ..durable.queue import AsyncQueue

__all__ = ["AckBatcher", "AckOutcome"]

#: What an ack came to: True (acked), False (its lease was lost), the error of its
#: batch's call, or None when the batch was cancelled (a worker stopping).
AckOutcome = bool | Exception | None
#: What :meth:`AckBatcher.ack_soon` calls with an ack's outcome: ``done(token, outcome)``.
Acked = Callable[[Any, AckOutcome], None]
_Entry = tuple[Message, Acked, Any]


class AckBatcher:
    """Batches the acks of one queue (one per queue of a worker, on its event loop)."""

    def __init__(self, queue: AsyncQueue) -> None:
        self._queue = queue
        self._pending: list[_Entry] = []
        self._flushing: asyncio.Task[None] | None = None

    async def ack(self, msg: Message) -> bool:
        """Ack ``msg`` with the next batch: True once acked, False when its lease was lost
        (nothing changed); any other error of the batch's call is raised. A cancelled
        caller stops waiting; the ack still goes out with its batch."""
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.ack_soon(msg, _settle, outcome)
        return await outcome  # cancelled, it is skipped: the ack still goes out

    def ack_soon(self, msg: Message, done: Acked, token: Any) -> None:
        """Ack ``msg`` with the next batch, then call ``done(token, outcome)`` on the
        loop: True, False (lease lost), the batch call's error, or None (cancelled).
        One ``done`` serves every ack: no closure per message."""
        self._pending.append((msg, done, token))
        if self._flushing is None:
            loop = asyncio.get_running_loop()
            self._flushing = loop.create_task(self._flush(), name="delayq-ack-batch")

    async def drain(self) -> None:
        """Wait until every ack handed in so far has been sent."""
        while self._flushing is not None:
            await asyncio.wait({self._flushing})

    def _next_batch(self) -> list[_Entry]:
        """Up to :data:`MAX_ACK_MANY` pending acks with distinct ids (a message reserved
        again after its lease expired may be pending twice: its lost-or-acked outcome
        could not be told apart in one call, so the second copy waits for the next)."""
        pending = self._pending
        if len(pending) <= MAX_ACK_MANY and len({entry[0].id for entry in pending}) == len(
            pending
        ):  # the common case: all of them at once
            self._pending = []
            return pending
        batch: list[_Entry] = []
        later: list[_Entry] = []
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
                    lost = set(await self._queue.ack_many([msg for msg, _, _ in batch]))
                except asyncio.CancelledError:
                    for _, done, token in batch:
                        done(token, None)
                    raise
                except Exception as exc:
                    for _, done, token in batch:
                        done(token, exc)
                    continue
                for msg, done, token in batch:
                    done(token, msg.id not in lost)
        finally:
            self._flushing = None
            for _, done, token in self._pending:  # only left when cancelled
                done(token, None)
            self._pending = []


def _settle(future: asyncio.Future[bool], outcome: AckOutcome) -> None:
    if future.done():
        return
    if outcome is None:
        future.cancel()
    elif isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
