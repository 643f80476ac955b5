"""``redis://host:port/db`` (and ``rediss://``): the durable contract on one Redis node.

URLs: ``redis://[user:password@]host[:port][/db][?prefix=...&socket_timeout=...]``;
``rediss://`` for TLS; ``redis+unix://[user:password@]/path/to/redis.sock[?db=N&...]``
for a server on this host reached through its Unix domain socket (no TCP stack: a
shorter round trip). Options (keyword arguments of ``Queue``/``AsyncQueue``, or URL
parameters): ``prefix`` (default ``"delayq"``), the start of every key. Other URL
parameters are redis-py's own (``socket_timeout``, ``max_connections``, ...: the list
is :func:`._url.url_options`); any other is :class:`~delayq.errors.UnsupportedURL`.

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

The faces: :class:`AsyncRedisBackend` is written once, for asyncio
(:mod:`._async.backend`); :class:`RedisBackend` is generated from it
(:mod:`._sync.backend`, ``scripts/unasync.py``). Connections: the sync face runs the
scripts on one connection per thread (:mod:`._link`), the async face on one pipelined
connection per event loop (:mod:`._link_async`), redis-py's pool without redis-py's
retries (:mod:`._resend`) where those do not apply; on both a failed connect or send is
retried with backoff (a connect that timed out is not: the server is unreachable), a
lost reply only for scripts that are safe to run twice, and any other script whose
reply is lost raises :class:`~delayq.errors.OutcomeUnknown` (as redis-py's
``ConnectionError`` or ``TimeoutError`` subclass ``ReplyLost`` / ``ReplyTimeout``);
a reply waits at most the socket timeout (10 s unless the URL says otherwise), a
connect the connect timeout (5 s), so no call waits on a silent server for longer;
plus,
per queue with a waiting consumer, one listener connection that blocks on the wake-up
marker. Durability is Redis's: with ``appendonly yes`` and ``appendfsync always`` an
acknowledged put survives a crash of the server; with the defaults the last second of
writes may be lost.
"""

from __future__ import annotations

from ._async.backend import AsyncRedisBackend
from ._sync.backend import RedisBackend

__all__ = ["AsyncRedisBackend", "RedisBackend"]
