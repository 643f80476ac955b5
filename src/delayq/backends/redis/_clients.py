"""The redis-py clients of the sharded faces: of one node, or of a cluster (made on first
use), without redis-py's retries (a listener retries itself; scripts are sent again as
:mod:`._resend` says)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from ._io._async.blpop import AsyncBlocking
from ._io._sync.blpop import Blocking
from ._resend import (
    async_tracked_client,
    no_retry,
    no_retry_async,
    tracked,
    tracked_client,
)
from ._transport import (
    LOST_CONNECTION,
    async_connection_settings,
    client_options,
    connection_settings,
)
from ._url import Settings

__all__ = [
    "AsyncListenerClients",
    "ListenerClients",
    "async_blocking",
    "async_client",
    "blocking",
    "sync_client",
]


@contextlib.contextmanager
def _unreachable_as_connection_error() -> Iterator[None]:
    """redis-py's "Redis Cluster cannot be connected" (no node answered while it read
    the slots; the last node's error is its cause) as the ``ConnectionError`` it is, so
    the retry loops of the listeners and waiting reserves handle it like any lost
    connection instead of dying of it. Any other cluster error passes as it is."""
    try:
        yield
    except redis.exceptions.RedisClusterException as exc:
        if isinstance(exc.__cause__, LOST_CONNECTION):
            raise redis.ConnectionError(str(exc)) from exc
        raise


class _Cluster(redis.cluster.RedisCluster):
    """A ``RedisCluster`` whose unreachable cluster raises ``ConnectionError``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _unreachable_as_connection_error():
            super().__init__(*args, **kwargs)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """See ``RedisCluster.execute_command``."""
        with _unreachable_as_connection_error():
            return super().execute_command(*args, **kwargs)  # type: ignore[no-untyped-call]


