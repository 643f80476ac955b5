"""Constants shared across delayq, in one place."""

from __future__ import annotations

import math

INF = math.inf

#: Default tick of a :class:`~delayq.WheelStore`: a timer fires at most this late.
DEFAULT_WHEEL_TICK = 0.001
#: Slots per level of the timing wheel (a power of two: levels are bit fields of the tick).
WHEEL_BITS = 6
#: Wheel ticks beyond this go to an ordered overflow list (about 36 million years at 1 ms).
WHEEL_MAX_TICKS = 1 << 60

#: Default number of items ``get_many`` returns at most.
DEFAULT_GET_MANY = 100
#: Default thread-pool size of a :class:`~delayq.Scheduler`.
DEFAULT_SCHEDULER_WORKERS = 4

#: The name of the logger delayq writes to.
LOGGER_NAME = "delayq"

# -- durable queues ----------------------------------------------------------------

#: The queue URL used when neither ``url=`` nor ``$DELAYQ_URL`` is given.
DEFAULT_QUEUE_URL = "sqlite:///delayq.db"
#: The environment variable that holds the default queue URL.
QUEUE_URL_ENV = "DELAYQ_URL"
#: The queue name used when none is given.
DEFAULT_QUEUE_NAME = "default"
#: Default size limit of a serialized payload, in bytes (1 MiB).
DEFAULT_MAX_PAYLOAD = 1024 * 1024
#: Longest message id and queue name, in characters.
MAX_ID_LENGTH = 255
#: ``last_error`` strings are cut to this many characters.
MAX_ERROR_LENGTH = 8192
#: Longest ``wait`` of ``reserve`` (s), about a century (a thread cannot wait much longer
#: at once); ``wait=None`` waits until a message is due, however long that takes.
MAX_RESERVE_WAIT = 100 * 366 * 86_400.0
#: Default lease of ``reserve``, in seconds.
DEFAULT_LEASE = 30.0
#: Default number of messages ``dead()`` returns.
DEFAULT_DEAD_LIMIT = 100
#: The ``last_error`` of a message whose lease expired.
LEASE_EXPIRED_ERROR = "lease expired"
#: Most containers (dicts, lists, tuples) a payload may nest, one inside the other: a
#: deeper one is refused at put (PayloadTooDeep, a ValueError), and one stored before
#: this limit is read back with ``payload_error`` set instead of its payload. JSON
#: readers bound the depth they read (the server's answers fail past about 250, some
#: clients' readers past 64): 64 is read back by all of them.
MAX_PAYLOAD_DEPTH = 64
#: Most headers of one message, and most bytes of their names and values together
#: (UTF-8): a message's headers are shown whole wherever it is (the API, the dashboard),
#: so they are bounded apart from the payload. More raises HeadersTooLarge (a ValueError).
MAX_MESSAGE_HEADERS = 64
MAX_MESSAGE_HEADER_BYTES = 64 * 1024
#: The ``encoding`` of a payload given as bytes and stored untouched.
RAW_ENCODING = "bytes"

#: RetryPolicy defaults: attempts, first delay (s), growth factor, cap (s), jitter (fraction).
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_FACTOR = 2.0
DEFAULT_RETRY_MAX_DELAY = 3600.0
DEFAULT_RETRY_JITTER = 0.1
#: The latest due time delayq accepts, in epoch ms (the end of year 9999).
MAX_DUE_MS = 253_402_300_799_999

# -- sqlite:// ---------------------------------------------------------------------

#: Longest time (s) a busy SQLite database is waited for before TimeoutError.
SQLITE_BUSY_TIMEOUT = 30.0
#: Longest time (s) SQLite's own busy handler waits per try (delayq then retries).
SQLITE_BUSY_HANDLER_TIMEOUT = 1.0
#: How often (s) a waiting consumer checks whether another process committed.
SQLITE_POLL_INTERVAL = 0.02
#: How long (s) the change watcher outlives its last waiter.
SQLITE_WATCHER_LINGER = 1.0
#: Default ``PRAGMA synchronous``: NORMAL is durable across process crashes in WAL mode.
SQLITE_SYNCHRONOUS = "normal"
#: Worker threads of an async SQLite backend.
SQLITE_ASYNC_THREADS = 4
#: ``PRAGMA wal_autocheckpoint`` (pages): fewer, larger checkpoints than SQLite's 1000.
SQLITE_WAL_AUTOCHECKPOINT = 4000

# -- worker, app and cron ----------------------------------------------------------

#: Default number of handlers one :class:`~delayq.worker.Worker` runs at once.
DEFAULT_WORKER_CONCURRENCY = 8
#: Default seconds running handlers get to finish after SIGTERM/SIGINT or ``stop()``.
DEFAULT_WORKER_GRACE = 30.0
#: A running handler's lease is renewed every ``lease / WORKER_EXTEND_DIVISOR`` seconds.
WORKER_EXTEND_DIVISOR = 3.0
#: Longest single blocking ``reserve`` of an idle worker (s); it then simply reserves again.
WORKER_IDLE_WAIT = 5.0
#: Pause (s) after a backend error in the reserve loop before trying again: the first
#: step of the backoff, doubled at each failure in a row up to BACKEND_RETRY_MAX.
WORKER_ERROR_BACKOFF = 1.0
#: Longest pause (s) between two tries of a worker or dispatcher that lost its backend:
#: how late it may notice the backend is back, and the log's pace during an outage.
BACKEND_RETRY_MAX = 10.0
#: Seconds ``delayq serve`` and ``delayq worker`` give the backend to answer at start.
STARTUP_CHECK_TIMEOUT = 10.0
#: Header that marks a cron tick; its value is the tick time in epoch ms.
CRON_TICK_HEADER = "delayq-cron-tick"
#: A cron run is acked at least this long (s) after its tick, so that an on-time put of
#: the same tick id can never land in the millisecond of the ack (see delayq._cron).
CRON_ACK_GUARD = 0.002
#: Longest sleep (s) of a cron producer; it re-puts its next tick (a no-op) after it.
CRON_PRODUCER_MAX_SLEEP = 60.0

