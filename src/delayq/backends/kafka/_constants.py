"""Settings of ``kafka://``: its topics' names and configurations, its timeouts."""

from __future__ import annotations

__all__ = [
    "DEFAULT_FETCH_WAIT_MS",
    "DEFAULT_PREFIX",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_RETENTION_BYTES",
    "HEARTBEAT_MS",
    "JOIN_TIMEOUT_MS",
    "MAX_RECORD_BYTES",
    "MAX_SESSION_TIMEOUT",
    "MIN_RETENTION_BYTES",
    "MIN_SESSION_TIMEOUT",
    "REBALANCE_TIMEOUT_MS",
    "REPLY_PARTITIONS",
    "SESSION_TIMEOUT_MS",
    "Names",
    "log_config",
]

#: The namespace of a URL without ``prefix=``: its topics are ``delayq.log``...
DEFAULT_PREFIX = "delayq"
#: Seconds a request waits for a scheduler before it fails as an outage.
DEFAULT_REQUEST_TIMEOUT = 10.0
#: The log's and the intake's size retention (``retention.bytes``) unless
#: ``retention_bytes`` says otherwise. Checkpoints keep every live record's image in the
#: newest quarter of it (docs/rabbitmq.md, "Checkpoints and retention").
DEFAULT_RETENTION_BYTES = 20_000_000_000
#: The smallest retention taken (0 aside: none).
MIN_RETENTION_BYTES = 1_000_000
#: The log's segments (``segment.bytes``; retention drops whole segments): 64 MB,
#: an eighth of a retention under 512 MB.
LOG_SEGMENT_BYTES = 64_000_000
#: Kafka's own default ``fetch.max.wait.ms``: how long a tailing reader's fetch waits
#: for records. Kafka answers a waiting fetch as soon as records arrive; a broker that
#: answers only when the wait ends (Tansu) needs a short one (docs/kafka.md).
DEFAULT_FETCH_WAIT_MS = 500
#: The largest record delayq produces (``max.message.bytes`` of the namespace's topics,
#: the producer's ``max_request_size``): an operation larger than a group commit's 1 MiB
#: (a put_many of large payloads, a reply that carries them) goes alone, as on amqp://.
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: The partitions of the replies topic: a client reads the one its inbox names.
REPLY_PARTITIONS = 8
#: The election's consumer group: a candidate that misses its heartbeats for this
#: long is taken out of the group, and another is elected (``session_timeout``).
SESSION_TIMEOUT_MS = 10_000
#: The bounds of ``session_timeout`` (s): a Kafka broker's defaults for them
#: (``group.min.session.timeout.ms``, ``group.max.session.timeout.ms``).
MIN_SESSION_TIMEOUT = 6.0
MAX_SESSION_TIMEOUT = 1800.0
#: How often a candidate heartbeats the group.
HEARTBEAT_MS = 1_000
#: The election group's rebalance timeout (``max.poll.interval.ms`` of a candidate's
#: member): how long the coordinator waits for the members to join again at a
#: rebalance, holding each one's JoinGroup request meanwhile.
REBALANCE_TIMEOUT_MS = 30_000
#: The least request timeout of a candidate's member: a JoinGroup request is answered
#: once the rebalance is done (as Kafka's Java client does, the rebalance timeout and
#: 5 s). With a shorter one, every join that a rebalance held longer was given up (on
#: Tansu a join is held 1 to 3 s), and the candidate was never elected.
JOIN_TIMEOUT_MS = REBALANCE_TIMEOUT_MS + 5_000


def log_config(retention_bytes: int) -> dict[str, str]:
    """The topic configuration of the log and the intake: deleted by size only (no
    time retention), ``retention_bytes`` of it (0: none)."""
    config = {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
        "max.message.bytes": str(MAX_RECORD_BYTES),
    }
    if retention_bytes:
        config["retention.bytes"] = str(retention_bytes)
        config["segment.bytes"] = str(min(LOG_SEGMENT_BYTES, retention_bytes // 8))
    else:
        config["retention.bytes"] = "-1"
    return config


class Names:
    """The topics of one namespace (``<prefix>.log``...) and its election's group."""

    def __init__(self, prefix: str) -> None:
        self.log = f"{prefix}.log"
        self.meta = f"{prefix}.meta"
        self.intake = f"{prefix}.intake"
        self.lock = f"{prefix}.lock"
        self.requests = f"{prefix}.requests"
        self.replies = f"{prefix}.replies"
        self.events = f"{prefix}.events"
