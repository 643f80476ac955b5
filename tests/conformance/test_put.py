"""put's three conflict modes, put_many (all or nothing), get, headers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from delayq import DuplicateId, PayloadTooLarge
from delayq.durable import State

from ._helpers import now_ms, total


def test_put_returns_a_generated_unique_id(q: Any) -> None:
    ids = {q.put(i) for i in range(50)}
    assert len(ids) == 50
    assert all(isinstance(i, str) and i for i in ids)


def test_put_with_an_id_and_get(q: Any) -> None:
    before = now_ms()
    assert q.put({"a": 1}, id="order-1", headers={"trace": "t1"}, max_attempts=3) == "order-1"
    msg = q.get("order-1")
    assert msg.id == "order-1"
    assert msg.queue == q.name
    assert msg.payload == {"a": 1}
    assert msg.headers == {"trace": "t1"}
    assert msg.max_attempts == 3
    assert msg.attempts == 0
    assert msg.last_error is None
    assert msg.state is State.READY
    assert before <= msg.due_at <= now_ms()
    assert q.get("unknown") is None


def test_ignore_keeps_the_first(q: Any) -> None:
    q.put("first", id="k", delay=60)
    due = q.get("k").due_at
    assert q.put("second", id="k") == "k"
    assert q.put("third", id="k", on_conflict="ignore") == "k"
    msg = q.get("k")
    assert (msg.payload, msg.due_at) == ("first", due)
    assert total(q) == 1


def test_replace_overwrites_payload_and_due_time(q: Any) -> None:
    q.put("first", id="k", delay=60, headers={"v": "1"})
    assert q.put("second", id="k", on_conflict="replace", headers={"v": "2"}) == "k"
    msg = q.get("k")
    assert msg.payload == "second"
    assert msg.headers == {"v": "2"}
    assert msg.state is State.READY
    assert total(q) == 1


def test_replace_resets_a_failed_or_dead_message(q: Any) -> None:
    q.put("first", id="k", max_attempts=1)
    [msg] = q.reserve(wait=0)
    q.nack(msg, error="boom")
    assert q.get("k").state is State.DEAD
    q.put("again", id="k", on_conflict="replace", delay=60)
    msg = q.get("k")
    assert (msg.state, msg.attempts, msg.last_error) == (State.SCHEDULED, 0, None)


def test_error_raises_duplicate_id_and_changes_nothing(q: Any) -> None:
    q.put("first", id="k", delay=60)
    due = q.get("k").due_at
    with pytest.raises(DuplicateId):
        q.put("second", id="k", on_conflict="error")
    msg = q.get("k")
    assert (msg.payload, msg.due_at) == ("first", due)
    assert q.put("new", id="other", on_conflict="error") == "other"


def test_in_flight_message_cannot_be_replaced(q: Any) -> None:
    q.put("first", id="k")
    [msg] = q.reserve(wait=0)
    with pytest.raises(DuplicateId):
        q.put("second", id="k", on_conflict="replace")
    assert q.put("second", id="k") == "k"
    with pytest.raises(DuplicateId):
        q.put("second", id="k", on_conflict="error")
    seen = q.get("k")
    assert (seen.state, seen.payload) == (State.ACTIVE, "first")
    q.ack(msg)
    q.put("third", id="k", on_conflict="error")
    assert q.get("k").payload == "third"


def test_replace_after_the_lease_expired(q: Any) -> None:
    q.put("first", id="k")
    [msg] = q.reserve(wait=0, lease=0.05)
    time.sleep(0.12)
    q.put("second", id="k", on_conflict="replace")
    assert q.get("k").payload == "second"
    with pytest.raises(Exception, match="lease"):
        q.ack(msg)


def test_put_many_returns_ids_in_order(q: Any) -> None:
    ids = q.put_many(
        [
            {"payload": 1, "id": "a"},
            {"payload": 2, "delay": 60},
            {"payload": 3, "id": "c", "headers": {"h": "v"}, "max_attempts": 2},
        ]
    )
    assert ids[0] == "a"
    assert ids[2] == "c"
    assert len(set(ids)) == 3
    assert q.get("c").headers == {"h": "v"}
    assert q.get(ids[1]).state is State.SCHEDULED
    assert [m.payload for m in q.reserve(wait=0, max=5)] == [1, 3]
    assert q.put_many([]) == []


def test_put_many_is_all_or_nothing_on_bad_input(q: Any) -> None:
    good = [{"payload": i} for i in range(5)]
    with pytest.raises(TypeError):
        q.put_many([*good, {"payload": object()}])
    with pytest.raises(ValueError, match="delay"):
        q.put_many([*good, {"payload": 1, "delay": float("nan")}])
    with pytest.raises(PayloadTooLarge):
        q.put_many([*good, {"payload": b"x" * (1024 * 1024 + 1)}])
    with pytest.raises(TypeError):
        q.put_many([*good, {"payload": 1, "colour": "red"}])
    with pytest.raises(TypeError):
        q.put_many([*good, {"delay": 1}])
    with pytest.raises(TypeError):
        q.put_many([*good, "not a dict"])
    with pytest.raises(TypeError):
        q.put_many({"payload": 1})
    assert total(q) == 0


def test_put_many_is_all_or_nothing_on_a_duplicate(q: Any) -> None:
    q.put("existing", id="dup")
    with pytest.raises(DuplicateId):
        q.put_many(
            [{"payload": 1, "id": "x1"}, {"payload": 2, "id": "dup", "on_conflict": "error"}]
        )
    assert total(q) == 1
    with pytest.raises(DuplicateId):
        q.put_many([{"payload": 1, "id": "y"}, {"payload": 2, "id": "y", "on_conflict": "error"}])
    assert q.get("y") is None
    assert total(q) == 1


def test_put_many_sees_its_own_earlier_items(q: Any) -> None:
    ids = q.put_many(
        [
            {"payload": 1, "id": "z"},
            {"payload": 2, "id": "z"},
            {"payload": 3, "id": "w"},
            {"payload": 4, "id": "w", "on_conflict": "replace"},
        ]
    )
    assert ids == ["z", "z", "w", "w"]
    assert q.get("z").payload == 1
    assert q.get("w").payload == 4
    assert total(q) == 2


def test_put_many_accepts_any_iterable(q: Any) -> None:
    ids = q.put_many({"payload": i} for i in range(3))
    assert len(ids) == 3
    assert [m.payload for m in q.reserve(wait=0, max=3)] == [0, 1, 2]
