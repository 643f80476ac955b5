"""Settings of ``amqp://``: its broker objects' names and arguments, its timeouts."""

from __future__ import annotations

from pamqp.common import FieldTable

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_PREFIX",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_RETENTION_BYTES",
    "INTAKE_ACK_WITHIN",
    "LOCK_ARGUMENTS",
    "LOG_PREFETCH",
    "LOG_PREFETCH_FEW",
    "META_ARGUMENTS",
    "MIN_RETENTION_BYTES",
    "RPC_KEY",
    "SOON_KEY",
    "TOKEN_RETRIES",
    "Names",
    "intake_arguments",
    "log_arguments",
    "log_mismatch",
]

#: The namespace of a URL without ``prefix=``: its objects are ``delayq.log``...
DEFAULT_PREFIX = "delayq"
#: The routing key of the requests on the requests' exchange (``<prefix>.rpc``).
RPC_KEY = "rpc"
#: The routing key of a fast put that falls due soon, on the requests' exchange: bound
#: to the intake and to the scheduler's requests, so one publish reaches both.
SOON_KEY = "soon"
#: Seconds a request waits for the scheduler before it fails as an outage.
DEFAULT_REQUEST_TIMEOUT = 10.0
#: AMQP heartbeat asked of the broker, in seconds: a dead peer is seen after two misses.
DEFAULT_HEARTBEAT = 10
#: The log's size retention (``x-max-length-bytes``) unless ``retention_bytes`` says
#: otherwise: the stream drops its oldest segments beyond it. Checkpoints keep every
#: live record's image in the newest quarter of it (docs/rabbitmq.md).
DEFAULT_RETENTION_BYTES = 20_000_000_000
#: The smallest retention taken (0 aside: none).
MIN_RETENTION_BYTES = 1_000_000
#: The log's segments (a stream drops whole segments): 64 MB, smaller for a retention
#: under 512 MB (an eighth of it), so that retention can act at all.
LOG_SEGMENT_BYTES = 64_000_000
#: Checkpoint pointers: a small stream of its own, whose last message says where a new
#: scheduler starts its replay.
META_ARGUMENTS: FieldTable = {
    "x-queue-type": "stream",
    "x-initial-cluster-size": 3,
    "x-max-length-bytes": 16_000_000,
    "x-stream-max-segment-size-bytes": 1_000_000,
}
#: The election: a quorum queue whose single active consumer is the scheduler; it
#: holds one token, redelivered forever (no delivery limit, no dead-lettering).
LOCK_ARGUMENTS: FieldTable = {
    "x-queue-type": "quorum",
    "x-single-active-consumer": True,
    "x-quorum-initial-group-size": 3,
}
#: Deliveries of the log in flight to a reading scheduler (a stream consumer must
#: set one).
LOG_PREFETCH = 1000
#: The same for a reader that looks for one entry a few entries on.
LOG_PREFETCH_FEW = 8
#: The intake's reader acks every half prefetch, and at most this many seconds after a
#: delivery: RabbitMQ closes the channel of a consumer that leaves a delivery
#: unacknowledged for ``consumer_timeout`` (30 minutes by default), and the intake may
#: hold only the scheduler's markers, a few a minute.
INTAKE_ACK_WITHIN = 1.0
#: Pauses, in seconds, between tries of publishing the election's token when the broker
#: nacks it (a lock queue declared a moment ago may not take it yet).
TOKEN_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8)
#: The content type of a message delivered to a user's exchange, by its encoding (any
#: other: ``application/x-delayq-<encoding>``).
CONTENT_TYPES = {"json": "application/json", "bytes": "application/octet-stream"}


def log_arguments(retention_bytes: int) -> FieldTable:
    """The log: a stream with three replicas where the cluster has them (a smaller
    cluster takes what it has), ``retention_bytes`` of retention (0: none, the arguments
    of a namespace declared before retention)."""
    arguments: FieldTable = {
        "x-queue-type": "stream",
        "x-initial-cluster-size": 3,
        "x-stream-max-segment-size-bytes": LOG_SEGMENT_BYTES,
    }
    if retention_bytes:
        arguments["x-max-length-bytes"] = retention_bytes
        arguments["x-stream-max-segment-size-bytes"] = min(LOG_SEGMENT_BYTES, retention_bytes // 8)
    return arguments


def intake_arguments(retention_bytes: int) -> FieldTable:
    """The intake (fast puts, read by the scheduler): a stream like the log, with the
    same retention (what a scheduler down for long must still find unfolded)."""
    return log_arguments(retention_bytes)


def log_mismatch(log: str, retention_bytes: int, said: str) -> ValueError:
    """The error of a log ``log`` the broker would not declare with ``retention_bytes``'
    arguments (it exists with others; ``said``: the broker's words)."""
    return ValueError(
        f"the log {log} exists with other arguments than "
        f"retention_bytes={retention_bytes} asks ({said}). "
        f"A namespace declared before delayq gave its log a retention takes "
        f"retention_bytes=0 (checkpoints, no retention); otherwise pass the "
        f"retention_bytes it was declared with, or use a new prefix"
    )


class Names:
    """The broker objects of one namespace (``<prefix>.log``...)."""

    def __init__(self, prefix: str) -> None:
        self.log = f"{prefix}.log"
        self.meta = f"{prefix}.meta"
        self.intake = f"{prefix}.intake"
        self.lock = f"{prefix}.lock"
        self.rpc = f"{prefix}.rpc"
        self.events = f"{prefix}.events"

    @property
    def queues(self) -> tuple[str, str, str, str]:
        return self.log, self.meta, self.lock, self.intake

    @property
    def exchanges(self) -> tuple[str, str]:
        return self.rpc, self.events
