"""``sqlite:///path.db``: the embedded durable backend (see :mod:`.backend`)."""

import sqlite3

from .backend import AsyncSQLiteBackend, SQLiteBackend, open_async_backend, open_backend

__all__ = ["AsyncSQLiteBackend", "SQLiteBackend", "open_async_backend", "open_backend"]

#: A database locked or gone: "the backend does not answer" (see delayq.durable.registry).
OUTAGE_ERRORS: tuple[type[Exception], ...] = (sqlite3.OperationalError,)
