"""The loaded part of ``redis://`` (:data:`DRIVER`): its openers and redis-py's errors."""

from redis import exceptions

from ...durable.descriptor import BackendDriver
from ._async.open import open_async_backend
from ._sync.open import open_backend

__all__ = ["DRIVER", "OUTAGE_ERRORS"]

#: Redis down, loading, read-only or failing over: "the backend does not answer"
#: (see delayq.durable.registry).
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    exceptions.ConnectionError,
    exceptions.TimeoutError,
    exceptions.BusyLoadingError,
    exceptions.ReadOnlyError,
    exceptions.ClusterDownError,
    exceptions.TryAgainError,
    exceptions.MasterDownError,
)

DRIVER = BackendDriver(
    open_backend=open_backend,
    open_async_backend=open_async_backend,
    outage_errors=OUTAGE_ERRORS,
    errors=(exceptions.RedisError,),
)
