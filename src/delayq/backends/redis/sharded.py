"""Sharded queues: ``redis+cluster://host:port[,host:port...]`` and ``shards=N``.

``Queue(url, shards=N)`` (or ``?shards=N`` in the URL) spreads one logical queue over
``N`` hash tags ``{<queue>:0}`` ... ``{<queue>:N-1}``, each a complete single-shard
queue (the same keys and scripts as :mod:`.backend`), so on a Redis Cluster the shards
land on different masters. It works on a single node too (``redis://...?shards=4``);
``redis+cluster://`` with ``shards=1`` is one shard on a cluster. Every script still
touches one shard's keys only.

* Message ``id`` lives in shard ``crc32(id) % N`` (:func:`._shards.shard_of`, stable
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
  next ones, keeping global due order (see :mod:`._shards`); a waiting reserve listens
  on every shard's wake-up marker.
* stats, dead, retry_dead, purge, peek and due_counts run on every shard and merge the
  results (each shard's part is atomic; the whole is not one snapshot); queues scans
  every master. retry_dead revives each shard's dead messages in the order they died,
  one shard after the other: across shards that order is not kept.

Options: those of :mod:`.backend`, plus ``shards`` (1 to 1024; default 1). The same
queue must always be opened with the same ``shards``: messages of other shards would not
be found. A cluster URL's nodes are startup nodes; redis-py's ``RedisCluster`` follows
slot moves. Scripts run as library functions on a single node and by EVALSHA on a
cluster (see :mod:`._functions`).

The sync face is here; the asyncio face is :mod:`._sharded_async` (exported here too),
what both share :mod:`._sharded`, the shard views and merges :mod:`._shards`, where
waiting reserves sleep :mod:`._hub`, the redis-py clients :mod:`._clients`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from ...durable.inspection import merge_peek
from ...durable.message import Position, PutRequest, Record, State, Stats
from ._clients import sync_client
from ._functions import Functions
from ._hub import Hub
from ._listen import Listener, log_lost, next_backoff
from ._ops import Call
from ._resend import call
from ._scan import scan_queues
from ._scripts import Claim
from ._settings import REDIS_RECONNECT_FIRST
from ._sharded import ShardedBase
from ._sharded_async import AsyncShardedRedisBackend
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

__all__ = ["AsyncShardedRedisBackend", "ShardedRedisBackend"]

T = TypeVar("T")


class ShardedRedisBackend(ShardedBase):
    """The sync face of a sharded queue (see the module docstring)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._client = sync_client(self._settings, listener=False)
        self._scripts = Functions(self._client, cluster=self._settings.cluster)
        self._hubs: dict[str, Hub] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The redis-py client (``Redis`` or ``RedisCluster``) of the shared pool."""
        return self._client

    def _run(self, call: Call[T]) -> T:
        self._check_open()
        try:
            reply = self._scripts(call.script, call.keys, call.args)
        except CONNECTION_ERRORS:
            self._check_open()
            raise
        return call.decode(reply)

    def _seq_base(self, queue: str, count: int) -> int | None:
        """Take ``count`` queue-wide seqs: the one before the first (None: one shard)."""
        if self.shards == 1:
            return None
        self._check_open()
        key = self._ops[0].seq_key(queue)
        # Sent again after a lost reply: the seqs of the lost run are skipped (harmless).
        return int(call(lambda: self._client.incrby(key, count), safe=True)) - count

    def _dead_count(self, queue: str, shard: int) -> int:
        key = self._ops[shard].dead_key(queue)
        return int(call(lambda: self._client.zcard(key), safe=True))

    def _hub(self, queue: str) -> Hub:
        hub = self._hubs.get(queue)
        if hub is None:
            with self._lock:
                self._check_open()
                hub = self._hubs.get(queue)
                if hub is None:
                    hub = Hub(ShardView(self.shards))
                    for ops in self._ops:
                        hub.listeners.append(
                            Listener(
                                functools.partial(sync_client, self._settings, listener=True),
                                ops.wake_key(queue),
                                functools.partial(self._run, ops.wake(queue)),
                                functools.partial(hub.news, ops.shard),
                            )
                        )
                    self._hubs[queue] = hub
        return hub

    def _claim(self, queue: str, view: ShardView, limit: int, lease_ms: int) -> list[Record]:
        records: list[Record] = []
        for _ in range(2 * self.shards + 2):
            for shard in view.unknown():  # news may come in between: bound by fresh heads
                epoch = view.epochs[shard]
                view.learn(shard, self._run(self._ops[shard].claim(queue, 0, lease_ms)), epoch)
            pick = view.pick()
            if pick is None:
                break
            shard, bound = pick
            epoch = view.epochs[shard]
            claim: Claim = self._run(
                self._ops[shard].claim(queue, limit - len(records), lease_ms, bound)
            )
            view.learn(shard, claim, epoch)
            records += claim.records
            if len(records) >= limit:
                break
        return sort_claimed(records)

    def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        taken = None
        if self.shards > 1:
            taken = self._run(self._ops[0].take_seqs(queue, len(requests)))
        plan = self._put_plan(requests, taken)
        if self._needs_check(plan):
            for shard, _, part, _, _ in plan:
                self._run(self._ops[shard].check_put(queue, part))
        kept: list[int] = []
        for shard, indexes, part, seqs, dues in plan:
            woke, kept_here = self._run(self._ops[shard].put(queue, part, seqs, dues))
            if woke:
                self._news(queue, shard)
            kept += [indexes[position] for position in kept_here]
        kept.sort()
        return kept

    def reserve(self, queue: str, *, limit: int, lease_ms: int, wait: float | None) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        hub = self._hub(queue)
        hub.mark_unheard()
        if wait == 0:
            return self._claim(queue, hub.view, limit, lease_ms)
        give_up = None if wait is None else time.monotonic() + wait
        backoff = REDIS_RECONNECT_FIRST
        with hub.session():
            while True:
                generation = hub.generation
                try:
                    records = self._claim(queue, hub.view, limit, lease_ms)
                except CONNECTION_ERRORS as exc:
                    if expired(give_up):
                        raise
                    log_lost("reserve lost Redis", exc, backoff)
                    hub.wait(hub.generation, backoff)
                    backoff = next_backoff(backoff)
                    continue
                backoff = REDIS_RECONNECT_FIRST
                if records or expired(give_up):
                    return records
                timeout = hub.view.seconds_until_next() + HAIR
                if give_up is not None:
                    timeout = min(timeout, max(0.0, give_up - time.monotonic()))
                hub.wait(generation, timeout)
                self._check_open()

    def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        self._run(self._at(id).ack(queue, id, token))

    def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`: one
        script per shard, pipelined on a single node (one by one on a cluster)."""
        self._check_open()
        plan = self._ack_plan(items)
        calls = [self._ops[shard].ack_many(queue, [items[i] for i in idx]) for shard, idx in plan]
        try:
            replies = self._scripts.many([(c.script, c.keys, c.args) for c in calls])
        except CONNECTION_ERRORS:
            self._check_open()
            raise
        lost = [call.decode(reply) for call, reply in zip(calls, replies, strict=True)]
        return self._lost_ids(items, plan, lost)

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
        base = self._seq_base(queue, 1)
        seq = None if base is None else base + 1
        ops = self._at(id)
        state = self._run(ops.nack(queue, id, token, delay_ms, error, dead=dead, seq=seq))
        if state is State.SCHEDULED:
            self._news(queue, ops.shard)
        return state

    def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        ops = self._at(id)
        self._run(ops.release(queue, id, token))
        self._news(queue, ops.shard)

    def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return self._run(self._at(id).extend(queue, id, token, lease_ms))

    def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return self._run(self._at(id).cancel(queue, id))

    def reschedule(self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        base = self._seq_base(queue, 1)
        ops = self._at(id)
        moved = self._run(
            ops.reschedule(queue, id, delay_ms, at_ms, None if base is None else base + 1)
        )
        if moved:
            self._news(queue, ops.shard)
        return moved

    def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return self._run(self._at(id).get(queue, id))

    def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return merge_stats([self._run(ops.stats(queue)) for ops in self._ops])

    def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>` (the seq is
        one counter for every shard of a queue: each shard pages after it, then merge)."""
        parts = [self._run(ops.dead(queue, limit, after_seq)) for ops in self._ops]
        return merge_dead(parts, limit)

    def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        revived = 0
        for ops in self._ops:
            mine = (
                None if ids is None else [i for i in ids if shard_of(i, self.shards) == ops.shard]
            )
            if mine == []:
                continue
            count = len(mine) if mine is not None else self._dead_count(queue, ops.shard)
            if not count:
                continue
            done = self._run(ops.retry_dead(queue, mine, self._seq_base(queue, count)))
            if done:
                self._news(queue, ops.shard)
            revived += done
        return revived

    def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return sum(self._run(ops.purge(queue, state)) for ops in self._ops)

    def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        self._check_open()
        return scan_queues(self._client, self.prefix)

    def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        parts = [self._run(ops.peek(queue, state, limit, after)) for ops in self._ops]
        return merge_peek(parts, state, limit)

    def due_counts(self, queue: str, *, horizon_ms: int, buckets: int) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        return merge_due_counts(
            [self._run(ops.due_counts(queue, horizon_ms, buckets)) for ops in self._ops]
        )

    def close(self) -> None:
        """See :meth:`Backend.close <delayq.durable.backend.Backend.close>`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            hubs = list(self._hubs.values())
        for hub in hubs:
            hub.close()
        self._client.close()
