"""The asyncio face of ``amqp://``, written by hand: the source of the generated sync
face (:mod:`delayq.backends.amqp._sync.backend`). The operations are the replicated
backend's; this face adds the URL and RabbitMQ's transport."""

from __future__ import annotations

from typing import Any

from ..._replicated import AsyncReplicatedBackend, LoopLink
from ..._replicated._options import link_options
from .._transport import AmqpTransport, Hosts
from .._url import parse

__all__ = ["AsyncAmqpBackend", "open_async_backend"]


class AsyncAmqpBackend(AsyncReplicatedBackend):
    """A face of ``amqp://`` (see :class:`~delayq.durable.backend.AsyncBackend`): each
    operation is one request to the namespace's elected scheduler."""

    def __init__(self, url: str, **options: Any) -> None:
        settings = parse(url, options)
        hosts = Hosts(settings.broker_urls, settings.prefix)
        super().__init__(LoopLink(lambda: AmqpTransport(settings, hosts), **link_options(settings)))


def open_async_backend(url: str, **options: Any) -> AsyncAmqpBackend:
    """Open this face of ``amqp://`` (options: ``prefix``, ``scheduler``,
    ``request_timeout``, ``deliver_exchange``, ``deliver_routing_key``,
    ``retention_bytes``, ``fast_put``, ``standby``; see
    :mod:`delayq.backends.amqp`)."""
    return AsyncAmqpBackend(url, **options)
