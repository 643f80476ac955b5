"""``amqp://`` delivering to a user's exchange: plain AMQP consumers, here pika, get
delayq's messages at their time, in order, never early, with delayq's headers; a
cancelled or rescheduled message is delivered as the last word said; one nobody can
route is retried and then dead."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.durable import Queue, State

pika = pytest.importorskip("pika")
pytest.importorskip("aiormq")

from conformance.conftest import amqp_url  # noqa: E402


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield from amqp_url(tmp_path)


@pytest.fixture
def target() -> Iterator[tuple[Any, str, str]]:
    """A user's direct exchange and a queue bound to it with routing key ``timeout``:
    ``(pika channel, exchange, queue)``; both deleted afterwards."""
    connection = pika.BlockingConnection(
        pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F")
    )
    channel = connection.channel()
    exchange = f"delayq-test-orders-{uuid.uuid4().hex[:8]}"
    queue = f"{exchange}.timeouts"
    channel.exchange_declare(exchange, exchange_type="direct")
    channel.queue_declare(queue, arguments={"x-queue-type": "quorum"}, durable=True)
    channel.queue_bind(queue, exchange, routing_key="timeout")
    try:
        yield channel, exchange, queue
    finally:
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
        connection.close()


def consume(channel: Any, queue: str, count: int, timeout: float) -> list[tuple[Any, Any, float]]:
    """``count`` deliveries of ``queue`` (acked), each with the epoch ms it arrived."""
    got: list[tuple[Any, Any, float]] = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        got.append((properties, body, time.time() * 1000))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_messages_reach_a_plain_consumer_at_their_time(
    url: str, target: tuple[Any, str, str]
) -> None:
    channel, exchange, queue = target
    with Queue(url, name="orders", deliver_exchange=exchange, deliver_routing_key="timeout") as q:
        late = q.put({"order": 3}, delay=0.6, headers={"tenant": "a"})
        first = q.put({"order": 1}, delay=0.2)
        gone = q.put({"order": 2}, delay=0.3)
        moved = q.put(b"\x00raw", delay=5)
        assert q.cancel(gone)
        assert q.reschedule(moved, delay=0.4)
        got = consume(channel, queue, 3, timeout=10)
        assert [p.message_id for p, _, _ in got] == [first, moved, late]
        for properties, _, arrived in got:
            assert arrived >= properties.headers["x-delayq-due-at"]  # never early
            assert properties.headers["x-delayq-queue"] == "orders"
            assert properties.headers["x-delayq-attempt"] == 1
            assert properties.delivery_mode == 2
        assert json.loads(got[0][1]) == {"order": 1}
        assert got[0][0].content_type == "application/json"
        assert got[1][1] == b"\x00raw"
        assert got[1][0].content_type == "application/octet-stream"
        assert got[2][0].headers["tenant"] == "a"
        assert consume(channel, queue, 1, timeout=0.5) == []  # the cancelled one: never
        assert q.stats().total == 0  # each one gone once the broker confirmed it
        assert q.reserve(wait=0) == []


def test_an_unroutable_message_is_retried_then_dead(url: str, target: tuple[Any, str, str]) -> None:
    _, exchange, _ = target
    with Queue(url, name="lost", deliver_exchange=exchange, deliver_routing_key="nobody") as q:
        id = q.put("x", max_attempts=1)
        deadline = time.monotonic() + 10
        while (message := q.get(id)) is not None and message.state is not State.DEAD:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert message is not None
        assert message.last_error == f"unroutable: exchange={exchange} routing_key=nobody"
        q.purge()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"deliver_routing_key": "k"}, "needs deliver_exchange"),
        ({"deliver_exchange": ""}, "name an exchange"),
        ({"deliver_exchange": "x" * 256}, "255 bytes"),
    ],
)
def test_deliver_options_are_checked(options: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Queue("amqp://h/", **options)


def test_a_new_scheduler_goes_on_delivering(url: str, target: tuple[Any, str, str]) -> None:
    channel, exchange, queue = target
    first = Queue(url, name="orders", deliver_exchange=exchange, deliver_routing_key="timeout")
    id = first.put("later", delay=0.5)
    with Queue(url, name="orders") as second:  # a candidate that configures nothing
        second.stats()
        first.close()  # the scheduler goes; the target is in the log
        [(properties, body, _)] = consume(channel, queue, 1, timeout=10)
        assert (properties.message_id, body) == (id, b'"later"')
        assert second.stats().total == 0


def test_a_scheduler_closed_while_delivering_hands_over_without_a_lease_to_wait_out(
    url: str, target: tuple[Any, str, str]
) -> None:
    """A scheduler process stopped in the middle of its deliveries (a restart, a deploy)
    first settles them: each publish's outcome is logged, so its successor delivers the
    rest at once, rather than once their leases (DELIVER_LEASE_MS, 30 s) have run out,
    and holds nothing it would deliver a second time then."""
    channel, exchange, queue = target
    first = Queue(url, name="orders", deliver_exchange=exchange, deliver_routing_key="timeout")
    ids = first.put_many([{"payload": i, "delay": 0.3} for i in range(300)])
    with Queue(url, name="orders") as second:
        second.stats()  # a candidate
        got = consume(channel, queue, 1, timeout=10)  # the first scheduler is delivering
        first.close()
        got += consume(channel, queue, len(ids) - 1, timeout=10)
        assert sorted(p.message_id for p, _, _ in got) == sorted(ids)
        assert second.stats().total == 0  # none left leased, to be delivered again
