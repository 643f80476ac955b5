"""The durable contract's defaults and limits: queue URLs and names, payloads,
leases, retries, and what inspection and batches take at most.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_DEAD_LIMIT",
    "DEFAULT_DUE_BUCKETS",
    "DEFAULT_DUE_HORIZON",
    "DEFAULT_LEASE",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_PEEK_LIMIT",
    "DEFAULT_QUEUE_NAME",
    "DEFAULT_QUEUE_URL",
    "DEFAULT_RETRY_BASE",
    "DEFAULT_RETRY_FACTOR",
    "DEFAULT_RETRY_JITTER",
    "DEFAULT_RETRY_MAX_DELAY",
    "MAX_ACK_MANY",
    "MAX_DUE_BUCKETS",
    "MAX_DUE_HORIZON",
    "MAX_DUE_MS",
    "MAX_ERROR_LENGTH",
    "MAX_MESSAGE_HEADERS",
    "MAX_MESSAGE_HEADER_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "MAX_PAYLOAD_VALUES",
    "MAX_PEEK_LIMIT",
    "MAX_RESERVE_WAIT",
    "QUEUE_URL_ENV",
    "TICK_HEADER",
]

#: The queue URL used when neither ``url=`` nor ``$DELAYQ_URL`` is given.
DEFAULT_QUEUE_URL = "sqlite:///delayq.db"

#: The environment variable that holds the default queue URL.
QUEUE_URL_ENV = "DELAYQ_URL"

#: The queue name used when none is given.
DEFAULT_QUEUE_NAME = "default"

#: Default size limit of a serialized payload, in bytes (1 MiB).
DEFAULT_MAX_PAYLOAD = 1024 * 1024

#: ``last_error`` strings are cut to this many characters.
MAX_ERROR_LENGTH = 8192

#: Longest ``wait`` of ``reserve`` (s), about a century (a thread cannot wait much longer
#: at once); ``wait=None`` waits until a message is due, however long that takes.
MAX_RESERVE_WAIT = 100 * 366 * 86_400.0

#: Default lease of ``reserve``, in seconds.
DEFAULT_LEASE = 30.0

#: Default number of messages ``dead()`` returns.
DEFAULT_DEAD_LIMIT = 100

#: Most containers (dicts, lists, tuples) a payload may nest, one inside the other: a
#: deeper one is refused at put (PayloadTooDeep, a ValueError), and one stored before
#: this limit is read back with ``payload_error`` set instead of its payload. JSON
#: readers bound the depth they read (the server's answers fail past about 250, some
#: clients' readers past 64): 64 is read back by all of them.
MAX_PAYLOAD_DEPTH = 64

#: Most values a payload may hold: every container and every scalar in it, the payload
#: itself included (``[1, 2]`` holds 3; dict keys do not count). Decoded, a value costs
#: up to about 70 bytes of memory for the 2 or 3 bytes it takes in JSON (``[]``), so
#: 1 MiB of empty lists is 25 MB once read: this bounds what one message costs the
#: reader, whatever its size. More is refused at put (PayloadTooManyValues, a
#: ValueError), and read back with ``payload_error`` set. 100,000 values in the default
#: 1 MiB is an average of 10 bytes each: records of named fields stay far below it;
#: only long arrays of small numbers come near, and those belong in a bytes payload.
MAX_PAYLOAD_VALUES = 100_000

#: Most headers of one message, and most bytes of their names and values together
#: (UTF-8): a message's headers are shown whole wherever it is (the API, the dashboard),
#: so they are bounded apart from the payload. More raises HeadersTooLarge (a ValueError).
MAX_MESSAGE_HEADERS = 64
MAX_MESSAGE_HEADER_BYTES = 64 * 1024

#: RetryPolicy defaults: attempts, first delay (s), growth factor, cap (s), jitter (fraction).
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_FACTOR = 2.0
DEFAULT_RETRY_MAX_DELAY = 3600.0
DEFAULT_RETRY_JITTER = 0.1

#: The latest due time delayq accepts, in epoch ms (the end of year 9999).
MAX_DUE_MS = 253_402_300_799_999

#: ``peek()``: how many messages by default, and at most.
DEFAULT_PEEK_LIMIT = 100
MAX_PEEK_LIMIT = 10_000

#: ``due_counts()``: the default horizon (seconds) and number of buckets, and the limits.
DEFAULT_DUE_HORIZON = 3600.0
DEFAULT_DUE_BUCKETS = 60
MAX_DUE_BUCKETS = 1000
MAX_DUE_HORIZON = 366 * 86400.0

#: Most messages one ``ack_many`` call takes.
MAX_ACK_MANY = 10_000

#: The header of a cron tick (its value the tick time, epoch ms): the runtime's
#: producers put ticks with it; the server tells a waiting tick from overdue work by it.
TICK_HEADER = "delayq-cron-tick"
