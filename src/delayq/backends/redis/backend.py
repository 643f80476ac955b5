"""``redis://host:port/db`` (and ``rediss://``): the durable contract on one Redis node.

URLs: ``redis://[user:password@]host[:port][/db][?prefix=...&socket_timeout=...]``;
``rediss://`` for TLS; ``redis+unix://[user:password@]/path/to/redis.sock[?db=N&...]``
for a server on this host reached through its Unix domain socket (no TCP stack: a
shorter round trip). Options (keyword arguments of ``Queue``/``AsyncQueue``, or URL
parameters): ``prefix`` (default ``"delayq"``), the start of every key. Other URL
parameters are redis-py's own (``socket_timeout``, ``max_connections``, ...).

Data, per queue shard (``<prefix>:{<queue>:<shard>}:...``, one hash tag, so one cluster
slot; a single-node queue is shard 0):

* ``msg``: a hash, message id -> the record, packed with cmsgpack (one hash per queue:
  measured at a third of the memory of a hash per message);
* ``due``: a sorted set of scheduled messages, score = due time (epoch ms), member = the
  8-byte big-endian ``seq`` followed by the id, so members of equal score sort by put
  order: FIFO among equal due times is exact;
* ``lease``: a sorted set of active messages scored by lease expiry; ``dead``: a sorted
  set of dead messages scored by ``seq``; ``seq``: the queue's counter; ``wake``: the
  wake-up marker (see :mod:`._listen`).

Every operation is one Lua script (:mod:`._scripts`, ``scripts/*.lua``), each the mirror
of a pure transition of :mod:`delayq.durable.message`; "now" is Redis's ``TIME`` read in
the script, so the client's clock plays no part. Expired leases are settled inside the
scripts (the reserve script first of all), so no separate process is needed. The
scripts run as functions of one library (``FCALL``; :mod:`._functions`), loaded when the
server does not have it, so the shared prelude is compiled once per server.

Connections: the sync face runs the scripts on one connection per thread
(:mod:`._link`), the async face on one pipelined connection per event loop
(:mod:`._link_async`), redis-py's pool without redis-py's retries (:mod:`._resend`)
where those do not apply; on both a failed connect or send is retried with backoff, a lost
reply only for scripts that are safe to run twice; plus, per queue
with a waiting consumer, one listener connection that blocks on the wake-up marker. Durability is
Redis's: with ``appendonly yes`` and ``appendfsync always`` an acknowledged put survives
a crash of the server; with the defaults the last second of writes may be lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from ..._constants import LOGGER_NAME
from ...durable.inspection import merge_peek
from ...durable.message import Position, PutRequest, Record, State, Stats
from ...errors import QueueClosed
from ._functions import AsyncFunctions, Functions
from ._link import Link
from ._link_async import AsyncLink
from ._listen import AsyncListener, Listener, log_lost, next_backoff
from ._ops import Call, Operations
from ._resend import tracked_client
from ._scan import scan_queues, scan_queues_async
from ._scripts import Claim
from ._settings import (
    REDIS_RECONNECT_FIRST,
)
from ._transport import (
    CONNECTION_ERRORS,
    AsyncBlocking,
    Blocking,
    client_options,
    connection_settings,
)
from ._url import Settings, parse_url
from ._waiting import expired, sleep_for

__all__ = ["AsyncRedisBackend", "RedisBackend"]

T = TypeVar("T")
logger = logging.getLogger(LOGGER_NAME)


class _Base:
    """What both faces hold: the settings, the operations, the listeners, the flag."""

    def __init__(self, url: str, **options: Any) -> None:
        self._settings: Settings = parse_url(url, **options)
        self._ops = Operations(self._settings.prefix)
        self._closed = False

    @property
    def prefix(self) -> str:
        """The key prefix of this backend's queues."""
        return self._settings.prefix

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed("the queue is closed")

    def _listener_settings(self) -> tuple[Any, dict[str, Any]]:
        """The settings of a listener's connection (its own timeouts)."""
        return connection_settings(
            self._settings.url,
            asynchronous=isinstance(self, AsyncRedisBackend),
            **client_options(listener=True),
        )


# -- the sync face ---------------------------------------------------------------------


