"""Sharded queues on a real 3-master Redis Cluster and on one node (``shards=N``).

The cluster is the session's (tests/backends/_redis_cluster.py: three ``redis-server``
processes on free ports, stopped at exit); single-node sharding uses the shared test
Redis under a private prefix. Checked here: one queue's messages land on every master,
global due-time order across shards with several consumers, an empty shard costs a
draining consumer no script call, and a sharded single node keeps the order.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from delayq.durable import Queue

pytest.importorskip("redis")

import redis
import redis.cluster
from redis.crc import key_slot

from delayq.backends.redis._scripts import queue_keys
from delayq.backends.redis._shards import ORDER_SLACK_MS, shard_of

from ._redis_cluster import Cluster, ClusterUnavailable, shared_cluster
from ._redis_server import unavailable

SHARED = os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The session's 3-master cluster (skip, or fail under DELAYQ_REQUIRE=redis)."""
    try:
        return shared_cluster()
    except ClusterUnavailable as exc:
        unavailable(f"the test cluster did not start: {exc}")


@pytest.fixture
def prefix() -> str:
    return f"delayq-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cluster_client(cluster: Cluster, prefix: str) -> Iterator[Any]:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        yield client
    finally:
        for key in list(client.scan_iter(match=f"{prefix}:*", count=1000)):
            client.delete(key)
        client.close()


def _evalsha_calls(client: Any, node: Any) -> int:
    stats = client.info("commandstats", target_nodes=node)
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_one_queue_spreads_over_every_master(
    cluster: Cluster, cluster_client: Any, prefix: str
) -> None:
    with Queue(f"{cluster.url}?prefix={prefix}", name="spread", shards=6) as q:
        ids = q.put_many([{"payload": i} for i in range(120)])
        owners = set()
        for shard in range(6):
            msg_key = queue_keys(prefix, "spread", shard)[0]
            node = cluster_client.get_node_from_key(msg_key)
            held = cluster_client.hlen(msg_key)
            assert held == sum(shard_of(i, 6) == shard for i in ids)
            if held:
                owners.add(node.name)
        assert len(owners) == 3
        keys = queue_keys(prefix, "spread", 1)
        assert len({key_slot(key) for key in keys}) == 1  # one script, one slot
        assert q.stats().scheduled + q.stats().ready == 120
        assert q.get(ids[7]).payload == 7
        assert q.cancel(ids[7])
        assert q.reschedule(ids[8], delay=60)


def test_global_due_order_across_shards_with_several_consumers(
    cluster: Cluster, cluster_client: Any, prefix: str
) -> None:
    url = f"{cluster.url}?prefix={prefix}&shards=6"
    start = time.time() + 0.5
    with Queue(url, name="order") as producer:
        producer.put_many([{"payload": i, "at": start + i * 0.01} for i in range(60)])
    got: list[tuple[float, int, float]] = []
    lock = threading.Lock()

    def consume() -> None:
        with Queue(url, name="order") as q:
            while True:
                batch = q.reserve(wait=2, max=1)
                if not batch:
                    return
                now = time.time()
                for msg in batch:
                    with lock:
                        got.append((now, msg.payload, msg.due_at / 1000.0))
                    q.ack(msg)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(p for _, p, _ in got) == list(range(60))
    for reserved_at, _, due in got:
        assert reserved_at >= due - 0.002  # never early (clock of one machine)
    got.sort()
    # Each message is delivered after every message due more than the slack (plus the
    # time the consumers' own steps take) before it.
    bound = (ORDER_SLACK_MS + 10) / 1000.0
    for i, (_, _, due) in enumerate(got):
        assert all(later_due >= due - bound for _, _, later_due in got[i + 1 :])


def test_an_empty_shard_costs_a_draining_consumer_nothing(
    cluster: Cluster, cluster_client: Any, prefix: str
) -> None:
    shards = 3
    url = f"{cluster.url}?prefix={prefix}&shards={shards}"

    def nodes(name: str) -> set[str]:
        keys = [queue_keys(prefix, name, k)[0] for k in range(shards)]
        return {cluster_client.get_node_from_key(key).name for key in keys}

    name = next(f"idle{n}" for n in range(1000) if len(nodes(f"idle{n}")) == shards)
    empty = 2
    ids = [f"m{i}" for i in range(400) if shard_of(f"m{i}", shards) != empty][:150]
    node = cluster_client.get_node_from_key(queue_keys(prefix, name, empty)[0])
    with Queue(url, name=name) as q:
        q.put_many([{"payload": i, "id": i} for i in ids])
        first = q.reserve(wait=1, max=10)  # learns every head, the empty one included
        before = _evalsha_calls(cluster_client, node)
        drained = len(first)
        while drained < len(ids):
            batch = q.reserve(wait=1, max=10)
            assert batch
            drained += len(batch)
            for msg in batch:
                q.ack(msg)
        for msg in first:
            q.ack(msg)
        assert _evalsha_calls(cluster_client, node) - before == 0


@pytest.fixture
def single_url(prefix: str) -> Iterator[str]:
    client = redis.Redis.from_url(SHARED, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        unavailable(f"{SHARED}: {exc}")
    try:
        yield f"{SHARED}?prefix={prefix}&shards=4"
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def test_sharded_single_node_keeps_due_then_put_order(single_url: str, prefix: str) -> None:
    with Queue(single_url, name="single") as q:
        at = time.time() + 0.2
        late = q.put_many([{"payload": f"late{i}", "at": at + 0.1} for i in range(20)])
        early = q.put_many([{"payload": f"early{i}", "at": at} for i in range(20)])
        client = redis.Redis.from_url(SHARED)
        try:
            used = [k for k in range(4) if client.hlen(queue_keys(prefix, "single", k)[0])]
        finally:
            client.close()
        assert len(used) == 4
        got: list[str] = []
        while len(got) < 40:
            batch = q.reserve(wait=2, max=3)
            assert batch
            got += [m.id for m in batch]
            for msg in batch:
                q.ack(msg)
        assert got == early + late
