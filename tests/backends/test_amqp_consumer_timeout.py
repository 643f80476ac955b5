"""amqp://: a scheduler that stays elected past the broker's ``consumer_timeout``.

RabbitMQ closes the channel of a consumer that leaves a delivery unacknowledged for
``consumer_timeout`` (30 minutes by default). The scheduler's intake reader acked every
500 deliveries only, and an intake that holds only the scheduler's markers (one every
few seconds) took longer than that: an hour's soak saw the broker close the reader's
channel at minute 30, after which the dedup table grew to its size bound and no fast
put would have been folded again (every request after one waited for it, then
failed). The reader now acks within a second (``INTAKE_ACK_WITHIN``); and a channel
the scheduler cannot serve without (the reader, the election's consumer) that the
broker closes anyway takes the connection down with it, so that the scheduler stands
again instead of serving on.

A private node with a 3-second ``consumer_timeout``, checked every half second
(``channel_tick_interval``), stands for the 30 minutes; the election's token is
renewed every second here (it is held unacknowledged by design and renewed every
``RENEW_EVERY``, 5 minutes, well within the default timeout).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from delayq.durable import Queue

pytest.importorskip("aiormq")

from delayq.backends._replicated._scheduler import _reign
from delayq.backends.amqp import _transport

from ._rabbitmq_nodes import RabbitNodes

pytestmark = pytest.mark.slow

TIMEOUT_MS = 3000
TIMED_OUT = "timed out waiting for delivery acknowledgement"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNodes]:
    """One private node for the file (a node takes 10 to 20 s to start): each test
    uses a namespace (``prefix``) of its own."""
    nodes = RabbitNodes(
        tmp_path_factory.mktemp("rabbit"),
        1,
        config=[f"consumer_timeout = {TIMEOUT_MS}"],
        advanced="[{rabbit, [{channel_tick_interval, 500}]}].",
    )
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def node(started: RabbitNodes, monkeypatch: pytest.MonkeyPatch) -> RabbitNodes:
    monkeypatch.setattr(_reign, "RENEW_EVERY", 1.0)
    return started


def _timed_out(nodes: RabbitNodes) -> list[str]:
    """The broker's log lines of consumers it timed out."""
    lines: list[str] = []
    for log in nodes.directory.rglob("*.log"):
        text = log.read_text(errors="replace")
        lines += [line for line in text.splitlines() if TIMED_OUT in line]
    return lines


def _put_then_count(q: Queue, payload: str) -> int:
    """A fast put, then a request that waits until the scheduler folded it."""
    q.put(payload)
    return q.stats().total


def test_the_intake_reader_outlives_the_consumer_timeout(node: RabbitNodes) -> None:
    url = node.url(0, "?prefix=timeout&scheduler=on&request_timeout=5")
    before = _timed_out(node)  # the node's other test times a reader out on purpose
    with Queue(url, name="jobs") as q:
        assert _put_then_count(q, "first") == 1
        time.sleep(3 * TIMEOUT_MS / 1000)  # a reader that acks late is closed by now
        assert _put_then_count(q, "second") == 2  # folded: the reader still reads
    assert _timed_out(node) == before


def test_a_reader_the_broker_closes_takes_the_connection_and_the_scheduler_stands_again(
    node: RabbitNodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_transport, "INTAKE_ACK_WITHIN", 3600.0)  # acks as it did
    url = node.url(0, "?prefix=closed&scheduler=on&request_timeout=20")
    with Queue(url, name="jobs") as q:
        assert _put_then_count(q, "first") == 1
        before = len(_timed_out(node))
        deadline = time.monotonic() + 30
        while len(_timed_out(node)) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_timed_out(node)) > before, "the broker did not time the reader out"
        # Its channel closed: the connection went with it, the scheduler stood again
        # and read the intake afresh, so this put is folded and the count answered.
        assert _put_then_count(q, "second") == 2
