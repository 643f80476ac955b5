"""The loaded part of ``amqp://`` (:data:`DRIVER`): its openers and errors."""

import aiormq

from ...durable.descriptor import BackendDriver
from .._replicated import LogFull, NoScheduler, Refused
from ._async.backend import open_async_backend
from ._sync.backend import open_backend

__all__ = ["DRIVER", "OUTAGE_ERRORS"]

#: The errors of amqp:// that mean "the broker or the scheduler does not answer".
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    NoScheduler,
    LogFull,
    ConnectionError,
    aiormq.exceptions.AMQPConnectionError,
    aiormq.exceptions.ChannelInvalidStateError,
)

DRIVER = BackendDriver(
    open_backend=open_backend,
    open_async_backend=open_async_backend,
    outage_errors=OUTAGE_ERRORS,
    errors=(Refused, aiormq.exceptions.AMQPError),
)
