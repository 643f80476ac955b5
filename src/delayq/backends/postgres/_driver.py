"""The loaded part of ``postgresql://`` (:data:`DRIVER`): its openers and psycopg's
errors."""

import psycopg
import psycopg_pool

from ...durable.descriptor import BackendDriver
from ._async.backend import open_async_backend
from ._sync.backend import open_backend

__all__ = ["DRIVER", "OUTAGE_ERRORS"]

#: The server does not answer: a lost or refused connection, a pool that found no
#: connection in time (see delayq.durable.registry).
OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg_pool.PoolTimeout,
)

DRIVER = BackendDriver(
    open_backend=open_backend,
    open_async_backend=open_async_backend,
    outage_errors=OUTAGE_ERRORS,
    errors=(psycopg.Error,),
)
