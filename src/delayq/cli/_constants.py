"""Defaults of the ``delayq`` command's long-running processes."""

from __future__ import annotations

#: Seconds ``delayq serve`` and ``delayq worker`` give the backend to answer at start.
STARTUP_CHECK_TIMEOUT = 10.0

#: Seconds uvicorn gives open requests at shutdown before it cancels them.
SERVE_SHUTDOWN_GRACE = 10.0
