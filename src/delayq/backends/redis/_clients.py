"""The redis-py clients of the sharded faces: of one node, or of a cluster (made on first
use), without redis-py's retries (a listener retries itself; scripts are sent again as
:mod:`._resend` says)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from ._resend import (
    async_tracked_client,
    no_retry,
    no_retry_async,
    track_cluster_sends,
    tracked,
    tracked_client,
)
from ._transport import LOST_CONNECTION, client_options
from ._url import Settings

__all__ = ["AsyncListenerClients", "ListenerClients", "async_client", "sync_client"]


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
    """:class:`_Cluster` for asyncio."""

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
        client = _AsyncCluster(startup_nodes=nodes, retry=no_retry_async(), **options)
        return track_cluster_sends(client)
    return async_tracked_client(settings.url, **options)


class ListenerClients:
    """Where the listeners of a backend object get their clients. On a cluster they
    share one client, each BLPOP on a connection of its own from the node's pool: a
    new ``RedisCluster`` reads the slots map (~10 ms of CPU, with the GIL held; on the
    event loop for :class:`AsyncListenerClients`), which a client per shard's listener
    did four times at a consumer's first wait, and again, with new connections,
    whenever a listener started after its lingering. A listener that retires leaves the
    shared client open; the backend object closes it after its listeners, which breaks
    their BLPOPs. A single node's client costs nothing to make: one each, which its
    listener closes (a close breaks its BLPOP)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._shared: Any = None
        self._closed = False
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            if not self._settings.cluster or self._closed:
                return sync_client(self._settings, listener=True)  # its listener's own
            if self._shared is None:
                self._shared = sync_client(self._settings, listener=True)
            return _Borrowed(self._shared)

    def close(self) -> None:
        """Close the shared client (after the listeners were told to stop)."""
        with self._lock:
            self._closed = True
            shared, self._shared = self._shared, None
        if shared is not None:
            with contextlib.suppress(Exception):
                shared.close()


class AsyncListenerClients:
    """:class:`ListenerClients` for asyncio."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._shared: Any = None
        self._closed = False

    def __call__(self) -> Any:
        if not self._settings.cluster or self._closed:
            return async_client(self._settings, listener=True)  # its listener's own
        if self._shared is None:
            self._shared = async_client(self._settings, listener=True)
        return _AsyncBorrowed(self._shared)

    async def aclose(self) -> None:
        """Close the shared client (after the listeners stopped)."""
        self._closed = True
        shared, self._shared = self._shared, None
        if shared is not None:
            with contextlib.suppress(Exception):
                await shared.aclose()


class _Borrowed:
    """A listener's hold on the shared client: its BLPOP, and a close that leaves the
    client to its owner."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def blpop(self, keys: list[bytes], timeout: float) -> Any:
        return self._client.blpop(keys, timeout=timeout)

    def close(self) -> None:
        """The client stays open for the other listeners."""


class _AsyncBorrowed:
    """:class:`_Borrowed` for asyncio (redis-py drops a connection whose BLPOP is
    cancelled, so none goes back to the pool with a reply still to come)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def blpop(self, keys: list[bytes], timeout: float) -> Any:
        return await self._client.blpop(keys, timeout=timeout)

    async def aclose(self) -> None:
        """The client stays open for the other listeners."""
