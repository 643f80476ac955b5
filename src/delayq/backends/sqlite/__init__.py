"""``sqlite:///path.db``: the embedded durable backend (see :mod:`.backend`)."""

from .backend import AsyncSQLiteBackend, SQLiteBackend, open_async_backend, open_backend

__all__ = ["AsyncSQLiteBackend", "SQLiteBackend", "open_async_backend", "open_backend"]
