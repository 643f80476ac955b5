"""The loaded part of ``sqlite:///`` (:data:`DRIVER`): its openers and errors."""

import sqlite3

from ...durable.descriptor import BackendDriver
from ._async.backend import open_async_backend
from ._sync.backend import open_backend

__all__ = ["DRIVER", "OUTAGE_ERRORS"]

#: A database locked or gone: "the backend does not answer" (see delayq.durable.registry).
OUTAGE_ERRORS: tuple[type[Exception], ...] = (sqlite3.OperationalError,)

DRIVER = BackendDriver(
    open_backend=open_backend,
    open_async_backend=open_async_backend,
    outage_errors=OUTAGE_ERRORS,
    errors=(sqlite3.Error,),  # a file that is not a database, a read-only one
)
