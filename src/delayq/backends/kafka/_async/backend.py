"""The asyncio face of ``kafka://``, written by hand: the source of the generated sync
face (:mod:`delayq.backends.kafka._sync.backend`). The operations are the replicated
backend's; this face adds the URL and Kafka's transport."""

from __future__ import annotations

from typing import Any

from ..._replicated import AsyncReplicatedBackend, LoopLink
from ..._replicated._options import link_options, shard_settings
from .._transport import KafkaTransport
from .._url import Settings, parse

__all__ = ["AsyncKafkaBackend", "open_async_backend"]


class AsyncKafkaBackend(AsyncReplicatedBackend):
    """A face of ``kafka://`` (see :class:`~delayq.durable.backend.AsyncBackend`): each
    operation is one request to the namespace's elected scheduler."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(*[_link(shard) for shard in shard_settings(parse(url, options))])


def _link(settings: Settings) -> LoopLink:
    """The link to one shard's scheduler (a namespace's only one, unless ``shards``)."""
    return LoopLink(lambda: KafkaTransport(settings), **link_options(settings))


def open_async_backend(url: str, **options: Any) -> AsyncKafkaBackend:
    """Open this face of ``kafka://`` (options: see :mod:`delayq.backends.kafka`)."""
    return AsyncKafkaBackend(url, **options)
