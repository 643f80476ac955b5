"""``redis://host:port/db`` and ``rediss://``: the durable backend on Redis (see
:mod:`.backend`)."""

from .backend import AsyncRedisBackend, RedisBackend, open_async_backend, open_backend

__all__ = ["AsyncRedisBackend", "RedisBackend", "open_async_backend", "open_backend"]
