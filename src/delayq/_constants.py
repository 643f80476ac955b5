"""The defaults ``delayq serve`` applies and its ``--help`` shows: the CLI reads them
without importing the server, whose FastAPI is an optional extra, so they live below
both. Every other subsystem keeps its constants in its own ``_constants`` module.
"""

from __future__ import annotations

# -- delayq serve: the defaults its command shows ----------------------------------
#: The address and port ``delayq serve`` binds by default.
SERVE_DEFAULT_HOST = "127.0.0.1"
SERVE_DEFAULT_PORT = 8080

#: The queue a callback message goes to unless the server names others.
DEFAULT_CALLBACK_QUEUE = "callbacks"

#: Seconds a client may take to send a request's line and headers (from its first
#: byte, or from the connection's start), or each piece of a body; past it the
#: connection is closed (with a 408 when a request began).
SERVE_CLIENT_TIMEOUT = 10.0

#: Connections and requests one server process serves at once; more are a 503.
SERVE_MAX_CONCURRENCY = 1000

#: How long a dashboard session lasts (seconds) from its login.
SERVE_SESSION_TTL = 12 * 3600.0
