"""The loaded part of ``memory://`` (:data:`DRIVER`): its openers; it has no outage."""

from ...durable.descriptor import BackendDriver
from ._async.backend import open_async_backend
from ._sync.backend import open_backend

__all__ = ["DRIVER"]

DRIVER = BackendDriver(open_backend=open_backend, open_async_backend=open_async_backend)
