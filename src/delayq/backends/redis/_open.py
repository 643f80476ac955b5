"""Opening ``redis://``: the single-node faces, or the sharded ones for ``shards=N`` or
``redis+cluster://``."""

from __future__ import annotations

from typing import Any

from ._url import parse_url
from .backend import AsyncRedisBackend, RedisBackend
from .sharded import AsyncShardedRedisBackend, ShardedRedisBackend

__all__ = ["open_async_backend", "open_backend"]


def open_backend(url: str, **options: Any) -> RedisBackend | ShardedRedisBackend:
    """Open the sync face of ``redis://host:port/db`` (options: see the module
    docstring); a sharded queue or ``redis+cluster://`` is served by :mod:`.sharded`."""
    settings = parse_url(url, **options)
    if settings.shards > 1 or settings.cluster:
        return ShardedRedisBackend(url, **options)
    return RedisBackend(url, **options)


def open_async_backend(url: str, **options: Any) -> AsyncRedisBackend | AsyncShardedRedisBackend:
    """Open the async face of ``redis://host:port/db`` (options: see the module
    docstring); a sharded queue or ``redis+cluster://`` is served by :mod:`.sharded`."""
    settings = parse_url(url, **options)
    if settings.shards > 1 or settings.cluster:
        return AsyncShardedRedisBackend(url, **options)
    return AsyncRedisBackend(url, **options)
