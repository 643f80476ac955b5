"""Limits and defaults of ``delayq serve``: the HTTP API, the dashboard, URL callbacks
and their dispatcher (the defaults ``delayq serve --help`` shows are in
:mod:`delayq._constants`).
"""

from __future__ import annotations

#: Largest request body the HTTP API reads (bytes); a larger one is a 413.
SERVE_MAX_BODY = 2 * 1024 * 1024

#: Longest long-poll of ``POST /v1/queues/{queue}/reserve`` (seconds).
SERVE_MAX_WAIT = 30.0

#: Callbacks in flight at once per server process.
SERVE_DISPATCH_CONCURRENCY = 64

#: Connections of one of the dispatcher's httpcore pools: the work of a pool's every
#: request and answer grows with the square of the connections it holds (it scans them
#: all, probing each socket), so the dispatcher spreads its requests over small pools.
DISPATCH_POOL_CONNECTIONS = 8

#: The message header that carries a message's callback (JSON).
CALLBACK_HEADER = "delayq-callback"
CALLBACK_DEFAULT_TIMEOUT = 10.0
CALLBACK_MAX_TIMEOUT = 300.0

#: The request header with ``t=<unix seconds>,v1=<hex>,v2=<hex>,v3=<hex>``: v1 the
#: HMAC-SHA256 of ``"<t>." + body``, v2 of ``"<t>\n<method>\n<url>\n<message id>\n" + body``,
#: v3 of the lines ``v3``, t, method, url, message id, queue, attempt, content type,
#: each ended by ``\n``, then the body (see :func:`~._callbacks.sign`).
CALLBACK_SIGNATURE_HEADER = "X-Delayq-Signature"

#: How often the dashboard's pages fetch fresh numbers (ms), and how many rows they list.
DASHBOARD_REFRESH_MS = 3000
DASHBOARD_LIST_LIMIT = 100

#: The "falls due over the next hour" chart: horizon (seconds) and number of bars.
DASHBOARD_CHART_HORIZON = 3600.0
DASHBOARD_CHART_BUCKETS = 60

#: Largest login form body (bytes) the dashboard reads.
DASHBOARD_MAX_LOGIN_BODY = 8192

#: Longest callback URL (characters) and most / largest extra request headers.
CALLBACK_MAX_URL_LENGTH = 2048
CALLBACK_MAX_HEADERS = 32
CALLBACK_MAX_HEADER_BYTES = 8192

#: A signed request's timestamp may be this many seconds off when verified.
CALLBACK_SIGNATURE_TOLERANCE = 300

#: A callback's lease is its timeout plus this margin (s), so it rarely needs extending.
CALLBACK_LEASE_MARGIN = 5.0

#: How much of a receiver's answer (bytes) the dispatcher reads before dropping it.
CALLBACK_MAX_RESPONSE_READ = 65536

#: Seconds in-flight callbacks may finish after the dispatcher is stopped.
DISPATCH_GRACE = 5.0

#: Longest one blocking reserve of the dispatcher waits before it is re-armed (s).
DISPATCH_IDLE_WAIT = 5.0

#: Pause (s) after a failed reserve before trying again (the first step of the backoff).
DISPATCH_ERROR_BACKOFF = 0.5

#: Most messages in one batch put, and the largest ``max``/``limit`` of the API.
SERVE_MAX_BATCH = 1000
SERVE_MAX_LIMIT = 1000

#: Longest horizon (s) and most buckets of ``GET /v1/queues/{queue}/due``.
SERVE_MAX_DUE_HORIZON = 7 * 86_400.0
SERVE_MAX_DUE_BUCKETS = 1000

#: Seconds ``/healthz`` waits for the backend before it answers 503.
SERVE_HEALTH_TIMEOUT = 5.0

#: Most single-message puts of concurrent requests stored by one ``put_many``.
SERVE_COALESCE_MAX_BATCH = 256

#: Most queue objects (and idle put batchers) one server keeps for reuse; the least
#: recently used beyond it are dropped (a queue object is made again on its next
#: request), so requests naming ever new queues cannot grow the server's memory.
SERVE_QUEUE_CACHE = 1024

#: Most bytes of a request's line and headers; more is a 431 (counted as they arrive).
SERVE_MAX_HEADER_BYTES = 32 * 1024

#: Seconds a client may take to send a whole request body (the time for each piece
#: is ``SERVE_CLIENT_TIMEOUT``); past it the connection is closed with a 408.
SERVE_BODY_TIMEOUT = 60.0

#: Largest body (bytes) of a request outside the ``/v1`` API (the dashboard's forms).
SERVE_MAX_PAGE_BODY = 8192

#: Long-polls (reserves with a wait) one client address may hold open at once; more
#: are a 429.
SERVE_MAX_LONG_POLLS_PER_CLIENT = 32

#: Token attempts (bearer or login form) that may fail in a burst from one client
#: address, and how many seconds give one more; past that its attempts are a 429.
SERVE_AUTH_FAILURE_BURST = 20
SERVE_AUTH_FAILURE_REFILL = 3.0

#: Client addresses the attempt throttle remembers at once.
SERVE_AUTH_TRACKED_CLIENTS = 10_000

#: Most bytes of messages one answer holds: a page of a list (the API's and each list
#: of the dashboard's queue page) or a reserve ends before the message that would pass
#: it (with a cursor to the rest; a reserve claims no more than it returns), but always
#: holds one. Messages are fetched a few at a time so that what is read from the
#: backend stays near it too, and encoded off the event loop.
SERVE_ANSWER_BUDGET = 4 * 1024 * 1024
