"""``queues()``: the queues under a key prefix, found by SCAN."""

from __future__ import annotations

from typing import Any

from ._resend import call, call_async
from ._scripts import queue_names, queues_pattern
from ._settings import REDIS_SCAN_COUNT

__all__ = ["scan_queues", "scan_queues_async"]


def scan_queues(client: Any, prefix: str) -> list[str]:
    """The queues under ``prefix`` that hold a message: a SCAN (on every master of a
    cluster) for their shards' ``msg`` keys, which exist exactly while not empty."""
    pattern = queues_pattern(prefix)
    return call(
        lambda: queue_names(prefix, client.scan_iter(match=pattern, count=REDIS_SCAN_COUNT)),
        safe=True,
    )


async def scan_queues_async(client: Any, prefix: str) -> list[str]:
    """:func:`scan_queues` on an asyncio client."""
    pattern = queues_pattern(prefix)

    async def scan() -> list[str]:
        keys = [key async for key in client.scan_iter(match=pattern, count=REDIS_SCAN_COUNT)]
        return queue_names(prefix, keys)

    return await call_async(scan, safe=True)
