"""``redis://host:port/db`` and ``rediss://``: the durable backend on Redis (see
:mod:`.backend`)."""

from redis import exceptions as _errors

from .backend import AsyncRedisBackend, RedisBackend, open_async_backend, open_backend

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
