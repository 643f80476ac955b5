"""``amqp://`` and ``amqps://``: RabbitMQ, with delays replicated, exact to the
millisecond, and cancellable by id (docs/rabbitmq.md).

``amqp://user:pass@host:5672/vhost?prefix=delayq``. Every operation is a request to the
namespace's one elected scheduler (a delayq process: the active consumer of the
single-active-consumer quorum queue ``<prefix>.lock``), which holds the state in
memory, appends what each operation changed to the stream ``<prefix>.log`` (replicated)
and replies once the broker confirmed it. A new scheduler rebuilds the state from the
log. Options, in the URL or as keywords: ``prefix`` (the namespace), ``scheduler``
(``auto``: this object stands for election once it runs a waiting reserve; ``on``; ``off``),
``request_timeout`` (seconds a call waits for a scheduler, default 10),
``retention_bytes`` (the log's size retention, default 20 GB; 0: none, for a namespace
declared before retention; a put that would make the live messages outgrow a quarter
of it is refused with :class:`LogFull`, an ``OSError``), ``fast_put`` (``on``, the
default: ``put()`` with ``on_conflict="ignore"`` appends to the stream
``<prefix>.intake`` itself and returns on its confirm, and the scheduler folds it a
moment later: the same backend object sees it at once, another process once folded;
``off``: every put is a request), ``standby`` (``cold``, the default: a candidate
rebuilds the state from the log once elected; ``hot``: it folds the log while it waits,
holding the whole state as the elected scheduler does, so that a failover reads only
the log's tail; the default of ``delayq scheduler``), ``shards`` (N namespaces
``<prefix>.<k>``, each with its own election and scheduler; a queue's name picks its
shard; default 1) and ``scheduler_shards`` (the shards this object stands for, e.g.
``0,2``; default every one).

The asyncio face: :mod:`._async.backend`; the sync face, generated from it (its calls
go from the caller's thread, a reserve through a private event loop thread):
:mod:`._sync.backend`; the broker's part:
:mod:`._transport`; the generic scheduler: :mod:`delayq.backends._replicated`.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_names
from ...durable.descriptor import BackendDescriptor, BackendDriver

if TYPE_CHECKING:
    from .._replicated import LogFull, NoScheduler, ServerRefused
    from ._async.backend import AsyncAmqpBackend, open_async_backend
    from ._driver import OUTAGE_ERRORS
    from ._sync.backend import AmqpBackend, open_backend

__all__ = [
    "DESCRIPTOR",
    "NOT_GUARANTEED",
    "OUTAGE_ERRORS",
    "AmqpBackend",
    "AsyncAmqpBackend",
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
        "AsyncAmqpBackend": "._async.backend",
        "open_async_backend": "._async.backend",
        "AmqpBackend": "._sync.backend",
        "open_backend": "._sync.backend",
        "OUTAGE_ERRORS": "._driver",
    },
    globals(),
)

#: Guarantees of the contract this backend cannot give, each with the reason (the
#: conformance suite skips a test marked with one, and says why).
NOT_GUARANTEED: dict[str, str] = {
    "server-clock": (
        "AMQP exposes no server time: 'now' is the elected scheduler's wall clock "
        "(never going back, across failovers too). Messages are never early by that "
        "clock; when the hosts of two candidates disagree by d, a failover can make a "
        "message up to d early by the first host's clock. A fast put is decided as of "
        "the moment its client sent it, by the client's clock (the scheduler's when "
        "that is later): a client whose clock is behind by d gets its puts due d "
        "earlier, as its at= puts are."
    ),
}


def _load() -> BackendDriver:
    from ._driver import DRIVER  # noqa: PLC0415

    return DRIVER


#: amqp:// as delayq's faces see it (see delayq.durable.descriptor). Its operations are
#: answered by the namespace's elected scheduler; a long-running consumer stands for
#: election at once (a consumer stands anyway once it waits, and its startup check
#: must not fail on a namespace whose first scheduler it is about to be).
DESCRIPTOR = BackendDescriptor(
    name="amqp",
    schemes=("amqp", "amqps"),
    load=_load,
    client=("aiormq", "pamqp", "msgpack"),
    extra="amqp",
    consumer_options={"scheduler": "on"},
    not_guaranteed=NOT_GUARANTEED,
    replicated=True,
)
