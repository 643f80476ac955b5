"""``redis://host:port/db`` and ``rediss://``: the durable backend on Redis (see
:mod:`.backend`; sharded queues and ``redis+cluster://``: :mod:`.sharded`)."""

from ._open import open_async_backend, open_backend
from .backend import AsyncRedisBackend, RedisBackend

__all__ = ["AsyncRedisBackend", "RedisBackend", "open_async_backend", "open_backend"]
