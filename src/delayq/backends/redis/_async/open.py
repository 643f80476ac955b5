"""Opening ``redis://``: the single-node face, or the sharded one for ``shards=N`` or
``redis+cluster://``; written once for asyncio, its sync twin, ``_sync/open.py``, is
generated from this file by ``scripts/unasync.py``."""

from __future__ import annotations

from typing import Any

from .._url import parse_url
from .backend import AsyncRedisBackend
from .sharded import AsyncShardedRedisBackend

__all__ = ["open_async_backend"]


def open_async_backend(url: str, **options: Any) -> AsyncRedisBackend | AsyncShardedRedisBackend:
    """Open the asyncio face of ``redis://host:port/db`` (options: see
    :mod:`.backend`); a sharded queue or ``redis+cluster://`` is served by
    :mod:`.sharded`."""
    settings = parse_url(url, **options)
    if settings.shards > 1 or settings.cluster:
        return AsyncShardedRedisBackend(url, **options)
    return AsyncRedisBackend(url, **options)
