"""What a put did: put_outcome() and put_many_outcomes() say, per request, whether the
message was stored (created, or replaced) or an existing one was kept, decided in the
put's own atomic step; put() and put_many() still return ids."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from delayq import DuplicateId, PutResult

from ._helpers import total


def created(results: list[PutResult]) -> list[bool]:
    return [result.created for result in results]


def test_put_and_put_many_still_return_ids(q: Any) -> None:
    assert q.put(1, id="k") == "k"
    assert q.put(2, id="k") == "k"
    generated = q.put(3)
    assert isinstance(generated, str)
    assert q.put_many([{"payload": 4, "id": "k"}, {"payload": 5, "id": "n"}]) == ["k", "n"]
    assert q.put_many([]) == []


def test_put_outcome_new_kept_replaced(q: Any) -> None:
    assert q.put_outcome("first", id="k", delay=60) == PutResult("k", created=True)
    due = q.get("k").due_at
    assert q.put_outcome("second", id="k") == PutResult("k", created=False)
    assert q.put_outcome("third", id="k", on_conflict="ignore", delay=0) == PutResult("k", False)
    msg = q.get("k")
    assert (msg.payload, msg.due_at) == ("first", due)
    assert q.put_outcome("fourth", id="k", on_conflict="replace") == PutResult("k", True)
    assert q.get("k").payload == "fourth"
    with pytest.raises(DuplicateId):
        q.put_outcome("fifth", id="k", on_conflict="error")
    assert q.put_outcome("sixth", id="e", on_conflict="error") == PutResult("e", True)
    generated = q.put_outcome("seventh")
    assert generated.created
    assert len(generated.id) == 32
    assert total(q) == 3


def test_a_kept_message_in_flight_or_dead_is_not_changed(q: Any) -> None:
    q.put("held", id="h")
    [msg] = q.reserve(wait=0)
    assert q.put_outcome("again", id="h") == PutResult("h", created=False)
    q.nack(msg, dead=True)
    assert q.put_outcome("again", id="h") == PutResult("h", created=False)
    assert q.get("h").payload == "held"
    assert q.put_outcome("revived", id="h", on_conflict="replace") == PutResult("h", True)
    assert q.get("h").payload == "revived"


def test_put_many_outcomes_mixes_new_kept_and_replaced(q: Any) -> None:
    q.put_many([{"payload": "old", "id": "a"}, {"payload": "old", "id": "b"}])
    results = q.put_many_outcomes(
        [
            {"payload": 1, "id": "a"},  # kept (stored)
            {"payload": 2, "id": "n"},  # created
            {"payload": 3, "id": "n"},  # kept (an earlier item stored it)
            {"payload": 4, "id": "b", "on_conflict": "replace"},  # replaced
            {"payload": 5, "id": "b"},  # kept (the replacement)
            {"payload": 6, "id": "r", "on_conflict": "replace"},  # created
            {"payload": 7, "id": "r", "on_conflict": "replace"},  # replaced again
            {"payload": 8, "id": "e", "on_conflict": "error"},  # created
            {"payload": 9},  # created (generated id)
        ]
    )
    assert [result.id for result in results[:8]] == ["a", "n", "n", "b", "b", "r", "r", "e"]
    assert created(results) == [False, True, False, True, False, True, True, True, True]
    payloads = {id: q.get(id).payload for id in ("a", "n", "b", "r", "e")}
    assert payloads == {"a": "old", "n": 2, "b": 4, "r": 7, "e": 8}
    assert total(q) == 6


def test_put_many_outcomes_of_an_all_ignore_batch(q: Any) -> None:
    q.put("old", id="a")
    order = ["a", "b", "c", "b", "d", "a", "c"]
    results = q.put_many_outcomes([{"payload": i, "id": name} for i, name in enumerate(order)])
    assert results == [
        PutResult(id, created)
        for id, created in zip(order, [False, True, True, False, True, False, False], strict=True)
    ]
    assert created(q.put_many_outcomes([{"payload": 0, "id": id} for id in "dcba"])) == [False] * 4
    assert {name: q.get(name).payload for name in "abcd"} == {"a": "old", "b": 1, "c": 2, "d": 4}


@pytest.mark.parametrize("shared", [True, False], ids=["shared-options", "mixed-options"])
def test_put_many_outcomes_of_a_large_batch_with_repeats(q: Any, shared: bool) -> None:
    q.put_many([{"payload": "old", "id": f"m{i}"} for i in range(0, 700, 50)])
    items: list[dict[str, Any]] = [{"payload": i, "id": f"m{i % 700}"} for i in range(1200)]
    if not shared:
        items[3]["max_attempts"] = 7
    results = q.put_many_outcomes(items)
    assert created(results) == [i < 700 and i % 50 != 0 for i in range(1200)]
    assert total(q) == 700


def test_an_error_in_the_batch_reports_nothing_and_stores_nothing(q: Any) -> None:
    q.put("old", id="dup")
    with pytest.raises(DuplicateId):
        q.put_many_outcomes(
            [{"payload": 1, "id": "x"}, {"payload": 2, "id": "dup", "on_conflict": "error"}]
        )
    assert q.get("x") is None
    assert q.put_many_outcomes([]) == []


def test_concurrent_puts_of_one_id_create_it_once(make_queue: Any) -> None:
    queues = [make_queue(name="outcome-race") for _ in range(4)]
    results: list[PutResult] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(queues))

    def put(q: Any, index: int) -> None:
        try:
            start.wait()
            for round in range(10):
                results.append(q.put_outcome(index, id=f"race-{round}"))
        except BaseException as exc:  # surfaced by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(q, i)) for i, q in enumerate(queues)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    for round in range(10):
        mine = [result for result in results if result.id == f"race-{round}"]
        assert len(mine) == len(queues)
        assert sum(result.created for result in mine) == 1
