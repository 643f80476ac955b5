"""put_many batches whose items all keep on_conflict 'ignore': ids stored already or
repeated in the batch, batches larger than a backend's look-up chunk, items that share
every option or not, with one due time or each its own."""

from __future__ import annotations

import time
from typing import Any

import pytest

from delayq import DuplicateId
from delayq._duration import seconds_to_ms

from ._helpers import ceil_ms, now_ms


def total(q: Any) -> int:
    return int(q.stats().total)


def drain_ids(q: Any) -> list[str]:
    """The ids of every ready message, in the order reserve hands them out."""
    ids: list[str] = []
    while batch := q.reserve(wait=0, max=100):
        ids += [m.id for m in batch]
    return ids


def test_ids_stored_or_repeated_are_ignored_first_one_wins(q: Any) -> None:
    q.put("old", id="a")
    order = ["a", "b", "c", "b", "d", "a", "c"]
    ids = q.put_many([{"payload": i, "id": name} for i, name in enumerate(order)])
    assert ids == order
    assert {name: q.get(name).payload for name in "abcd"} == {"a": "old", "b": 1, "c": 2, "d": 4}
    assert total(q) == 4
    assert drain_ids(q) == ["a", "b", "c", "d"]


def test_a_batch_of_stored_ids_changes_nothing(q: Any) -> None:
    q.put_many([{"payload": i, "id": f"s{i}"} for i in range(3)])
    assert q.put_many([{"payload": "new", "id": f"s{i}"} for i in (2, 0, 1, 2)]) == [
        "s2",
        "s0",
        "s1",
        "s2",
    ]
    assert [q.get(f"s{i}").payload for i in range(3)] == [0, 1, 2]
    q.put("last", id="z")
    assert drain_ids(q) == ["s0", "s1", "s2", "z"]


@pytest.mark.parametrize("shared", [True, False], ids=["shared-options", "mixed-options"])
def test_a_large_batch_with_repeats_keeps_put_order(q: Any, shared: bool) -> None:
    items: list[dict[str, Any]] = [{"payload": i, "id": f"m{i % 700}"} for i in range(1200)]
    if not shared:
        items[3]["max_attempts"] = 7
        items[703]["max_attempts"] = 9  # a repeat of m3: ignored
    q.put_many(items)
    assert total(q) == 700
    assert q.get("m3").max_attempts == (q.retry.max_attempts if shared else 7)
    assert q.get("m699").payload == 699
    assert drain_ids(q) == [f"m{i}" for i in range(700)]


def test_generated_ids_in_a_large_batch(q: Any) -> None:
    ids = q.put_many([{"payload": i} for i in range(1100)])
    assert len(set(ids)) == 1100
    assert all(len(id) == 32 and set(id) <= set("0123456789abcdef") for id in ids)
    assert drain_ids(q) == ids


def test_shared_delay_bytes_and_headers(q: Any) -> None:
    before = ceil_ms()
    raw = q.put_many([{"payload": b"r%d" % i, "delay": 60} for i in range(3)])
    after = ceil_ms()
    for i, id in enumerate(raw):
        msg = q.get(id)
        assert msg.payload == b"r%d" % i
        assert before + 60_000 <= msg.due_at <= after + 60_000
    tagged = q.put_many(
        [{"payload": i, "headers": {"k": "v", "n": str(i)}} for i in range(3)]
        + [{"payload": 3, "at": 0}]
    )
    assert [q.get(id).headers for id in tagged] == [
        {"k": "v", "n": "0"},
        {"k": "v", "n": "1"},
        {"k": "v", "n": "2"},
        {},
    ]
    assert q.get(tagged[3]).due_at <= now_ms()
    assert drain_ids(q) == tagged
    assert total(q) == 7


def test_each_item_its_own_delay_or_time(q: Any) -> None:
    """A batch (over one look-up chunk) whose items share every option but their due
    time: each keeps its own, given as a delay or as a time; none is early."""
    start = time.time()
    items: list[dict[str, Any]] = []
    for i in range(700):
        if i % 3 == 0:
            items.append({"payload": i, "id": f"d{i}", "delay": 60 + i})
        elif i % 3 == 1:
            items.append({"payload": i, "id": f"d{i}", "at": start + 120 + i / 1000})
        else:
            items.append({"payload": i, "id": f"d{i}"})  # due now
    items.append({"payload": "again", "id": "d0", "delay": 1})  # a repeat: ignored
    before = ceil_ms()
    q.put_many(items)
    after = ceil_ms()
    assert total(q) == 700
    for i in (0, 1, 2, 597, 598, 599, 699):
        msg = q.get(f"d{i}")
        assert msg.payload == i
        if i % 3 == 0:
            assert before + (60 + i) * 1000 <= msg.due_at <= after + (60 + i) * 1000
        elif i % 3 == 1:
            assert msg.due_at == seconds_to_ms(start + 120 + i / 1000)
        else:
            assert msg.due_at <= now_ms()
    assert drain_ids(q) == [f"d{i}" for i in range(2, 700, 3)]


def test_a_duplicate_in_a_batch_names_its_item(q: Any) -> None:
    """Every fault of one item of a batch names the item's index, a duplicate id too
    (the one format of every face: ``item N: ...``); nothing of the batch is stored."""
    q.put("first", id="taken")
    batch = [
        {"payload": 0, "id": "new-0"},
        {"payload": 1, "id": "taken"},  # ignore: keeps it
        {"payload": 2, "id": "taken", "on_conflict": "error"},
    ]
    with pytest.raises(DuplicateId, match=r"^item 2: a message with id 'taken' exists") as caught:
        q.put_many(batch)
    assert caught.value.id == "taken"
    assert q.get("new-0") is None
    with pytest.raises(DuplicateId, match=r"^a message with id 'taken' exists"):
        q.put("again", id="taken", on_conflict="error")  # a single put: no item