# -- delayq serve ------------------------------------------------------------------
SERVE_DEFAULT_HOST = "127.0.0.1"
SERVE_DEFAULT_PORT = 8080
#: Largest request body the HTTP API reads (bytes); a larger one is a 413.
SERVE_MAX_BODY = 2 * 1024 * 1024
#: Longest long-poll of ``POST /v1/queues/{queue}/reserve`` (seconds).
SERVE_MAX_WAIT = 30.0
#: Callbacks in flight at once per server process.
SERVE_DISPATCH_CONCURRENCY = 64
#: The queue a callback message goes to unless the server names others.
DEFAULT_CALLBACK_QUEUE = "callbacks"
#: The message header that carries a message's callback (JSON).
CALLBACK_HEADER = "delayq-callback"
CALLBACK_DEFAULT_TIMEOUT = 10.0
CALLBACK_MAX_TIMEOUT = 300.0
#: The request header with ``t=<unix seconds>,v1=<hex>,v2=<hex>``: v1 the HMAC-SHA256 of
#: ``"<t>." + body``, v2 of ``"<t>\n<method>\n<url>\n<message id>\n" + body``.
CALLBACK_SIGNATURE_HEADER = "X-Delayq-Signature"

# -- inspection: queues(), peek(), due_counts() --------------------------------------
#: ``peek()``: how many messages by default, and at most.
DEFAULT_PEEK_LIMIT = 100
MAX_PEEK_LIMIT = 10_000
#: ``due_counts()``: the default horizon (seconds) and number of buckets, and the limits.
DEFAULT_DUE_HORIZON = 3600.0
DEFAULT_DUE_BUCKETS = 60
MAX_DUE_BUCKETS = 1000
MAX_DUE_HORIZON = 366 * 86400.0

# -- delayq serve: the dashboard ------------------------------------------------------
#: How often the dashboard's pages fetch fresh numbers (ms), and how many rows they list.
DASHBOARD_REFRESH_MS = 3000
DASHBOARD_LIST_LIMIT = 100
#: The "falls due over the next hour" chart: horizon (seconds) and number of bars.
DASHBOARD_CHART_HORIZON = 3600.0
DASHBOARD_CHART_BUCKETS = 60
#: Largest login form body (bytes) the dashboard reads.
DASHBOARD_MAX_LOGIN_BODY = 8192

# -- delayq serve: URL callbacks (push delivery) --------------------------------------
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

# -- delayq serve: the HTTP API ----------------------------------------------------
#: Most messages in one batch put, and the largest ``max``/``limit`` of the API.
SERVE_MAX_BATCH = 1000
SERVE_MAX_LIMIT = 1000
#: Longest horizon (s) and most buckets of ``GET /v1/queues/{queue}/due``.
SERVE_MAX_DUE_HORIZON = 7 * 86_400.0
SERVE_MAX_DUE_BUCKETS = 1000
#: Seconds ``/healthz`` waits for the backend before it answers 503.
SERVE_HEALTH_TIMEOUT = 5.0
#: Seconds uvicorn gives open requests at shutdown before it cancels them.
SERVE_SHUTDOWN_GRACE = 10.0

# -- batch acknowledgement (ack_many) ----------------------------------------------
#: Most messages one ``ack_many`` call takes.
MAX_ACK_MANY = 10_000

# -- delayq serve: batching the puts of concurrent requests ---------------------------
#: Most single-message puts of concurrent requests stored by one ``put_many``.
SERVE_COALESCE_MAX_BATCH = 256
#: Most queue objects (and idle put batchers) one server keeps for reuse; the least
#: recently used beyond it are dropped (a queue object is made again on its next
#: request), so requests naming ever new queues cannot grow the server's memory.
SERVE_QUEUE_CACHE = 1024

# -- delayq serve: limits on what a client may hold or send ---------------------------
#: Most bytes of a request's line and headers; more is a 431 (counted as they arrive).
SERVE_MAX_HEADER_BYTES = 32 * 1024
#: Seconds a client may take to send a request's line and headers (from its first
#: byte, or from the connection's start), or each piece of a body; and a whole body.
#: Past either the connection is closed (with a 408 when a request began).
SERVE_CLIENT_TIMEOUT = 10.0
SERVE_BODY_TIMEOUT = 60.0
#: Largest body (bytes) of a request outside the ``/v1`` API (the dashboard's forms).
SERVE_MAX_PAGE_BODY = 8192
#: Connections and requests one server process serves at once; more are a 503.
SERVE_MAX_CONCURRENCY = 1000
#: Long-polls (reserves with a wait) one client address may hold open at once; more
#: are a 429.
SERVE_MAX_LONG_POLLS_PER_CLIENT = 32
#: Token attempts (bearer or login form) that may fail in a burst from one client
#: address, and how many seconds give one more; past that its attempts are a 429.
SERVE_AUTH_FAILURE_BURST = 20
SERVE_AUTH_FAILURE_REFILL = 3.0
#: Client addresses the attempt throttle remembers at once.
SERVE_AUTH_TRACKED_CLIENTS = 10_000
#: How long a dashboard session lasts (seconds) from its login.
SERVE_SESSION_TTL = 12 * 3600.0
