"""Sharded queues on a real 3-master Redis Cluster and on one node (``shards=N``).

The cluster is the session's (tests/backends/_redis_cluster.py: three ``redis-server``
processes on free ports, stopped at exit); single-node sharding uses the shared test
Redis under a private prefix. Checked here: the scripts run as functions routed by their
keys (no node asked for them), one queue's messages land on every master,
global due-time order across shards with several consumers, an empty shard costs a
draining consumer no script call, a sharded single node keeps the order, a batch
spread over shards keeps put order, and a new asyncio client given many commands at once
runs them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from delayq.durable import AsyncQueue, Queue
from delayq.durable.message import PutRequest

pytest.importorskip("redis")

import redis
import redis.cluster
from redis.crc import key_slot

from delayq.backends.redis._resend import ATTEMPT, Attempt
from delayq.backends.redis._scripts import queue_keys
from delayq.backends.redis._shards import shard_of

from ._redis_cluster import Cluster, ClusterUnavailable, shared_cluster
from ._redis_server import WaitingConsumer, unavailable

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


def _calls(client: Any, node: Any, *commands: str) -> int:
    stats = client.info("commandstats", target_nodes=node)
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)


def _script_calls(client: Any, node: Any) -> int:
    return _calls(client, node, "fcall", "evalsha")


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_cluster_runs_the_scripts_as_functions_routed_by_their_keys(
    cluster: Cluster, cluster_client: Any, prefix: str, face: str
) -> None:
    """FCALL, the library compiled once per node, not EVALSHA (which ran the whole
    prelude each call); routed by the slot of its KEYS, so no node is asked for the keys
    of a call (COMMAND GETKEYS, a round trip more); the library loaded again on every
    primary after FUNCTION FLUSH."""
    url = f"{cluster.url}?prefix={prefix}&shards=6"
    masters = list(cluster_client.get_primaries())

    def counts() -> tuple[int, int, int]:
        return (
            sum(_calls(cluster_client, n, "fcall") for n in masters),
            sum(_calls(cluster_client, n, "evalsha") for n in masters),
            sum(_calls(cluster_client, n, "command|getkeys") for n in masters),
        )

    def sync_round(n: int) -> list[Any]:
        with Queue(url, name=f"fc-{face}") as q:
            q.put_many([{"payload": i} for i in range(n)])
            got = []
            while len(got) < n:
                batch = q.reserve(wait=1, max=n)
                q.ack_many(batch)
                got += [m.payload for m in batch]
            return sorted(got)

    async def async_round(n: int) -> list[Any]:
        async with AsyncQueue(url, name=f"fc-{face}") as q:
            await q.put_many([{"payload": i} for i in range(n)])
            got = []
            while len(got) < n:
                batch = await q.reserve(wait=1, max=n)
                await q.ack_many(batch)
                got += [m.payload for m in batch]
            return sorted(got)

    def round_of(n: int) -> list[Any]:
        return sync_round(n) if face == "sync" else asyncio.run(async_round(n))

    fcall, evalsha, getkeys = counts()
    assert round_of(30) == list(range(30))
    cluster_client.function_flush()  # every primary forgets the library
    assert round_of(30) == list(range(30))
    after = counts()
    assert after[0] - fcall >= 12  # puts, claims and acks on six shards, twice
    assert (after[1] - evalsha, after[2] - getkeys) == (0, 0)


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
    # (claimed at, payload, due), both in the servers' epoch ms: the claim time is the
    # lease expiry less the lease, read by the claiming script from Redis' clock, so the
    # order of claims does not depend on when each consumer thread got the CPU back.
    got: list[tuple[int, int, int]] = []
    lock = threading.Lock()
    lease_ms = 30_000

    def consume() -> None:
        with Queue(url, name="order") as q:
            while True:
                batch = q.reserve(wait=2, max=1, lease=lease_ms / 1000)
                if not batch:
                    return
                for msg in batch:
                    assert msg.lease_expires_at is not None
                    with lock:
                        got.append((msg.lease_expires_at - lease_ms, msg.payload, msg.due_at))
                    q.ack(msg)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(p for _, p, _ in got) == list(range(60))
    for claimed, _, due in got:
        assert claimed >= due  # never early
    # A message claimed (strictly) later than another was not due more than the slack
    # before it: consumers keep global due order across shards (no slack: 0 ms).
    bound = 0 + 1  # 0 ms of slack, 1 ms of rounding
    for claimed, payload, due in got:
        early = [
            (later_claimed, later_payload, later_due)
            for later_claimed, later_payload, later_due in got
            if later_claimed > claimed + 1 and later_due < due - bound
        ]
        assert not early, ((claimed, payload, due), early, sorted(got))


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
        before = _script_calls(cluster_client, node)
        drained = len(first)
        while drained < len(ids):
            batch = q.reserve(wait=1, max=10)
            assert batch
            drained += len(batch)
            for msg in batch:
                q.ack(msg)
        for msg in first:
            q.ack(msg)
        assert _script_calls(cluster_client, node) - before == 0


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
        # Far enough ahead that both batches are written before either falls due, even
        # on a loaded machine (a due time already past is the put's own time).
        at = time.time() + 1.0
        late = q.put_many([{"payload": f"late{i}", "at": at + 0.5} for i in range(20)])
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


def _in_order(q: Any, ids: list[str]) -> list[str]:
    """The waiting messages in the order reserve takes them, (due_at, seq) across
    shards (peek merges the shards by it; no consumer's view of the heads involved)."""
    waiting = q.peek(limit=len(ids) + 1)
    q.purge()
    return [m.id for m in waiting]


@pytest.mark.parametrize("where", ["cluster", "single"])
@pytest.mark.timeout(60)
def test_a_batch_spread_over_shards_keeps_put_order(
    where: str, request: pytest.FixtureRequest, prefix: str
) -> None:
    """A put is one script per shard, run one after another: the batch's parts must not
    each resolve "due now" or a delay from their own later clock reading (the later
    shards' messages came out after the earlier ones' in a fraction of the runs)."""
    if where == "cluster":
        cluster: Cluster = request.getfixturevalue("cluster")
        request.getfixturevalue("cluster_client")  # deletes the keys afterwards
        url = f"{cluster.url}?prefix={prefix}&shards=4"
    else:
        url = request.getfixturevalue("single_url")
    with Queue(url, name="batch-order") as q:
        for round in range(25):
            now = q.put_many([{"payload": i} for i in range(24)])
            assert _in_order(q, now) == now, f"due now, round {round}"
            later = q.put_many([{"payload": i, "delay": 0.5} for i in range(24)])
            assert _in_order(q, later) == later, f"equal delays, round {round}"
        # And a consumer takes a batch due now in put order.
        ids = q.put_many([{"payload": i} for i in range(3)])
        assert [m.id for m in q.reserve(wait=0, max=3)] == ids


@pytest.mark.timeout(60)
def test_a_batch_spread_over_shards_keeps_put_order_on_the_async_face(
    cluster: Cluster, cluster_client: Any, prefix: str
) -> None:
    url = f"{cluster.url}?prefix={prefix}&shards=4"

    async def main() -> None:
        async with AsyncQueue(url, name="batch-order-async") as q:
            for round in range(25):
                ids = await q.put_many([{"payload": i} for i in range(24)])
                waiting = await q.peek(limit=25)
                await q.purge()
                assert [m.id for m in waiting] == ids, f"round {round}"

    asyncio.run(main())


def test_a_claim_bounded_later_than_now_takes_a_message_due_this_very_ms(
    single_url: str,
) -> None:
    """The bound's seq breaks ties at the bound's due time only: a message due exactly
    at the server's now, with a higher seq than a bound due later, is claimed (it was
    left until the next millisecond, a spin of empty claims)."""
    from delayq.backends.redis import ShardedRedisBackend  # noqa: PLC0415

    backend = ShardedRedisBackend(single_url)
    try:
        ops = backend._ops[0]
        for round in range(200):
            # The batch's due time is the server's now; claim in the same ms, mostly.
            base, now = backend._run(ops.take_seqs("edge", 1))
            request = PutRequest(id=f"m{round}", payload=b"x", encoding="bytes", max_attempts=3)
            backend._run(ops.put("edge", [request], [base + 1], [now.floor]))
            claim = backend._run(ops.claim("edge", 1, 30_000, (now.floor + 1000, 0)))
            assert [r.id for r in claim.records] == [f"m{round}"], f"round {round}"
    finally:
        backend.close()


def test_tasks_starting_at_once_on_a_new_async_client_all_succeed(
    cluster: Cluster, cluster_client: Any, prefix: str
) -> None:
    """Commands given at once to a new asyncio cluster client, before it has loaded the
    cluster's map, all run: none is sent to the wrong node and lost to the reconnects
    that follow a ``MOVED``."""
    url = f"{cluster.url}?prefix={prefix}&shards=4"

    async def main() -> None:
        for round in range(10):
            async with AsyncQueue(url, name=f"cold-start-{round}") as q:
                results = await asyncio.gather(
                    *(q.put(i) for i in range(16)), return_exceptions=True
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                assert not errors, f"round {round}: {errors[:3]}"
                stats = await q.stats()
                assert stats.ready + stats.scheduled == 16
                await q.purge()

    asyncio.run(main())


@contextlib.contextmanager
def _attempt() -> Iterator[Attempt]:
    """One attempt of a call, as the retry loop makes it."""
    attempt = Attempt()
    token = ATTEMPT.set(attempt)
    try:
        yield attempt
    finally:
        ATTEMPT.reset(token)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_script_written_to_any_master_is_known_as_written(
    cluster: Cluster, cluster_client: Any, prefix: str, face: str
) -> None:
    """The retry rule needs to know whether a script reached a socket, on every node
    the cluster client finds: otherwise an ack or a put whose reply was lost would be
    sent again. redis-py's asyncio ``RedisCluster`` takes no ``connection_class``, so
    this also checks, at each end of the supported redis-py range, that the nodes it
    makes from its map get delayq's connection class."""
    url = f"{cluster.url}?prefix={prefix}&shards=3"
    eval_one = ("EVAL", "return 1", 0)
    sent: list[bool] = []
    if face == "sync":
        with Queue(url, name="marks") as q:
            q.put("mapped")  # the client has read the cluster's map
            client = q.backend.client  # type: ignore[attr-defined]
            for node in client.get_primaries():
                with _attempt() as attempt:
                    client.execute_command(*eval_one, target_nodes=node)
                sent.append(attempt.sent)
    else:

        async def main() -> None:
            async with AsyncQueue(url, name="marks") as q:
                await q.put("mapped")
                client = q.backend.client  # type: ignore[attr-defined]
                for node in client.get_primaries():
                    with _attempt() as attempt:
                        await client.execute_command(*eval_one, target_nodes=node)
                    sent.append(attempt.sent)

        asyncio.run(main())
    assert sent == [True] * 3


def test_the_listeners_of_an_async_queue_read_the_cluster_map_once(
    cluster: Cluster, cluster_client: Any, prefix: str
) -> None:
    """A waiting reserve on an asyncio queue of four shards starts a listener per shard;
    they share one client, which reads the cluster's map once, on the event loop (a
    client each read it four times, ~10 ms of the loop's CPU each, at every consumer's
    first wait and again whenever a listener came back after its lingering)."""
    url = f"{cluster.url}?prefix={prefix}&shards=4"

    def map_reads() -> int:
        return sum(
            _calls(cluster_client, node, "cluster|slots", "cluster|shards")
            for node in cluster_client.get_primaries()
        )

    async def main() -> int:
        async with AsyncQueue(url, name="maps") as q:
            await q.stats()  # the queue's own client has read the map
            before = map_reads()
            for _ in range(3):
                assert await q.reserve(wait=0.2) == []
            return map_reads() - before

    assert asyncio.run(main()) == 1


@pytest.mark.parametrize("face", ["sync", "async"])
def test_news_a_parked_listener_did_not_hear_reaches_the_next_claim(
    single_url: str, face: str
) -> None:
    """A sharded consumer's listener takes a marker while no reserve of it waits, hands
    it back and parks. Parked, it hears nothing: the next claim, even one that does not
    wait, must look at every shard again rather than trust its view of them."""
    with Queue(single_url, name="parked") as producer:

        def sync_run() -> list[Any]:
            with Queue(single_url, name="parked") as consumer:
                assert consumer.reserve(wait=0.2) == []  # listeners start, heads known
                producer.put("news")  # a marker: no reserve waits, the listener parks
                time.sleep(0.3)
                return [m.payload for m in consumer.reserve(wait=0)]

        async def async_run() -> list[Any]:
            async with AsyncQueue(single_url, name="parked") as consumer:
                assert await consumer.reserve(wait=0.2) == []
                producer.put("news")
                await asyncio.sleep(0.3)
                return [m.payload for m in await consumer.reserve(wait=0)]

        assert (sync_run() if face == "sync" else asyncio.run(async_run())) == ["news"]


def _started(replicas: int) -> Iterator[Cluster]:
    own = Cluster(replicas)
    try:
        own.start()
    except ClusterUnavailable as exc:
        own.stop()
        unavailable(f"the test cluster did not start: {exc}")
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def own_cluster() -> Iterator[Cluster]:
    """A 3-master cluster of the test's own, to kill and restart."""
    yield from _started(replicas=0)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("face", ["sync", "async"])
@pytest.mark.parametrize("killed", ["under the wait", "before the queue opens"])
def test_a_waiting_consumer_outlives_a_cluster_restart(
    own_cluster: Cluster, face: str, killed: str
) -> None:
    """Every node is killed under a consumer waiting on a sharded queue (or before the
    consumer opens its queue and waits), then started again: a put made after the
    restart reaches the consumer within seconds, not at the end of its wait (its
    listeners retried rather than died of the cluster's errors)."""
    url = f"{own_cluster.url}?shards=3"
    if killed == "before the queue opens":
        own_cluster.kill()
    consumer = WaitingConsumer(url, "restart", face, wait=60)
    time.sleep(0.5)  # waiting (its listeners blocked in BLPOP, or retrying)
    if killed == "under the wait":
        own_cluster.kill()
    time.sleep(1.0)  # the listeners meet the dead cluster
    own_cluster.restart()
    with Queue(url, name="restart") as producer:
        producer.put("after the restart")
        consumer.thread.join(15)
    assert not consumer.thread.is_alive(), "the consumer missed the put made after the restart"
    assert not consumer.errors, consumer.errors
    assert [m.payload for m in consumer.got] == ["after the restart"]


@pytest.fixture
def replicated_cluster() -> Iterator[Cluster]:
    """A cluster of three masters with a replica each, of the test's own."""
    yield from _started(replicas=1)


def test_a_consumer_keeps_receiving_across_a_master_failover(
    replicated_cluster: Cluster,
) -> None:
    """A master dies and its replica takes over: once it has, puts go to the new master
    and a consumer looping on reserve (as a worker does, going on after an error) gets
    every one of them, acked, with nothing delivered twice."""
    url = f"{replicated_cluster.url}?shards=3"
    received: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def consume() -> None:
        with Queue(url, name="failover") as q:
            while not done.is_set():
                try:
                    batch = q.reserve(wait=0.5, max=10)
                    q.ack_many(batch)
                except Exception as exc:  # a worker logs, backs off and goes on
                    errors.append(exc)
                    time.sleep(0.1)
                    continue
                received.extend(message.payload for message in batch)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        with Queue(url, name="failover") as producer:
            before = [f"before {i}" for i in range(12)]
            producer.put_many([{"payload": payload} for payload in before])
            deadline = time.monotonic() + 10
            while len(received) < len(before) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sorted(received) == sorted(before)
            dead = replicated_cluster.ports[0]
            replicated_cluster.kill(dead)
            replicated_cluster.wait_failover(dead)
            after = [f"after {i}" for i in range(12)]
            for payload in after:  # one by one: every shard, the promoted one included
                producer.put(payload)
            deadline = time.monotonic() + 15
            while len(received) < len(before) + len(after) and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        done.set()
        thread.join(10)
    assert sorted(received) == sorted(before + after), errors