class _AsyncCluster(redis.asyncio.cluster.RedisCluster):
    """:class:`_Cluster` for asyncio, made with a ``connection_class`` as the sync one.

    redis-py's asyncio ``RedisCluster`` takes no ``connection_class`` (its sync twin
    does): it makes each node it finds in the cluster's map from the keyword arguments
    that its public ``get_connection_kwargs()`` returns, so the class is set there, in
    the constructor, before anything connects. That is what delayq relies on here; a
    test checks that a script written to each master is seen as written
    (``tests/backends/test_redis_cluster.py``), run at both ends of the supported
    redis-py range (``make test-redis-low``)."""

    def __init__(self, *args: Any, connection_class: type[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.get_connection_kwargs()["connection_class"] = connection_class

    async def initialize(self, *args: Any, **kwargs: Any) -> Any:
        """See ``RedisCluster.initialize``."""
        with _unreachable_as_connection_error():
            return await super().initialize(*args, **kwargs)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """See ``RedisCluster.execute_command``."""
        with _unreachable_as_connection_error():
            return await super().execute_command(*args, **kwargs)


class _LazyCluster:
    """A :class:`_Cluster` made on its first use, and made again on the next use after
    that failed. redis-py's sync cluster client reads the slots as it is made, so a
    queue opened while the cluster is down would fail at once, where a single node's
    client (and the asyncio cluster client) connects on first use and a waiting reserve
    retries until the server is back."""

    def __init__(self, make: Callable[[], _Cluster]) -> None:
        self._make = make
        self._client: _Cluster | None = None
        self._lock = threading.Lock()

    def _made(self) -> _Cluster:
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    client = self._client = self._make()
        return client

    def initialize(self) -> None:
        """Make the client (it reads the cluster's slots), if not made yet."""
        self._made()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    def close(self) -> None:
        """Close the client, if it was made."""
        if self._client is not None:
            self._client.close()


def _credentials(settings: Settings) -> dict[str, Any]:
    """The user name and password of a ``redis+cluster://`` URL, as redis-py reads a
    ``redis://`` URL's (a lone userinfo is a user name)."""
    parts = urlsplit(settings.url)
    found = {"username": parts.username, "password": parts.password}
    return {key: unquote(value) for key, value in found.items() if value}


def sync_client(settings: Settings, *, listener: bool) -> Any:
    """A redis-py client of the settings' node or cluster, without redis-py's retries
    (a listener retries itself; scripts are sent again as :mod:`._resend` says)."""
    options = client_options(listener)
    if settings.cluster:
        nodes = [
            redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
            for host, port in settings.nodes
        ]
        # Given a URL, RedisCluster makes its nodes' pools with our connection class.
        host, port = settings.nodes[0]
        first = f"redis://{f'[{host}]' if ':' in host else host}:{port}"
        return _LazyCluster(
            lambda: _Cluster(
                url=first,
                startup_nodes=nodes[1:],
                retry=no_retry(),
                connection_class=tracked(redis.Connection),
                **_credentials(settings),
                **options,
            )
        )
    return tracked_client(settings.url, **options)


def async_client(settings: Settings, *, listener: bool) -> Any:
    """:func:`sync_client` for asyncio."""
    options = client_options(listener)
    if settings.cluster:
        nodes = [
            redis.asyncio.cluster.ClusterNode(
                host, port, connection_class=tracked(redis.asyncio.Connection)
            )
            for host, port in settings.nodes
        ]
        return _AsyncCluster(
            startup_nodes=nodes,
            retry=no_retry_async(),
            connection_class=tracked(redis.asyncio.Connection),
            **_credentials(settings),
            **options,
        )
    return async_tracked_client(settings.url, **options)


def blocking(url: str) -> Callable[[], Blocking]:
    """What makes a single-node listener's connection of its own (:class:`Blocking`,
    no redis-py client: made from the settings of ``url``)."""
    return functools.partial(Blocking, *connection_settings(url, **client_options(True)))


def async_blocking(url: str) -> Callable[[], AsyncBlocking]:
    """:func:`blocking` for asyncio."""
    settings = async_connection_settings(url, **client_options(True))
    return functools.partial(AsyncBlocking, *settings)


class ListenerClients:
    """Where the listeners of a sync backend object get their clients: one each, made
    and closed by its thread (a cluster's reads the slots in that thread). Not one
    shared, as the asyncio face's: redis-py 6.2's sync cluster client is not safe to
    (re)read its map from several threads at once (under a cluster restart a listener
    died of "cannot be connected ... None" while another thread read it)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def __call__(self) -> Any:
        return sync_client(self._settings, listener=True)

    def close(self) -> None:
        """Nothing to close: each listener closes its own."""


class AsyncListenerClients:
    """:class:`ListenerClients` for asyncio. On a cluster the listeners of a backend
    object share one client (each BLPOP on a connection of its own, from the node's
    pool): a new ``RedisCluster`` reads the slots map on the event loop, ~10 ms of CPU,
    which a client per shard's listener, made again each time a listener starts after
    its lingering, took from every coroutine of the loop at a consumer's first wait
    (a loop stalled for a whole second on a loaded machine). A single node's client
    costs nothing to make: one each, as the sync face."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._shared: Any = None

    def __call__(self) -> Any:
        if not self._settings.cluster:
            return async_client(self._settings, listener=True)
        if self._shared is None:
            self._shared = async_client(self._settings, listener=True)
        return _Borrowed(self._shared)

    async def aclose(self) -> None:
        """Close the shared client (after the listeners stopped)."""
        shared, self._shared = self._shared, None
        if shared is not None:
            with contextlib.suppress(Exception):
                await shared.aclose()


class _Borrowed:
    """A listener's hold on the shared client: its BLPOP, and a close that leaves the
    client to its owner (a cancelled BLPOP's connection is dropped by redis-py)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def blpop(self, keys: list[bytes], timeout: float) -> Any:
        return await self._client.blpop(keys, timeout=timeout)

    async def aclose(self) -> None:
        """The client stays open for the other listeners."""
