"""Settings of the replicated backends (amqp://), in one place."""

from __future__ import annotations

__all__ = ["DEDUP_SIZE", "MAX_GROUP_BYTES", "RENEW_EVERY", "REQUEST_TIMEOUT"]

#: Request ids remembered with their replies, so that a resent request is answered,
#: not applied twice (the newest are kept).
DEDUP_SIZE = 200_000
#: An entry of the log holds the operations decided while the previous append was in
#: flight, up to about this many bytes (one larger operation goes alone).
MAX_GROUP_BYTES = 1 << 20
#: Seconds between two renewals of the election (a held delivery must be acked before
#: the broker's consumer timeout, 30 min by default on RabbitMQ).
RENEW_EVERY = 300.0
#: Seconds a request waits for a scheduler to answer before it fails as an outage.
REQUEST_TIMEOUT = 10.0
