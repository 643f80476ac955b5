"""``queues()``: the queues under a key prefix, found by SCAN; written once for
asyncio, its sync twin, ``_sync/scan.py``, is generated from this file by
``scripts/unasync.py``."""

from __future__ import annotations

from typing import Any

from ..._scripts import queue_names, queues_pattern
from ..._settings import REDIS_SCAN_COUNT
from .retry import call_async

__all__ = ["scan_queues_async"]


async def scan_queues_async(client: Any, prefix: str) -> list[str]:
    """The queues under ``prefix`` that hold a message: a SCAN (on every master of a
    cluster) of redis-py's ``client`` for their shards' ``msg`` keys, which exist
    exactly while not empty; the whole SCAN is sent again after a lost connection."""
    pattern = queues_pattern(prefix)

    async def scan(_: object) -> list[str]:
        keys: list[Any] = []
        async for key in client.scan_iter(match=pattern, count=REDIS_SCAN_COUNT):
            keys.append(key)
        return queue_names(prefix, keys)

    return await call_async(scan, safe=True)
