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
slot moves. A cluster URL takes delayq's options alone (``prefix``, ``shards``): its
clients are made from its nodes, with no other parameter of redis-py. Scripts run as
library functions on a single node and by EVALSHA on a cluster (see :mod:`._functions`).

The faces are written once for asyncio (:mod:`._async.sharded`); the sync one is
generated from it (:mod:`._sync.sharded`, ``scripts/unasync.py``). What both share is
:mod:`._sharded`, the shard views and merges :mod:`._shards`, where waiting reserves
sleep :mod:`._hub`, the redis-py clients :mod:`._clients`.
"""

from __future__ import annotations

from ._async.sharded import AsyncShardedRedisBackend
from ._sync.sharded import ShardedRedisBackend

__all__ = ["AsyncShardedRedisBackend", "ShardedRedisBackend"]
