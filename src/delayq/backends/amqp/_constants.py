"""Settings of ``amqp://``: its broker objects' names and arguments, its timeouts."""

from __future__ import annotations

from pamqp.common import FieldTable

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_PREFIX",
    "DEFAULT_REQUEST_TIMEOUT",
    "LOCK_ARGUMENTS",
    "LOG_ARGUMENTS",
    "LOG_PREFETCH",
    "TOKEN_RETRIES",
]

#: The namespace of a URL without ``prefix=``: its objects are ``delayq.log``...
DEFAULT_PREFIX = "delayq"
#: Seconds a request waits for the scheduler before it fails as an outage.
DEFAULT_REQUEST_TIMEOUT = 10.0
#: AMQP heartbeat asked of the broker, in seconds: a dead peer is seen after two misses.
DEFAULT_HEARTBEAT = 10
#: The log: a stream with three replicas where the cluster has them (a smaller cluster
#: takes what it has). No retention limit: a stream drops whole old segments, and
#: until checkpoints roll live records forward an old segment may hold the only image
#: of a live record.
LOG_ARGUMENTS: FieldTable = {
    "x-queue-type": "stream",
    "x-initial-cluster-size": 3,
    "x-stream-max-segment-size-bytes": 64_000_000,
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
#: Pauses, in seconds, between tries of publishing the election's token when the broker
#: nacks it (a lock queue declared a moment ago may not take it yet).
TOKEN_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8)
#: The content type of a message delivered to a user's exchange, by its encoding (any
#: other: ``application/x-delayq-<encoding>``).
CONTENT_TYPES = {"json": "application/json", "bytes": "application/octet-stream"}
