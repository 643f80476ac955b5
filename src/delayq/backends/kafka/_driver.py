"""The loaded part of ``kafka://`` (:data:`DRIVER`): its openers and errors."""

from aiokafka.errors import KafkaConnectionError, KafkaError

from ...durable.descriptor import BackendDriver
from .._replicated import LogFull, NoScheduler, Refused
from ._async.backend import open_async_backend
from ._sync.backend import open_backend

__all__ = ["DRIVER", "OUTAGE_ERRORS"]

#: The errors of kafka:// that mean "the brokers or the scheduler do not answer".
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    NoScheduler,
    LogFull,
    ConnectionError,
    KafkaConnectionError,
)

DRIVER = BackendDriver(
    open_backend=open_backend,
    open_async_backend=open_async_backend,
    outage_errors=OUTAGE_ERRORS,
    errors=(Refused, KafkaError),
)