class RedisBackend(_Base):
    """The sync face of ``redis://`` (see :class:`~delayq.durable.backend.Backend`).

    Safe to share between threads: each thread runs its scripts on a connection of its
    own (:mod:`._link`), and a waiting reserve listens on one connection per queue.
    Creating it does no I/O; it connects on first use.
    """

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        # No retries in redis-py: they would resend a script whose reply was lost.
        options = client_options(listener=False)
        self._client = tracked_client(self._settings.url, asynchronous=False, **options)
        self._scripts = Functions(self._client)
        self._link = Link(
            *connection_settings(self._settings.url, asynchronous=False, **options),
            self._scripts,
        )
        self._listeners: dict[str, Listener] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The redis-py client (its pool serves the EVALSHA fallback and ``queues()``)."""
        return self._client

    def _run(self, call: Call[T]) -> T:
        self._check_open()
        try:
            reply = self._link(call.script, call.keys, call.args)
        except CONNECTION_ERRORS:
            self._check_open()
            raise
        return call.decode(reply)

    def _listener(self, queue: str) -> Listener:
        listener = self._listeners.get(queue)
        if listener is None:
            with self._lock:
                self._check_open()
                listener = self._listeners.get(queue)
                if listener is None:
                    listener = Listener(
                        functools.partial(Blocking, *self._listener_settings()),
                        self._ops.wake_key(queue),
                        lambda: self._run(self._ops.wake(queue)),
                    )
                    self._listeners[queue] = listener
        return listener

    def _bump(self, queue: str) -> None:
        listener = self._listeners.get(queue)
        if listener is not None:
            listener.bump()

    def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        woke, kept = self._run(self._ops.put(queue, requests))
        if woke:
            self._bump(queue)
        return kept

    def reserve(self, queue: str, *, limit: int, lease_ms: int, wait: float | None) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        if wait == 0:
            return self._run(self._ops.claim(queue, limit, lease_ms)).records
        give_up = None if wait is None else time.monotonic() + wait
        listener = self._listener(queue)
        backoff = REDIS_RECONNECT_FIRST
        with listener.session():
            while True:
                generation = listener.generation
                try:
                    claim = self._run(self._ops.claim(queue, limit, lease_ms))
                except CONNECTION_ERRORS as exc:
                    if expired(give_up):
                        raise
                    log_lost("reserve lost Redis", exc, backoff)
                    listener.wait(listener.generation, backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if claim.records or expired(give_up):
                    return claim.records
                listener.wait(generation, sleep_for(claim, give_up))
                self._check_open()

    def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        self._run(self._ops.ack(queue, id, token))

    def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`."""
        return [items[i][0] for i in self._run(self._ops.ack_many(queue, items))]

    def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`Backend.nack <delayq.durable.backend.Backend.nack>`."""
        state = self._run(self._ops.nack(queue, id, token, delay_ms, error, dead=dead))
        if state is State.SCHEDULED:
            self._bump(queue)
        return state

    def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        self._run(self._ops.release(queue, id, token))
        self._bump(queue)

    def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return self._run(self._ops.extend(queue, id, token, lease_ms))

    def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return self._run(self._ops.cancel(queue, id))

    def reschedule(self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        moved = self._run(self._ops.reschedule(queue, id, delay_ms, at_ms))
        if moved:
            self._bump(queue)
        return moved

    def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return self._run(self._ops.get(queue, id))

    def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return self._run(self._ops.stats(queue))

    def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>`."""
        return self._run(self._ops.dead(queue, limit, after_seq))

    def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        revived = self._run(self._ops.retry_dead(queue, ids))
        if revived:
            self._bump(queue)
        return revived

    def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return self._run(self._ops.purge(queue, state))

    def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        self._check_open()
        return scan_queues(self._client, self.prefix)

    def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        records = self._run(self._ops.peek(queue, state, limit, after))
        return merge_peek([records], state, limit)

    def due_counts(self, queue: str, *, horizon_ms: int, buckets: int) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        return self._run(self._ops.due_counts(queue, horizon_ms, buckets))

    def close(self) -> None:
        """See :meth:`Backend.close <delayq.durable.backend.Backend.close>`; the
        messages stay in Redis."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            listeners = list(self._listeners.values())
        for listener in listeners:
            listener.close()
        self._link.close()
        self._client.close()


# -- the async face --------------------------------------------------------------------


class AsyncRedisBackend(_Base):
    """The asyncio face of ``redis://`` (see :class:`~delayq.durable.backend.AsyncBackend`).

    Creating it does no I/O: it connects on first use, on the loop that uses it. A
    reserve cancelled while it waits claims nothing; one cancelled while its claim is
    on the wire gives back what the claim took, as soon as the reply comes. Another
    operation cancelled while on the wire may still take effect.
    """

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        # No retries in redis-py: the scripts are sent again as _resend.py says.
        options = client_options(listener=False)
        self._client = tracked_client(self._settings.url, asynchronous=True, **options)
        self._scripts = AsyncFunctions(self._client)
        self._link = AsyncLink(
            *connection_settings(self._settings.url, asynchronous=True, **options),
            self._scripts,
        )
        self._listeners: dict[str, AsyncListener] = {}
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def client(self) -> Any:
        """The redis-py asyncio client (its pool serves RESP3, the EVALSHA fallback and
        ``queues()``)."""
        return self._client

    async def _run(self, call: Call[T]) -> T:
        self._check_open()
        try:
            reply = await self._link(call.script, call.keys, call.args)
        except CONNECTION_ERRORS:
            self._check_open()
            raise
        return call.decode(reply)

    def _listener(self, queue: str) -> AsyncListener:
        listener = self._listeners.get(queue)
        if listener is None:

            async def rewake() -> None:
                await self._run(self._ops.wake(queue))

            listener = AsyncListener(
                functools.partial(AsyncBlocking, *self._listener_settings()),
                self._ops.wake_key(queue),
                rewake,
            )
            self._listeners[queue] = listener
        return listener

    def _bump(self, queue: str) -> None:
        listener = self._listeners.get(queue)
        if listener is not None:
            listener.bump()

    async def _claim(self, queue: str, limit: int, lease_ms: int) -> Claim:
        """One claim that is never lost: if the caller is cancelled while the script
        runs, what it claimed is released once its reply is in."""
        task = asyncio.ensure_future(self._run(self._ops.claim(queue, limit, lease_ms)))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda done: self._unclaim_later(queue, done))
            raise

    def _unclaim_later(self, queue: str, done: asyncio.Future[Claim]) -> None:
        if done.cancelled() or done.exception() is not None or not done.result().records:
            return
        unclaim = asyncio.ensure_future(self._unclaim(queue, done.result().records))
        self._background.add(unclaim)
        unclaim.add_done_callback(self._background.discard)

    async def _unclaim(self, queue: str, records: list[Record]) -> None:
        """Give back what a cancelled claim took (``release.lua``), even while closing."""
        call = self._ops.unclaim(queue, records)
        try:
            await self._link(call.script, call.keys, call.args)
        except CONNECTION_ERRORS as exc:  # the leases will expire instead
            logger.warning("could not release %d claimed messages: %s", len(records), exc)
        self._bump(queue)

    async def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        woke, kept = await self._run(self._ops.put(queue, requests))
        if woke:
            self._bump(queue)
        return kept

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        if wait == 0:
            return (await self._claim(queue, limit, lease_ms)).records
        give_up = None if wait is None else time.monotonic() + wait
        listener = self._listener(queue)
        backoff = REDIS_RECONNECT_FIRST
        with listener.session():
            while True:
                generation = listener.generation
                try:
                    claim = await self._claim(queue, limit, lease_ms)
                except CONNECTION_ERRORS as exc:
                    if expired(give_up):
                        raise
                    log_lost("reserve lost Redis", exc, backoff)
                    await listener.wait(listener.generation, backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if claim.records or expired(give_up):
                    return claim.records
                await listener.wait(generation, sleep_for(claim, give_up))
                self._check_open()

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        await self._run(self._ops.ack(queue, id, token))

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`."""
        return [items[i][0] for i in await self._run(self._ops.ack_many(queue, items))]

    async def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`Backend.nack <delayq.durable.backend.Backend.nack>`."""
        state = await self._run(self._ops.nack(queue, id, token, delay_ms, error, dead=dead))
        if state is State.SCHEDULED:
            self._bump(queue)
        return state

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        await self._run(self._ops.release(queue, id, token))
        self._bump(queue)

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return await self._run(self._ops.extend(queue, id, token, lease_ms))

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return await self._run(self._ops.cancel(queue, id))

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        moved = await self._run(self._ops.reschedule(queue, id, delay_ms, at_ms))
        if moved:
            self._bump(queue)
        return moved

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return await self._run(self._ops.get(queue, id))

    async def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return await self._run(self._ops.stats(queue))

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>`."""
        return await self._run(self._ops.dead(queue, limit, after_seq))

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        revived = await self._run(self._ops.retry_dead(queue, ids))
        if revived:
            self._bump(queue)
        return revived

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return await self._run(self._ops.purge(queue, state))

    async def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        self._check_open()
        return await scan_queues_async(self._client, self.prefix)

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        records = await self._run(self._ops.peek(queue, state, limit, after))
        return merge_peek([records], state, limit)

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        return await self._run(self._ops.due_counts(queue, horizon_ms, buckets))

    async def close(self) -> None:
        """See :meth:`Backend.close <delayq.durable.backend.Backend.close>`; the
        messages stay in Redis."""
        if self._closed:
            return
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self._closed = True
        for listener in list(self._listeners.values()):
            await listener.close()
        await self._link.aclose()
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self._client.aclose()
