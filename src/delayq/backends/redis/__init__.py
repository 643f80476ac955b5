"""``redis://host:port/db`` and ``rediss://``: the durable backend on Redis (see
:mod:`.backend`; sharded queues and ``redis+cluster://``: :mod:`.sharded`)."""

from redis import exceptions as _errors

from ._open import open_async_backend, open_backend
from .backend import AsyncRedisBackend, RedisBackend

__all__ = ["AsyncRedisBackend", "RedisBackend", "open_async_backend", "open_backend"]

#: Redis down, loading, read-only or failing over: "the backend does not answer"
#: (see delayq.durable.registry).
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    _errors.ConnectionError,
    _errors.TimeoutError,
    _errors.BusyLoadingError,
    _errors.ReadOnlyError,
    _errors.ClusterDownError,
    _errors.TryAgainError,
    _errors.MasterDownError,
)
