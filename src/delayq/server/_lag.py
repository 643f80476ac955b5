"""The lag of a queue's work: its ``lag`` without the cron ticks that wait for a worker.

A worker that runs ``@app.cron`` / ``@app.every`` tasks puts each next tick about one
period ahead. Stopped, it leaves one tick per task behind, which falls due and waits
in the queue, ready: the queue's ``lag`` (the oldest ready message's wait) then grows
for as long as no worker runs, though one run is all that waits (a worker started
later runs one catch-up run, whatever the ticks it missed). The server shows both:
``lag``, the contract's figure, and ``work_lag``, the wait of the oldest ready message
that is not a tick, on which the dashboard's warning is drawn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..durable import AsyncQueue, Message, State, Stats
from ..durable.constants import TICK_HEADER

__all__ = ["stats_json", "stats_json_many", "work_lag"]

# Ready ticks looked past before the lag is taken as it is: one per cron task.
_MAX_TICKS = 8


async def work_lag(queue: AsyncQueue, stats: Stats) -> float:
    """``stats.lag`` of ``queue`` less the wait of the cron ticks at the head of its
    ready messages (0.0 when only ticks are ready). Peeks one message at a time, and
    only when a message is ready: most queues cost nothing more."""
    if stats.ready == 0 or stats.lag <= 0:
        return stats.lag
    first: Message | None = None
    last: Message | None = None
    for _ in range(_MAX_TICKS + 1):
        after = None if last is None else (last.due_at, last.seq or 0)
        page = await queue.peek(state=State.READY, limit=1, after=after)
        if not page:
            return 0.0  # only ticks are ready (or the ready ones left meanwhile)
        last = page[0]
        if first is None:
            first = last
        if TICK_HEADER not in last.headers:
            break
    assert first is not None
    assert last is not None
    # Measured from the backend's own lag (its clock), not this server's clock.
    return min(stats.lag, max(0.0, stats.lag - (last.due_at - first.due_at) / 1000.0))


async def stats_json(queue: AsyncQueue, stats: Stats) -> dict[str, Any]:
    """``stats`` of ``queue`` as the API answers them (``QueueStats``), ``work_lag``
    included: what the dashboard shows too."""
    return {
        "name": queue.name,
        "scheduled": stats.scheduled,
        "ready": stats.ready,
        "active": stats.active,
        "dead": stats.dead,
        "next_due_at": stats.next_due_at,
        "lag": stats.lag,
        "work_lag": await work_lag(queue, stats),
    }


async def stats_json_many(
    queues: Sequence[AsyncQueue], stats: Sequence[Stats]
) -> list[dict[str, Any]]:
    """:func:`stats_json` of each queue, at once."""
    pairs = zip(queues, stats, strict=True)
    return list(await asyncio.gather(*(stats_json(queue, one) for queue, one in pairs)))
