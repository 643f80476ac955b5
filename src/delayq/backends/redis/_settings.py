"""The Redis backend's settings: key layout, timeouts, retries and backoffs."""

from __future__ import annotations

#: The first part of every key delayq writes (``<prefix>:{<queue>:<shard>}:<suffix>``).
REDIS_DEFAULT_PREFIX = "delayq"
#: The keys of one queue shard, in the order every Lua script takes them as KEYS.
REDIS_KEY_SUFFIXES = (b"msg", b"due", b"lease", b"dead", b"seq", b"wake")
#: Seconds a listener blocks in BLPOP on the wake-up marker before it blocks again; its
#: waiting consumers then look at the queue once more (which bounds how long any missed
#: wake-up could last), so an idle consumer costs about two commands per this period.
REDIS_LISTEN_TIMEOUT = 2.0
#: Extra seconds the listener's socket waits beyond its BLPOP timeout (a dead peer).
REDIS_LISTEN_SLACK = 3.0
#: Socket timeouts (s) of the shared connections: reading a reply, and connecting.
REDIS_SOCKET_TIMEOUT = 10.0
REDIS_CONNECT_TIMEOUT = 5.0
#: How often a call is sent again after a connection error (when the rule allows it),
#: and its backoff (s).
REDIS_RETRIES = 3
REDIS_RETRY_BASE = 0.02
REDIS_RETRY_CAP = 0.5
#: Backoff (s) of a waiting consumer or listener that lost Redis: first and longest.
REDIS_RECONNECT_FIRST = 0.05
REDIS_RECONNECT_MAX = 1.0
#: Redis ``queues()``: the COUNT hint of each SCAN step.
REDIS_SCAN_COUNT = 1000
#: How long before its due time a waiting reserve claims a message ("Fire ahead" in
#: delayq.durable.backend): the claim's round trip on the asyncio face measured 0.15 ms
#: at p50 and 0.34 ms at p99 at load average 4 on 2 vCPUs (up to 8 ms at p99 at load 9,
#: where the CPU, not Redis, is the wait), so that the claim is hidden from the
#: message's lateness, while the window in which the message is in flight early stays
#: within the timing noise (as amqp://'s held reply, 2 ms).
REDIS_FIRE_AHEAD_MS = 2
