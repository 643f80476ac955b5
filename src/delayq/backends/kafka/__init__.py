"""``kafka://``: Apache Kafka, with delays replicated, exact to the millisecond, and
cancellable by id (docs/kafka.md).

``kafka://host:9092,host2:9092?prefix=delayq``. The replicated backend of
docs/rabbitmq.md on Kafka's terms: every operation is a request to the namespace's one
elected scheduler (a delayq process: the member of the consumer group ``<prefix>.lock``
assigned its one partition), which holds the state in memory, appends what each
operation changed to the topic ``<prefix>.log`` (``acks=all``) and replies once the
brokers acknowledged it. Options, in the URL or as keywords: ``prefix``, ``scheduler``,
``request_timeout``, ``retention_bytes``, ``fast_put``, ``standby``, ``shards``,
``scheduler_shards``,
``deliver_topic`` / ``deliver_key`` (as amqp's, docs/kafka.md), and Kafka's own:
``fetch_wait_ms`` (``fetch.max.wait.ms`` of the readers that tail a topic, default
500), ``idempotence`` (``on``, the default: an idempotent producer; ``off`` for a
broker without InitProducerId), ``security_protocol`` (``PLAINTEXT``, ``SSL``,
``SASL_PLAINTEXT``, ``SASL_SSL``), ``sasl_mechanism`` (``PLAIN``, ``SCRAM-SHA-256``,
``SCRAM-SHA-512``; the user and password are the URL's), ``ssl_cafile``,
``ssl_certfile``, ``ssl_keyfile``.

The asyncio face: :mod:`._async.backend`; the sync face, generated from it (its calls
go through a private event loop thread): :mod:`._sync.backend`; the broker's part:
:mod:`._transport`; the generic scheduler: :mod:`delayq.backends._replicated`.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_names
from ...durable.descriptor import BackendDescriptor, BackendDriver

if TYPE_CHECKING:
    from .._replicated import LogFull, NoScheduler, ServerRefused
    from ._async.backend import AsyncKafkaBackend, open_async_backend
    from ._driver import OUTAGE_ERRORS
    from ._sync.backend import KafkaBackend, open_backend

__all__ = [
    "DESCRIPTOR",
    "NOT_GUARANTEED",
    "OUTAGE_ERRORS",
    "AsyncKafkaBackend",
    "KafkaBackend",
    "LogFull",
    "NoScheduler",
    "ServerRefused",
    "open_async_backend",
    "open_backend",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "LogFull": ".._replicated",
        "NoScheduler": ".._replicated",
        "ServerRefused": ".._replicated",
        "AsyncKafkaBackend": "._async.backend",
        "open_async_backend": "._async.backend",
        "KafkaBackend": "._sync.backend",
        "open_backend": "._sync.backend",
        "OUTAGE_ERRORS": "._driver",
    },
    globals(),
)

#: Guarantees of the contract this backend cannot give, each with the reason (the
#: conformance suite skips a test marked with one, and says why).
NOT_GUARANTEED: dict[str, str] = {
    "server-clock": (
        "Kafka gives a client no server time to decide by (a record's timestamp is "
        "stamped after the decision): 'now' is the elected scheduler's wall clock "
        "(never going back, across failovers too). Messages are never early by that "
        "clock; when the hosts of two candidates disagree by d, a failover can make a "
        "message up to d early by the first host's clock. A fast put is decided as of "
        "the moment its client sent it, by the client's clock (the scheduler's when "
        "that is later)."
    ),
}


def _load() -> BackendDriver:
    from ._driver import DRIVER  # noqa: PLC0415

    return DRIVER


#: kafka:// as delayq's faces see it (see delayq.durable.descriptor): as amqp://, a
#: long-running consumer stands for election at once.
DESCRIPTOR = BackendDescriptor(
    name="kafka",
    schemes=("kafka",),
    load=_load,
    client=("aiokafka", "msgpack"),
    extra="kafka",
    consumer_options={"scheduler": "on"},
    not_guaranteed=NOT_GUARANTEED,
    replicated=True,
)
