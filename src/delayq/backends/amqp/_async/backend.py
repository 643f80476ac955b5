"""The asyncio face of ``amqp://``, written by hand: the source of the generated sync
face (:mod:`delayq.backends.amqp._sync.backend`). The operations are the replicated
backend's; this face adds the URL and RabbitMQ's transport."""

from __future__ import annotations

from typing import Any

from ..._replicated import AsyncReplicatedBackend, LoopLink
from ..._replicated._options import link_options, shard_settings
from .._transport import AmqpTransport, Hosts
from .._url import Settings, parse

__all__ = ["AsyncAmqpBackend", "open_async_backend"]


class AsyncAmqpBackend(AsyncReplicatedBackend):
    """A face of ``amqp://`` (see :class:`~delayq.durable.backend.AsyncBackend`): each
    operation is one request to the namespace's elected scheduler."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(*[_link(shard) for shard in shard_settings(parse(url, options))])


def _link(settings: Settings) -> LoopLink:
    """The link to one shard's scheduler (a namespace's only one, unless ``shards``)."""
    hosts = Hosts(settings.broker_urls, settings.prefix)
    return LoopLink(lambda: AmqpTransport(settings, hosts), **link_options(settings))


def open_async_backend(url: str, **options: Any) -> AsyncAmqpBackend:
    """Open this face of ``amqp://`` (options: ``prefix``, ``scheduler``,
    ``request_timeout``, ``deliver_exchange``, ``deliver_routing_key``,
    ``retention_bytes``, ``fast_put``, ``standby``, ``shards``, ``scheduler_shards``; see
    :mod:`delayq.backends.amqp`)."""
    return AsyncAmqpBackend(url, **options)
