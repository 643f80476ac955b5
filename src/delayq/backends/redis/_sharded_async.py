"""The asyncio face of a sharded Redis queue (see :mod:`.sharded`, which exports it).

Beside the operations of the sync face it keeps a claim spread over several shards safe
against cancellation: what earlier shards gave a reserve cancelled later is given back.

A cluster client loads its map of the cluster (``initialize``) before its first command
(:meth:`AsyncShardedRedisBackend._ready`). redis-py's asyncio ``RedisCluster`` loads it
lazily, and a command given to it before then is routed as if it had no key, to one
node, which answers ``MOVED``; redis-py's handling of ``MOVED`` then disconnects pooled
connections that other tasks have just taken, so several tasks starting at once saw
"Connection closed by server" on a healthy cluster (a put failed, a claim was lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from ..._constants import LOGGER_NAME
from ...durable.inspection import merge_peek
from ...durable.message import Position, PutRequest, Record, State, Stats
from ._clients import async_client
from ._functions import AsyncFunctions
from ._hub import AsyncHub
from ._listen import AsyncListener, log_lost, next_backoff
from ._ops import Call
from ._resend import call_async, not_cancelled
from ._scan import scan_queues_async
from ._scripts import Claim
from ._settings import REDIS_RECONNECT_FIRST
from ._sharded import ShardedBase
from ._shards import (
    ShardView,
    merge_dead,
    merge_due_counts,
    merge_stats,
    shard_of,
    sort_claimed,
)
from ._transport import CONNECTION_ERRORS
from ._waiting import HAIR, expired

__all__ = ["AsyncShardedRedisBackend"]

T = TypeVar("T")
logger = logging.getLogger(LOGGER_NAME)


class AsyncShardedRedisBackend(ShardedBase):
    """The asyncio face of a sharded queue (see the module docstring)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._client = async_client(self._settings, listener=False)
        self._scripts = AsyncFunctions(self._client, cluster=self._settings.cluster)
        self._hubs: dict[str, AsyncHub] = {}
        self._background: set[asyncio.Task[Any]] = set()
        #: The cluster's map is loaded (a later reload is redis-py's own, with a default
        #: node to route by meanwhile); a single node needs none.
        self._mapped = not self._settings.cluster

    @property
    def client(self) -> Any:
        """The redis-py asyncio client (``Redis`` or ``RedisCluster``)."""
        return self._client

    async def _ready(self) -> Any:
        """The client, with the cluster's map loaded (see the module docstring); a
        single-node client as is."""
        if not self._mapped:
            await self._client.initialize()
            self._mapped = True
        return self._client

    async def _run(self, call: Call[T]) -> T:
        self._check_open()
        try:
            await self._ready()
            reply = await not_cancelled(self._scripts(call.script, call.keys, call.args))
        except CONNECTION_ERRORS:
            self._check_open()
            raise
        return call.decode(reply)

    async def _seq_base(self, queue: str, count: int) -> int | None:
        if self.shards == 1:
            return None
        self._check_open()
        key = self._ops[0].seq_key(queue)
        client = await self._ready()
        # Sent again after a lost reply: the seqs of the lost run are skipped (harmless).
        return int(await call_async(lambda: client.incrby(key, count), safe=True)) - count

    async def _dead_count(self, queue: str, shard: int) -> int:
        key = self._ops[shard].dead_key(queue)
        client = await self._ready()
        return int(await call_async(lambda: client.zcard(key), safe=True))

    def _hub(self, queue: str) -> AsyncHub:
        hub = self._hubs.get(queue)
        if hub is None:
            self._check_open()
            hub = AsyncHub(ShardView(self.shards))
            for ops in self._ops:
                hub.listeners.append(
                    AsyncListener(
                        functools.partial(async_client, self._settings, listener=True),
                        ops.wake_key(queue),
                        functools.partial(self._run, ops.wake(queue)),
                        functools.partial(hub.news, ops.shard),
                    )
                )
            self._hubs[queue] = hub
        return hub

    async def _claim_all(
        self, queue: str, view: ShardView, limit: int, lease_ms: int, stop: list[bool]
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
            claim = await self._claim_one(queue, shard, limit - len(records), lease_ms, bound)
            view.learn(shard, claim, epoch)
            records += claim.records
            if len(records) >= limit:
                break
        return sort_claimed(records)

    async def _claim_one(
        self, queue: str, shard: int, limit: int, lease_ms: int, bound: tuple[int, int] | None
    ) -> Claim:
        """One claim that is never lost: if the caller is cancelled while the script
        runs, what it claimed is released once its reply is in."""
        call = self._ops[shard].claim(queue, limit, lease_ms, bound)
        task = asyncio.ensure_future(self._run(call))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(functools.partial(self._unclaim_later, queue, shard))
            raise

    def _unclaim_later(self, queue: str, shard: int, done: asyncio.Future[Claim]) -> None:
        if done.cancelled() or done.exception() is not None or not done.result().records:
            return
        unclaim = asyncio.ensure_future(self._unclaim(queue, shard, done.result().records))
        self._background.add(unclaim)
        unclaim.add_done_callback(self._background.discard)

    async def _unclaim(self, queue: str, shard: int, records: list[Record]) -> None:
        call = self._ops[shard].unclaim(queue, records)
        try:
            await self._scripts(call.script, call.keys, call.args)
        except CONNECTION_ERRORS as exc:  # the leases will expire instead
            logger.warning("could not release %d claimed messages: %s", len(records), exc)
        self._news(queue, shard)

    async def _claim(self, queue: str, view: ShardView, limit: int, lease_ms: int) -> list[Record]:
        """Claims of several shards: a cancel during one gives back the earlier ones."""
        # Records of earlier shards are already ours when a later claim is cancelled.
        stop = [False]
        task = asyncio.ensure_future(self._claim_all(queue, view, limit, lease_ms, stop))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            stop[0] = True
            task.add_done_callback(functools.partial(self._unclaim_all_later, queue))
            raise

    def _unclaim_all_later(self, queue: str, done: asyncio.Future[list[Record]]) -> None:
        if done.cancelled() or done.exception() is not None or not done.result():
            return
        for shard in range(self.shards):
            mine = [r for r in done.result() if shard_of(r.id, self.shards) == shard]
            if mine:
                unclaim = asyncio.ensure_future(self._unclaim(queue, shard, mine))
                self._background.add(unclaim)
                unclaim.add_done_callback(self._background.discard)

    async def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
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

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        hub = self._hub(queue)
        hub.mark_unheard()
        if wait == 0:
            return await self._claim(queue, hub.view, limit, lease_ms)
        give_up = None if wait is None else time.monotonic() + wait
        backoff = REDIS_RECONNECT_FIRST
        with hub.session():
            while True:
                generation = hub.generation
                try:
                    records = await self._claim(queue, hub.view, limit, lease_ms)
                except CONNECTION_ERRORS as exc:
                    if expired(give_up):
                        raise
                    log_lost("reserve lost Redis", exc, backoff)
                    await hub.wait(hub.generation, backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if records or expired(give_up):
                    return records
                timeout = hub.view.seconds_until_next() + HAIR
                if give_up is not None:
                    timeout = min(timeout, max(0.0, give_up - time.monotonic()))
                await hub.wait(generation, timeout)
                self._check_open()

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        await self._run(self._at(id).ack(queue, id, token))

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`: one
        script per shard, all at once."""
        plan = self._ack_plan(items)
        calls = [self._ops[shard].ack_many(queue, [items[i] for i in idx]) for shard, idx in plan]
        lost = await asyncio.gather(*(self._run(call) for call in calls))
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
        return await scan_queues_async(await self._ready(), self.prefix)

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
        return merge_due_counts(
            [await self._run(ops.due_counts(queue, horizon_ms, buckets)) for ops in self._ops]
        )

    async def close(self) -> None:
        """See :meth:`Backend.close <delayq.durable.backend.Backend.close>`."""
        if self._closed:
            return
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self._closed = True
        for hub in list(self._hubs.values()):
            await hub.close()
        with contextlib.suppress(*CONNECTION_ERRORS):
            await self._client.aclose()
