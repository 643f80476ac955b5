"""ack_many: many acknowledgements in one round trip; lost leases are reported, not raised."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from delayq import QueueClosed
from delayq.durable import Message, State
from delayq.durable.constants import MAX_ACK_MANY

from ._helpers import total


def reserve_all(q: Any, count: int, **kwargs: Any) -> list[Message]:
    """Reserve exactly ``count`` messages (a sharded queue may hand them out in parts)."""
    got: list[Message] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        got += q.reserve(max=count - len(got), wait=1, **kwargs)
    assert len(got) == count
    return got


def test_ack_many_acks_every_held_message(q: Any) -> None:
    q.put_many([{"payload": n} for n in range(20)])
    msgs = reserve_all(q, 20)
    assert q.ack_many(msgs) == []
    assert total(q) == 0
    assert q.reserve(wait=0) == []


def test_ack_many_takes_any_iterable(q: Any) -> None:
    q.put_many([{"payload": n} for n in range(3)])
    msgs = reserve_all(q, 3)
    assert q.ack_many(msg for msg in msgs) == []
    assert total(q) == 0


def test_ack_many_of_nothing_is_an_empty_list(q: Any) -> None:
    q.put("kept")
    assert q.ack_many([]) == []
    assert q.ack_many(iter(())) == []
    assert total(q) == 1


def test_stale_leases_are_returned_in_order_and_left_unchanged(make_queue: Any) -> None:
    name = "ack-many-mixed"
    q, other = make_queue(name=name), make_queue(name=name)
    q.put_many([{"payload": n, "id": f"m{n}"} for n in range(6)])
    # A lease long enough for the first reserves of a sharded queue on a cluster, which
    # start a listener per shard, and the ack after them (over 1 s on a loaded CI
    # machine, four test processes on two cores).
    first = {m.id: m for m in reserve_all(q, 6, lease=3.0)}
    q.ack(first["m1"])  # acked already
    time.sleep(3.2)  # every other lease has expired by now
    second = {m.id: m for m in reserve_all(other, 5, lease=30)}
    batch = [second["m0"], first["m3"], second["m2"], first["m1"], second["m4"], first["m5"]]

    assert q.ack_many(batch) == ["m3", "m1", "m5"]

    for id in ("m0", "m1", "m2", "m4"):
        assert q.get(id) is None
    for id in ("m3", "m5"):  # still held by the second consumer, as they were
        seen = q.get(id)
        assert seen.state is State.ACTIVE
        assert seen.attempts == 2
    assert other.ack_many([second["m3"], second["m5"]]) == []
    assert total(q) == 0


def test_expired_lease_is_reported_lost(q: Any) -> None:
    q.put("late", id="late")
    q.put("kept", id="kept")
    msgs = {m.id: m for m in reserve_all(q, 2, lease=0.05)}
    time.sleep(0.15)
    assert q.ack_many([msgs["late"], msgs["kept"]]) == ["late", "kept"]
    for id in ("late", "kept"):
        seen = q.get(id)
        assert seen.state is State.READY
        assert seen.attempts == 1
        assert seen.last_error == "lease expired"
    [back] = q.reserve(wait=0, max=1)
    assert back.attempts == 2


def test_a_message_given_twice_is_lost_the_second_time(q: Any) -> None:
    q.put("x", id="twice")
    q.put("y", id="once")
    msgs = {m.id: m for m in reserve_all(q, 2)}
    assert q.ack_many([msgs["twice"], msgs["once"], msgs["twice"]]) == ["twice"]
    assert total(q) == 0


def test_a_stale_copy_before_the_held_one_does_not_hide_it(q: Any) -> None:
    q.put("x", id="x")
    [old] = q.reserve(wait=0, lease=0.05)
    time.sleep(0.15)
    [new] = q.reserve(wait=1)
    assert q.ack_many([old, new]) == ["x"]
    assert q.get("x") is None


def test_cancelled_or_purged_messages_are_lost(q: Any) -> None:
    q.put_many([{"payload": n, "id": f"p{n}"} for n in range(3)])
    msgs = reserve_all(q, 3)
    assert q.purge() == 3
    assert sorted(q.ack_many(msgs)) == ["p0", "p1", "p2"]
    assert total(q) == 0


def test_another_queues_message_is_refused_before_anything_is_acked(make_queue: Any) -> None:
    mine, theirs = make_queue(), make_queue()
    mine.put("a", id="a")
    theirs.put("b", id="b")
    [a] = mine.reserve(wait=1)
    [b] = theirs.reserve(wait=1)
    with pytest.raises(ValueError, match="belongs to queue"):
        mine.ack_many([a, b])
    assert mine.get("a").state is State.ACTIVE
    assert theirs.get("b").state is State.ACTIVE
    assert mine.ack_many([a]) == []
    assert theirs.ack_many([b]) == []


@pytest.mark.parametrize("bad", [None, 5, "msgs", b"msgs", {"id": "x"}])
def test_not_a_list_of_messages_is_a_type_error(q: Any, bad: object) -> None:
    with pytest.raises(TypeError):
        q.ack_many(bad)


def test_bad_items_are_refused_before_anything_is_acked(q: Any) -> None:
    q.put("x", id="x")
    [msg] = q.reserve(wait=1)
    with pytest.raises(TypeError, match="Message"):
        q.ack_many([msg, "x"])
    with pytest.raises(TypeError):
        q.ack_many(msg)  # one message, not a list of them
    with pytest.raises(ValueError, match="no lease"):
        q.ack_many([msg, q.get("x")])
    assert q.get("x").state is State.ACTIVE
    assert q.ack_many([msg]) == []


def test_more_than_the_limit_is_refused(q: Any) -> None:
    q.put("x", id="x")
    [msg] = q.reserve(wait=1)
    copies = [dataclasses.replace(msg) for _ in range(MAX_ACK_MANY + 1)]
    with pytest.raises(ValueError, match="at most"):
        q.ack_many(copies)
    assert q.get("x").state is State.ACTIVE
    assert q.ack_many(copies[:MAX_ACK_MANY]) == ["x"] * (MAX_ACK_MANY - 1)
    assert total(q) == 0


def test_ack_many_on_a_closed_queue_raises(make_queue: Any) -> None:
    q = make_queue()
    q.put("x")
    [msg] = q.reserve(wait=1)
    q.purge()
    q.close()
    with pytest.raises(QueueClosed):
        q.ack_many([msg])
