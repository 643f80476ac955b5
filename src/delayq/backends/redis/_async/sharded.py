"""Sharded queues: ``redis+cluster://host:port[,host:port...]`` and ``shards=N``.

``Queue(url, shards=N)`` (or ``?shards=N`` in the URL) spreads one logical queue over
``N`` hash tags ``{<queue>:0}`` ... ``{<queue>:N-1}``, each a complete single-shard
queue (the same keys and scripts as :mod:`.backend`), so on a Redis Cluster the shards
land on different masters. It works on a single node too (``redis://...?shards=4``);
``redis+cluster://`` with ``shards=1`` is one shard on a cluster. Every script still
touches one shard's keys only.

* Message ``id`` lives in shard ``crc32(id) % N`` (:func:`.._shards.shard_of`, stable
  across processes and versions), so ack/nack/extend/release/cancel/reschedule/get by
  id are one script on one shard.
* ``seq`` (the FIFO tie-break) comes from one queue-wide counter, shard 0's ``seq`` key,
  with one ``INCRBY`` before a nack, reschedule or retry_dead (when ``N > 1``); a put
  takes its seqs with shard 0's clock (``take_seqs.lua``) and resolves every due time
  of its batch against that one now, so its parts on other shards keep put order.
* A put batch is one script per shard it touches; when it spans shards and may conflict,
  every shard first checks its part (``put.lua`` in check mode) before any writes, so
  a duplicate stores nothing. Only a conflicting put racing between the check and the
  write can leave such a batch partly stored (the contract's all-or-nothing holds per
  shard).
* reserve claims from the shard with the earliest due message and tops up from the
  next ones, keeping global due order (see :mod:`.._shards`); a waiting reserve listens
  on every shard's wake-up marker.
* stats, dead, retry_dead, purge, peek and due_counts run on every shard and merge the
  results (each shard's part is atomic; the whole is not one snapshot); queues scans
  every master. retry_dead revives each shard's dead messages in the order they died,
  one shard after the other: across shards that order is not kept.

Options: those of :mod:`.backend`, plus ``shards`` (1 to 1024; default 1). The same
queue must always be opened with the same ``shards``: messages of other shards would not
be found. A cluster URL's nodes are startup nodes; redis-py's ``RedisCluster`` follows
slot moves. A cluster URL takes delayq's options alone (``prefix``, ``shards``): its
clients are made from its nodes, with no other parameter of redis-py. Scripts run as
library functions on a single node and by EVALSHA on a cluster (see :mod:`.._functions`).

The faces are written once for asyncio, in ``_async/sharded.py``; the sync one,
``_sync/sharded.py``, is generated from it by ``scripts/unasync.py``. What both share is
:mod:`.._sharded`, the shard views and merges :mod:`.._shards`, where waiting reserves
sleep :mod:`.._hub`, the redis-py clients :mod:`.._clients`.

A claim spread over several shards is safe against cancellation: what earlier shards
gave a reserve cancelled later is given back (:mod:`.._claims`). A cluster client loads
its map of the cluster before its first command (:meth:`AsyncShardedRedisBackend._ready`):
redis-py's asyncio ``RedisCluster`` loads it lazily, and a command given to it before
then is routed as if it had no key, to one node, which answers ``MOVED``; redis-py's
handling of ``MOVED`` then disconnects pooled connections that other tasks have just
taken, so several tasks starting at once saw "Connection closed by server" on a healthy
cluster (a put failed, a claim was lost). The sync cluster client is made there too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from ...._log import LOGGER_NAME
from ....durable.inspection import merge_peek
from ....durable.message import Claimed, Position, PutRequest, Record, State, Stats
from ....durable.reserves import AsyncReserves
from .._claims import AsyncClaims
from .._clients import AsyncListenerClients, async_client
from .._functions import AsyncFunctions
from .._hub import AsyncHub
from .._listen import AsyncListener, log_lost, next_backoff
from .._ops import Call
from .._refused import AsyncFirstUse
from .._settings import REDIS_FIRE_AHEAD_MS, REDIS_RECONNECT_FIRST
from .._sharded import ShardedBase
from .._shards import (
    ShardView,
    merge_dead,
    merge_due_counts,
    merge_stats,
    shard_of,
    sort_claimed,
)
from .._transport import CONNECTION_ERRORS
from .._waiting import HAIR, expired

__all__ = ["AsyncShardedRedisBackend"]

T = TypeVar("T")
logger = logging.getLogger(LOGGER_NAME)


class AsyncShardedRedisBackend(ShardedBase, AsyncReserves):
    """A face of a sharded queue (see the module docstring)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._client = async_client(self._settings, listener=False)
        self._scripts = AsyncFunctions(self._client, cluster=self._settings.cluster)
        self._hubs: dict[str, AsyncHub] = {}
        self._lock = threading.Lock()  # never held across an await
        self._claims = AsyncClaims(self._give_back)
        #: See delayq.durable.backend.AsyncFiresAhead.
        self.fire_ahead_ms = REDIS_FIRE_AHEAD_MS
        self._listen_clients = AsyncListenerClients(self._settings)
        #: The cluster's map is loaded (a later reload is redis-py's own, with a default
        #: node to route by meanwhile); a single node needs none.
        self._mapped = not self._settings.cluster
        self._first = AsyncFirstUse(url, self._settings)

    @property
    def client(self) -> Any:
        """The redis-py client (``Redis`` or ``RedisCluster``)."""
        return self._client

    async def _ready(self) -> Any:
        """The client, with the cluster's map loaded (see the module docstring); a
        single-node client as is. Until the server answered once, a PING too: a
        failure of either is ServerRefused (:mod:`.._refused`)."""
        if not self._first.answered:
            async with self._first:
                if not self._mapped:
                    await self._client.initialize()
                    self._mapped = True
                await self._client.ping()
        if not self._mapped:
            await self._client.initialize()
            self._mapped = True
        return self._client

    async def _run(self, call: Call[T]) -> T:
        self._check_open()
        try:
            await self._ready()
            reply = await self._scripts(call.script, call.keys, call.args)
        except CONNECTION_ERRORS:
            self._check_open()
            raise
        return call.decode(reply)

    async def _seq_base(self, queue: str, count: int) -> int | None:
        if self.shards == 1:
            return None
        self._check_open()
        key = self._ops[0].seq_key(queue)
        await self._ready()
        # Sent again after a lost reply: the seqs of the lost run are skipped (harmless).
        return int(await self._scripts.command("INCRBY", key, count)) - count

    async def _dead_count(self, queue: str, shard: int) -> int:
        key = self._ops[shard].dead_key(queue)
        await self._ready()
        return int(await self._scripts.command("ZCARD", key))

    def _hub(self, queue: str) -> AsyncHub:
        hub = self._hubs.get(queue)
        if hub is None:
            with self._lock:
                self._check_open()
                hub = self._hubs.get(queue)
                if hub is None:
                    hub = AsyncHub(ShardView(self.shards))
                    for ops in self._ops:
                        hub.listeners.append(
                            AsyncListener(
                                self._listen_clients,
                                ops.wake_key(queue),
                                functools.partial(self._run, ops.wake(queue)),
                                functools.partial(hub.news, ops.shard),
                            )
                        )
                    self._hubs[queue] = hub
        return hub

    async def _claim_all(
        self,
        queue: str,
        view: ShardView,
        limit: int,
        lease_ms: int,
        stop: list[bool],
        *,
        ahead_ms: int,
    ) -> list[Record]:
        records: list[Record] = []
        for _ in range(2 * self.shards + 2):
            if stop[0]:  # the caller was cancelled: send nothing more
                break
            for shard in view.unknown():  # news may come in between: bound by fresh heads
                epoch = view.epochs[shard]
                claim = await self._run(self._ops[shard].claim(queue, 0, lease_ms))
                view.learn(shard, claim, epoch)
            pick = None if stop[0] else view.pick()
            if pick is None:
                break
            shard, bound = pick
            epoch = view.epochs[shard]
            call = self._ops[shard].claim(queue, limit - len(records), lease_ms, bound)
            claim = await self._claims.claim(self._run(call), queue)
            view.learn(shard, claim, epoch)
            records += claim.records
            if len(records) >= limit:
                break
        if not records and ahead_ms and not stop[0]:
            # Nothing due: fire ahead on the shard whose head falls due first, bounded
            # as a claim of due messages is (the same due time on another shard, with
            # a later seq, comes to the next reserve).
            pick = view.pick(ahead_ms)
            if pick is not None:
                shard, bound = pick
                epoch = view.epochs[shard]
                call = self._ops[shard].claim(queue, limit, lease_ms, bound, ahead_ms)
                claim = await self._claims.claim(self._run(call), queue)
                view.learn(shard, claim, epoch)
                records = claim.records
        return sort_claimed(records)

    async def _give_back(self, queue: str, records: list[Record]) -> None:
        """Give back what a cancelled claim took (``release.lua`` on each shard), even
        while closing."""
        for shard in sorted({shard_of(record.id, self.shards) for record in records}):
            mine = [record for record in records if shard_of(record.id, self.shards) == shard]
            call = self._ops[shard].unclaim(queue, mine)
            try:
                await self._scripts(call.script, call.keys, call.args)
            except CONNECTION_ERRORS as exc:  # the leases will expire instead
                logger.warning("could not release %d claimed messages: %s", len(mine), exc)
            self._news(queue, shard)

    async def _claim(
        self, queue: str, view: ShardView, limit: int, lease_ms: int, ahead_ms: int = 0
    ) -> list[Record]:
        """Claims of several shards: a cancel during one gives back the earlier ones
        (:mod:`.._claims`)."""
        stop = [False]  # set when the caller was cancelled: send nothing more
        return await self._claims.claim_all(
            self._claim_all(queue, view, limit, lease_ms, stop, ahead_ms=ahead_ms), queue, stop
        )

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>` (``outcome`` is a hint this
        backend does not need: it always decides before it returns)."""
        taken = None
        if self.shards > 1:
            taken = await self._run(self._ops[0].take_seqs(queue, len(requests)))
        plan = self._put_plan(requests, taken)
        if self._needs_check(plan):
            for shard, _, part, _, _ in plan:
                await self._run(self._ops[shard].check_put(queue, part))
        kept: list[int] = []
        for shard, indexes, part, seqs, dues in plan:
            woke, kept_here = await self._run(self._ops[shard].put(queue, part, seqs, dues))
            if woke:
                self._news(queue, shard)
            kept += [indexes[position] for position in kept_here]
        kept.sort()
        return kept

    async def _reserve(
        self, queue: str, limit: int, lease_ms: int, wait: float | None, ahead_ms: int
    ) -> Claimed:
        """Both reserves (:class:`~delayq.durable._async.hold.AsyncReserves`). The
        store's now of the answer is the view's estimate of the server's clock, which
        the last reply set and which never runs ahead of it (each reply is read after
        the server read its clock)."""
        hub = self._hub(queue)
        hub.mark_unheard()
        if wait == 0:
            return self._claimed(hub, await self._claim(queue, hub.view, limit, lease_ms))
        give_up = None if wait is None else time.monotonic() + wait
        backoff = REDIS_RECONNECT_FIRST
        with hub.session():
            while True:
                generation = hub.generation
                try:
                    records = await self._claim(queue, hub.view, limit, lease_ms, ahead_ms)
                except CONNECTION_ERRORS as exc:
                    if expired(give_up):
                        raise
                    log_lost("reserve lost Redis", exc, backoff)
                    await hub.wait(hub.generation, backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if records or expired(give_up):
                    return self._claimed(hub, records)
                timeout = hub.view.seconds_until_next(ahead_ms) + HAIR
                if give_up is not None:
                    timeout = min(timeout, max(0.0, give_up - time.monotonic()))
                await hub.wait(generation, timeout)
                self._check_open()

    @staticmethod
    def _claimed(hub: AsyncHub, records: list[Record]) -> Claimed:
        # A claim's reply set the view's clock: it is known whenever records came. The
        # estimate is of the server's clock now: the hold counts from now too.
        arrived = time.monotonic()
        return Claimed(records, int(hub.view.server_now() * 1000.0) if records else 0, arrived)

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        await self._run(self._at(id).ack(queue, id, token))

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`: one
        script per shard, at once (pipelined on a single node; one by one on a sync
        cluster client)."""
        self._check_open()
        plan = self._ack_plan(items)
        calls = [self._ops[shard].ack_many(queue, [items[i] for i in idx]) for shard, idx in plan]
        try:
            await self._ready()
            replies = await self._scripts.many([(c.script, c.keys, c.args) for c in calls])
        except CONNECTION_ERRORS:
            self._check_open()
            raise
        lost = [call.decode(reply) for call, reply in zip(calls, replies, strict=True)]
        return self._lost_ids(items, plan, lost)

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
        base = await self._seq_base(queue, 1)
        seq = None if base is None else base + 1
        ops = self._at(id)
        state = await self._run(ops.nack(queue, id, token, delay_ms, error, dead=dead, seq=seq))
        if state is State.SCHEDULED:
            self._news(queue, ops.shard)
        return state

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        ops = self._at(id)
        await self._run(ops.release(queue, id, token))
        self._news(queue, ops.shard)

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return await self._run(self._at(id).extend(queue, id, token, lease_ms))

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return await self._run(self._at(id).cancel(queue, id))

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        base = await self._seq_base(queue, 1)
        ops = self._at(id)
        moved = await self._run(
            ops.reschedule(queue, id, delay_ms, at_ms, None if base is None else base + 1)
        )
        if moved:
            self._news(queue, ops.shard)
        return moved

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return await self._run(self._at(id).get(queue, id))

    async def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return merge_stats([await self._run(ops.stats(queue)) for ops in self._ops])

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>` (the seq is
        one counter for every shard of a queue: each shard pages after it, then merge)."""
        parts = [await self._run(ops.dead(queue, limit, after_seq)) for ops in self._ops]
        return merge_dead(parts, limit)

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        revived = 0
        for ops in self._ops:
            mine = (
                None if ids is None else [i for i in ids if shard_of(i, self.shards) == ops.shard]
            )
            if mine == []:
                continue
            count = len(mine) if mine is not None else await self._dead_count(queue, ops.shard)
            if not count:
                continue
            done = await self._run(ops.retry_dead(queue, mine, await self._seq_base(queue, count)))
            if done:
                self._news(queue, ops.shard)
            revived += done
        return revived

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return sum([await self._run(ops.purge(queue, state)) for ops in self._ops])

    async def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        self._check_open()
        await self._ready()
        return await self._scripts.queues(self.prefix)

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        parts = [await self._run(ops.peek(queue, state, limit, after)) for ops in self._ops]
        return merge_peek(parts, state, limit)

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        # One now for every shard (the first shard's), as a sharded put resolves its due
        # times: each shard reading its own TIME could count a message due exactly at
        # the horizon on one shard and not on another.
        first = await self._run(self._ops[0].due_counts(queue, horizon_ms, buckets))
        parts = [first]
        for ops in self._ops[1:]:
            parts.append(await self._run(ops.due_counts(queue, horizon_ms, buckets, first[0])))
        return merge_due_counts(parts)

    async def close(self) -> None:
        """See :meth:`Backend.close <delayq.durable.backend.Backend.close>`."""
        if self._closed:
            return
        await self._claims.settle()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            hubs = list(self._hubs.values())
        for hub in hubs:
            await hub.close()
        await self._listen_clients.aclose()
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self._client.aclose()
