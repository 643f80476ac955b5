"""The holder of a claim that fired ahead, written once as its asyncio face: the source
of the generated :mod:`delayq.durable._sync.hold`.

A waiting ``reserve`` on a backend that fires ahead
(:class:`~delayq.durable.backend.AsyncFiresAhead`) may get its messages shortly before
their due time; :func:`reserve_held` waits out the rest on the precise timer
(:mod:`delayq._timer`), counted from when the answer arrived, so that no message reaches
the caller before its due time by the store's clock. A caller that gives up while it
holds them (cancelled, interrupted) gives them back first: they keep their due time and
place, no attempt charged.
"""

from __future__ import annotations

import contextlib
import time

from ..._timer import sleep_async
from ...errors import LeaseLost, QueueClosed
from ..message import Claimed, Record, hold_seconds
from .backend import AsyncFiresAhead

__all__ = ["AsyncReserves", "reserve_held"]


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
    claimed = await backend.reserve_ahead(queue, limit=limit, lease_ms=lease_ms, wait=wait)
    arrived = time.monotonic() if claimed.arrived is None else claimed.arrived
    seconds = hold_seconds(claimed)
    if seconds > 0.0:
        try:
            await sleep_async(max(seconds - (time.monotonic() - arrived), 0.0))
        except BaseException:
            await _give_back(backend, queue, claimed.records)
            raise
    return claimed.records


async def _give_back(backend: AsyncFiresAhead, queue: str, records: list[Record]) -> None:
    """Release what a caller that gave up held (a lease already lost stays lost)."""
    for record in records:
        with contextlib.suppress(LeaseLost, QueueClosed, OSError):
            await backend.release(queue, record.id, record.lease or "")
