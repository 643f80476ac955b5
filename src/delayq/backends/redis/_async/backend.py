"""``redis://host:port/db`` (and ``rediss://``): the durable contract on one Redis node.

URLs: ``redis://[user:password@]host[:port][/db][?prefix=...&socket_timeout=...]``;
``rediss://`` for TLS; ``redis+unix://[user:password@]/path/to/redis.sock[?db=N&...]``
for a server on this host reached through its Unix domain socket (no TCP stack: a
shorter round trip). Options (keyword arguments of ``Queue``/``AsyncQueue``, or URL
parameters): ``prefix`` (default ``"delayq"``), the start of every key. Other URL
parameters are redis-py's own (``socket_timeout``, ``max_connections``, ...: the list
is :func:`.._url.url_options`); any other is :class:`~delayq.errors.UnsupportedURL`.

Data, per queue shard (``<prefix>:{<queue>:<shard>}:...``, one hash tag, so one cluster
slot; a single-node queue is shard 0):

* ``msg``: a hash, message id -> the record, packed with cmsgpack (one hash per queue:
  measured at a third of the memory of a hash per message);
* ``due``: a sorted set of scheduled messages, score = due time (epoch ms), member = the
  8-byte big-endian ``seq`` followed by the id, so members of equal score sort by put
  order: FIFO among equal due times is exact;
* ``lease``: a sorted set of active messages scored by lease expiry; ``dead``: a sorted
  set of dead messages scored by ``seq``; ``seq``: the queue's counter; ``wake``: the
  wake-up marker (see :mod:`.._listen`).

Every operation is one Lua script (:mod:`.._scripts`, ``scripts/*.lua``), each the mirror
of a pure transition of :mod:`delayq.durable.message`; "now" is Redis's ``TIME`` read in
the script, so the client's clock plays no part. Expired leases are settled inside the
scripts (the reserve script first of all), so no separate process is needed. The
scripts run as functions of one library (``FCALL``; :mod:`.._functions`), loaded when the
server does not have it, so the shared prelude is compiled once per server.

The face is written once, for asyncio, in ``_async/backend.py``; its sync twin,
``_sync/backend.py``, is generated from it by ``scripts/unasync.py``. Connections: the
sync face runs the scripts on one connection per thread, the async face on one
pipelined connection per event loop (:mod:`.._link`, and its asyncio counterpart),
redis-py's pool without redis-py's retries where those do not apply (both under the one
retry rule of :mod:`.._resend`); on both a failed connect or send is
retried with backoff (a connect that timed out is not: the server is unreachable), a
lost reply only for scripts that are safe to run twice, and any other script whose
reply is lost raises :class:`~delayq.errors.OutcomeUnknown` (as redis-py's
``ConnectionError`` or ``TimeoutError`` subclass ``ReplyLost`` / ``ReplyTimeout``);
a reply waits at most the socket timeout, a connect the connect timeout
(:data:`.._settings.REDIS_SOCKET_TIMEOUT` and ``REDIS_CONNECT_TIMEOUT`` unless the URL
says otherwise), so no call waits on a silent server for longer; plus, per queue with
a waiting consumer, one listener connection that blocks on the wake-up
marker. Durability is Redis's: with ``appendonly yes`` and ``appendfsync always`` an
acknowledged put survives a crash of the server; with the defaults the last second of
writes may be lost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from ...._log import LOGGER_NAME
from ....durable.inspection import merge_peek
from ....durable.message import Claimed, Position, PutRequest, Record, State, Stats
from ....durable.reserves import AsyncReserves
from ....errors import QueueClosed
from .._claims import AsyncClaims
from .._clients import async_blocking
from .._functions import AsyncFunctions
from .._link_async import AsyncLink
from .._listen import AsyncListener, log_lost, next_backoff
from .._ops import Call, Operations
from .._refused import AsyncFirstUse
from .._resend import async_tracked_client
from .._scripts import Claim
from .._settings import REDIS_FIRE_AHEAD_MS, REDIS_RECONNECT_FIRST
from .._transport import (
    CONNECTION_ERRORS,
    async_connection_settings,
    client_options,
)
from .._url import Settings, parse_url
from .._waiting import expired, sleep_for

__all__ = ["AsyncRedisBackend"]

T = TypeVar("T")
logger = logging.getLogger(LOGGER_NAME)


class AsyncRedisBackend(AsyncReserves):
    """A face of ``redis://`` on one node (see :class:`~delayq.durable.backend.AsyncBackend`).

    Creating it does no I/O; it connects on first use. Its scripts run on a link (one
    connection per thread on the sync face, one pipelined connection per event loop on
    the asyncio face), and a waiting reserve listens on one connection per queue. A
    reserve cancelled while it waits claims nothing; one cancelled while its claim is on
    the wire gives back what the claim took, as soon as the reply comes
    (:mod:`.._claims`). Another operation cancelled while on the wire may still take
    effect.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self._settings: Settings = parse_url(url, **options)
        self._first = AsyncFirstUse(url, self._settings)
        self._ops = Operations(self._settings.prefix)
        self._closed = False
        # No retries in redis-py: the scripts are sent again as _resend.py says.
        options = client_options(listener=False)
        self._client = async_tracked_client(self._settings.url, **options)
        self._scripts = AsyncFunctions(self._client)
        self._link = AsyncLink(
            *async_connection_settings(self._settings.url, **options), self._scripts
        )
        self._listeners: dict[str, AsyncListener] = {}
        self._lock = threading.Lock()  # never held across an await
        self._claims = AsyncClaims(self._give_back)
        #: See delayq.durable.backend.AsyncFiresAhead.
        self.fire_ahead_ms = REDIS_FIRE_AHEAD_MS

    @property
    def prefix(self) -> str:
        """The key prefix of this backend's queues."""
        return self._settings.prefix

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed("the queue is closed")

    @property
    def client(self) -> Any:
        """The redis-py client (its pool serves the EVALSHA fallback and ``queues()``;
        on the asyncio face, RESP3 too)."""
        return self._client

    async def _run(self, call: Call[T]) -> T:
        self._check_open()
        try:
            if self._first.answered:
                reply = await self._link(call.script, call.keys, call.args)
            else:  # a failure that says the server cannot be used is ServerRefused
                async with self._first:
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

            with self._lock:
                self._check_open()
                listener = self._listeners.get(queue)
                if listener is None:
                    listener = AsyncListener(
                        async_blocking(self._settings.url),
                        self._ops.wake_key(queue),
                        rewake,
                    )
                    self._listeners[queue] = listener
        return listener

    def _bump(self, queue: str) -> None:
        listener = self._listeners.get(queue)
        if listener is not None:
            listener.bump()

    async def _claim(self, queue: str, limit: int, lease_ms: int, ahead_ms: int = 0) -> Claim:
        """One claim that is never lost (:mod:`.._claims`)."""
        claiming = self._run(self._ops.claim(queue, limit, lease_ms, ahead_ms=ahead_ms))
        return await self._claims.claim(claiming, queue)

    async def _give_back(self, queue: str, records: list[Record]) -> None:
        """Give back what a cancelled claim took (``release.lua``), even while closing."""
        call = self._ops.unclaim(queue, records)
        try:
            await self._link(call.script, call.keys, call.args)
        except CONNECTION_ERRORS as exc:  # the leases will expire instead
            logger.warning("could not release %d claimed messages: %s", len(records), exc)
        self._bump(queue)

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>` (``outcome`` is a hint this
        backend does not need: it always decides before it returns)."""
        woke, kept = await self._run(self._ops.put(queue, requests))
        if woke:
            self._bump(queue)
        return kept

    async def _reserve(
        self, queue: str, limit: int, lease_ms: int, wait: float | None, ahead_ms: int
    ) -> Claimed:
        claim = await self._claim_waiting(queue, limit, lease_ms, wait, ahead_ms)
        return Claimed(claim.records, claim.now_ms * 1000 + claim.now_us, claim.arrived)

    async def _claim_waiting(
        self, queue: str, limit: int, lease_ms: int, wait: float | None, ahead_ms: int
    ) -> Claim:
        if wait == 0:
            return await self._claim(queue, limit, lease_ms)
        give_up = None if wait is None else time.monotonic() + wait
        listener = self._listener(queue)
        backoff = REDIS_RECONNECT_FIRST
        with listener.session():
            while True:
                generation = listener.generation
                try:
                    claim = await self._claim(queue, limit, lease_ms, ahead_ms)
                except CONNECTION_ERRORS as exc:
                    if expired(give_up):
                        raise
                    log_lost("reserve lost Redis", exc, backoff)
                    await listener.wait(listener.generation, backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if claim.records or expired(give_up):
                    return claim
                await listener.wait(generation, sleep_for(claim, give_up, ahead_ms))
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
        if self._first.answered:
            return await self._scripts.queues(self.prefix)
        async with self._first:
            return await self._scripts.queues(self.prefix)

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
        await self._claims.settle()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            listeners = list(self._listeners.values())
        for listener in listeners:
            await listener.close()
        await self._link.aclose()
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self._client.aclose()
