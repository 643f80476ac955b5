"""The holder of a claim that fired ahead, written once as its asyncio face: the source
of the generated :mod:`delayq.durable._sync.hold`.

A waiting ``reserve`` on a backend that fires ahead
(:class:`~delayq.durable.backend.AsyncFiresAhead`) may get its messages shortly before
their due time; :func:`reserve_held` waits out the rest on the precise timer
(:mod:`delayq._timer`), counted from when the answer arrived, so that no message reaches
the caller before its due time by the store's clock. A caller that gives up while it
holds them (cancelled, interrupted) gives them back first: they keep their due time and
place, no attempt charged. :func:`claim_held` leaves the holding to a caller that
does it itself (the Worker's lane of sync handlers: a thread that waits for the due
time on its own timer saves the hand-over from the loop to a thread at that instant).
"""

from __future__ import annotations

import contextlib
import time

from ..._timer import sleep_async
from ...errors import LeaseLost, QueueClosed
from ..message import Claimed, Record, hold_seconds
from .backend import AsyncFiresAhead

__all__ = ["AsyncReserves", "claim_held", "reserve_held"]


class AsyncReserves:
    """``reserve`` and ``reserve_ahead`` of a backend that fires ahead, both over its
    one waiting claim loop, ``_reserve`` (``ahead_ms`` 0: the contract's reserve)."""

    #: See :class:`~delayq.durable.backend.AsyncFiresAhead`.
    fire_ahead_ms: int

    async def _reserve(
        self, queue: str, limit: int, lease_ms: int, wait: float | None, ahead_ms: int
    ) -> Claimed:
        raise NotImplementedError

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reserve`."""
        return (await self._reserve(queue, limit, lease_ms, wait, 0)).records

    async def reserve_ahead(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> Claimed:
        """See :meth:`~delayq.durable.backend.AsyncFiresAhead.reserve_ahead`."""
        return await self._reserve(queue, limit, lease_ms, wait, self.fire_ahead_ms)


async def reserve_held(
    backend: AsyncFiresAhead, queue: str, *, limit: int, lease_ms: int, wait: float | None
) -> list[Record]:
    """``backend.reserve_ahead(...)``'s records, handed over at their due time."""
    records, not_before = await claim_held(
        backend, queue, limit=limit, lease_ms=lease_ms, wait=wait
    )
    left = not_before - time.monotonic()
    if left > 0.0:
        try:
            await sleep_async(left)
        except BaseException:
            await _give_back(backend, queue, records)
            raise
    return records


async def claim_held(
    backend: AsyncFiresAhead, queue: str, *, limit: int, lease_ms: int, wait: float | None
) -> tuple[list[Record], float]:
    """``backend.reserve_ahead(...)``'s records, at once, and the ``time.monotonic()``
    instant before which none may be handed over (0.0: none was claimed ahead): the
    store's now plus the hold, counted from when the answer arrived."""
    claimed = await backend.reserve_ahead(queue, limit=limit, lease_ms=lease_ms, wait=wait)
    seconds = hold_seconds(claimed)
    if seconds <= 0.0:
        return claimed.records, 0.0
    arrived = time.monotonic() if claimed.arrived is None else claimed.arrived
    return claimed.records, arrived + seconds


async def _give_back(backend: AsyncFiresAhead, queue: str, records: list[Record]) -> None:
    """Release what a caller that gave up held (a lease already lost stays lost)."""
    for record in records:
        with contextlib.suppress(LeaseLost, QueueClosed, OSError):
            await backend.release(queue, record.id, record.lease or "")
