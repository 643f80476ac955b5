"""Many consumers at once: every message is delivered to one holder and acked once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from delayq import LeaseLost

MESSAGES = 5000
#: The cluster runs every call over several nodes (and the async face on one loop), and
#: every reader of the Kafka test broker polls (Tansu answers a fetch when its wait
#: ends, docs/kafka.md): the same behaviour with fewer messages keeps their runs short.
CLUSTER_MESSAGES = 1000
CONSUMERS = 8


def _consume(q: Any, acked: list[str], errors: list[BaseException], done: threading.Event) -> None:
    try:
        while not done.is_set():
            batch = q.reserve(wait=0.05, max=10, lease=60)
            for msg in batch:
                assert msg.attempts == 1
                q.ack(msg)
                acked.append(msg.payload)
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


@pytest.mark.parametrize("producers_first", [True, False], ids=["backlog", "live"])
def test_eight_consumers_ack_each_message_exactly_once(
    make_queue: Any, producers_first: bool, request: pytest.FixtureRequest
) -> None:
    name = "concurrency"
    # On Tansu a loaded machine's request may take past the default 10 s (docs/kafka.md).
    slow = {"request_timeout": 30} if "kafka" in request.node.callspec.id else {}
    producer = make_queue(name=name, **slow)
    few = any(name in request.node.callspec.id for name in ("cluster", "kafka"))
    count = CLUSTER_MESSAGES if few else MESSAGES
    payloads = [f"m{i}" for i in range(count)]

    def produce() -> None:
        for start in range(0, count, 500):
            producer.put_many([{"payload": p} for p in payloads[start : start + 500]])

    if producers_first:
        produce()
    acked: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()
    consumers = [make_queue(name=name, **slow) for _ in range(CONSUMERS)]
    threads = [
        threading.Thread(target=_consume, args=(c, acked, errors, done), daemon=True)
        for c in consumers
    ]
    for thread in threads:
        thread.start()
    if not producers_first:
        produce()
    deadline = time.monotonic() + (120 if slow else 60)
    while len(acked) < count and not errors and time.monotonic() < deadline:
        time.sleep(0.02)
    done.set()
    for thread in threads:
        thread.join(10)
    assert not errors, errors[:3]
    counts = Counter(acked)
    assert len(counts) == count
    assert set(counts.values()) == {1}
    assert producer.stats().total == 0


def test_racing_acks_only_one_wins(make_queue: Any) -> None:
    q = make_queue()
    q.put("x")
    [msg] = q.reserve(wait=0)
    outcomes: list[str] = []
    lock = threading.Lock()

    def ack() -> None:
        try:
            q.ack(msg)
            result = "ok"
        except LeaseLost:
            result = "lost"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=ack) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes) == ["lost"] * 7 + ["ok"]
