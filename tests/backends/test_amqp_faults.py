"""``amqp://`` under faults, on private RabbitMQ nodes started by the tests (own names,
ports, data and cookie; stopped by process id): the node leading the namespace's
queues and holding the scheduler's connection is killed with SIGKILL under a stream of
puts and deliveries (0 lost, 0 early, nothing acked comes back), and a single node is
restarted under a waiting consumer (it reconnects and receives its message, not early).
The restart is RabbitMQ's orderly stop (SIGTERM): after a SIGKILL of a single-node
broker, RabbitMQ 3.10.8 left the stream ``down`` for more than 30 s after the node was
back (its quorum queue recovered at once), which no client can ride out; in a cluster
the stream's other replicas take over (the second test).

A delayq process killed while holding messages is tested with real worker processes
in tests/e2e/test_worker_processes.py (its amqp case).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.durable import Queue

pytest.importorskip("aiormq")

from ._rabbitmq_nodes import RabbitNodes

pytestmark = pytest.mark.slow


def running(tmp_path: Path, size: int) -> Iterator[RabbitNodes]:
    nodes = RabbitNodes(tmp_path, size)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def single(tmp_path: Path) -> Iterator[RabbitNodes]:
    yield from running(tmp_path, 1)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RabbitNodes]:
    yield from running(tmp_path, 3)


def now_ms() -> float:
    return time.time() * 1000


def test_a_waiting_consumer_rides_out_a_node_restart(single: RabbitNodes) -> None:
    url = single.url(0, "?prefix=faults&scheduler=on&request_timeout=60")
    with Queue(url, name="jobs") as queue:
        id = queue.put("hello", delay=8)
        got: list[tuple[str, int, float]] = []

        def wait() -> None:
            for message in queue.reserve(wait=None):
                got.append((message.id, message.due_at, now_ms()))

        consumer = threading.Thread(target=wait)
        consumer.start()
        time.sleep(0.5)  # parked at the scheduler (its own process)
        single.kill(0, signal.SIGTERM)
        single.start_node(0)
        single.wait_ready(0)
        consumer.join(60)
        assert not consumer.is_alive()
        [(got_id, due_at, arrived)] = got
        assert got_id == id
        assert arrived >= due_at  # not early; how late it is, the benchmark says


def test_killing_the_leading_node_loses_nothing(cluster: RabbitNodes) -> None:
    query = "?prefix=faults&request_timeout=30"
    # Node 0 leads the log and the lock (their first declarer connects there) and
    # holds the scheduler's connection; node 1 holds a candidate. The producer talks to
    # node 2; the consumer's URL lists nodes 0 and 2, so it is on node 0 when that dies
    # and must move to node 2.
    scheduler = Queue(cluster.url(0, query), name="jobs", scheduler="on")
    scheduler.stats()
    candidate = Queue(cluster.url(1, query), name="jobs", scheduler="on")
    candidate.stats()
    producer = Queue(cluster.url(2, query), name="jobs", scheduler="off")
    listed = f"127.0.0.1:{cluster.ports[0]},127.0.0.1:{cluster.ports[2]}"
    consumer = Queue(f"amqp://guest:guest@{listed}/%2F{query}", name="jobs", scheduler="off")
    acked_puts: set[str] = set()
    deliveries: list[tuple[str, int, float]] = []
    acked: dict[str, float] = {}  # id -> when its ack returned
    producing = threading.Event()
    producing.set()
    failures: list[BaseException] = []

    def produce() -> None:
        n = 0
        try:
            while producing.is_set():
                id = f"m{n}"
                producer.put(n, id=id, delay=random.uniform(0, 0.3))
                acked_puts.add(id)
                n += 1
        except BaseException as exc:
            failures.append(exc)

    def consume() -> None:
        try:
            while producing.is_set() or set(acked_puts) - set(acked):
                messages = consumer.reserve(wait=1, max=20, lease=30)
                arrived = now_ms()
                deliveries.extend((m.id, m.due_at, arrived) for m in messages)
                lost = consumer.ack_many(messages)
                done = now_ms()
                for m in messages:
                    if m.id not in lost:
                        acked[m.id] = done
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(2)
        cluster.kill(0)
        time.sleep(3)
        producing.clear()
        for thread in threads:
            thread.join(60)
        assert not failures, failures
        assert len(acked_puts) > 100
        assert set(acked_puts) <= set(acked)  # 0 lost
        early = [(id, due, at) for id, due, at in deliveries if at < due]
        assert not early  # 0 early
        counts = Counter(id for id, _, _ in deliveries)
        again = [
            id for id, _, at in deliveries if counts[id] > 1 and id in acked and at > acked[id]
        ]
        assert not again  # nothing acked comes back
        assert candidate.stats().total == 0
    finally:
        producing.clear()
        for queue in (producer, consumer, candidate, scheduler):
            queue.close()
