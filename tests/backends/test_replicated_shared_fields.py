"""What the replicated scheduler's records share (issue 41, point 1): a record without
headers, put through the codec as a client sends it or folded from the log as a hot
standby does, holds the one read-only empty mapping, and its encoding the one interned
str, and the records of one batch their due time (and, folded, their lease expiry and
last error); and no put, reschedule, nack, release, extend or retry of any record, with headers
or without, ever changes another record's headers. No broker: the scheduler's
:class:`Journal` fed through the codec."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq.backends._replicated._codec import (
    decode_requests,
    encode_record,
    encode_requests,
    pack,
    unpack,
)
from delayq.backends._replicated._scheduler._journal import Journal
from delayq.durable.message import Now, PutRequest, Record

T0 = 1_700_000_000_000
NOW = Now(T0, T0)
HOUR = 3_600_000


def _request(id: str, headers: dict[str, str] | None = None, delay_ms: int = HOUR) -> PutRequest:
    return PutRequest(
        id=id,
        payload=id.encode(),
        encoding="".join(["js", "on"]),  # a str of its own, as msgpack makes each
        max_attempts=3,
        headers=headers or {},
        delay_ms=delay_ms,
        on_conflict="replace",
    )


def _sent(journal: Journal, requests: list[PutRequest], now: Now = NOW) -> None:
    """Put ``requests`` as the scheduler takes them off the wire."""
    journal.put(decode_requests(unpack(pack(encode_requests(requests)))), now)


def _folded(journal: Journal) -> Journal:
    """A hot standby's journal: ``journal``'s records, logged and folded."""
    images = [encode_record(r) for r in journal.records.values()]
    deletes: list[str] = []
    entry = unpack(pack(["put", "q", "r", T0, journal.last_seq, images, deletes, "ok", b""]))
    standby = Journal()
    standby.restore(entry[5], entry[6], entry[4])
    return standby


def _assert_shared(records: list[Record]) -> None:
    assert len(records) >= 2
    first = records[0]
    for record in records[1:]:
        assert record.headers is first.headers
        assert record.encoding is first.encoding
    assert dict(first.headers) == {}
    with pytest.raises(TypeError):
        first.headers["x"] = "y"  # type: ignore[index]


def test_records_without_headers_share_one_empty_mapping_from_a_put_and_from_the_log() -> None:
    elected = Journal()
    _sent(elected, [_request(f"m{n}") for n in range(5)])
    _sent(elected, [_request("with", {"k": "v"})])
    bare = [elected.records[f"m{n}"] for n in range(5)]
    _assert_shared(bare)
    assert elected.records["with"].headers == {"k": "v"}

    standby = _folded(elected)
    _assert_shared([standby.records[f"m{n}"] for n in range(5)])
    # The standby's records share what the elected scheduler's do (one per process).
    assert standby.records["m0"].headers is bare[0].headers
    assert standby.records["m0"].encoding is bare[0].encoding
    assert standby.records["with"].headers == {"k": "v"}
    assert standby.records["m3"] == bare[3]


def test_the_records_of_one_batch_share_their_due_time_from_a_put_and_from_the_log() -> None:
    elected = Journal()
    _sent(elected, [_request(f"m{n}") for n in range(5)])
    _sent(elected, [_request(f"late{n}", delay_ms=2 * HOUR) for n in range(3)])
    for journal in (elected, _folded(elected)):
        batch = [journal.records[f"m{n}"] for n in range(5)]
        assert all(r.due_at is batch[0].due_at for r in batch)
        assert batch[0].due_at == T0 + HOUR
        late = [journal.records[f"late{n}"] for n in range(3)]
        assert all(r.due_at is late[0].due_at for r in late)
        assert late[0].due_at == T0 + 2 * HOUR


def test_a_logged_entrys_records_share_their_lease_expiry_and_last_error() -> None:
    elected = Journal()
    _sent(elected, [_request(f"m{n}", delay_ms=0) for n in range(6)])
    claimed = elected.claim(Now(T0 + 1, T0 + 1), 6, 10_000)
    for record in claimed[3:]:
        elected.nack(
            record.id, record.lease or "", NOW, delay_ms=HOUR, error="timed out", dead=False
        )
    standby = _folded(elected)
    held = [standby.records[r.id] for r in claimed[:3]]
    assert all(r.lease_until is held[0].lease_until for r in held)
    assert held[0].lease_until == T0 + 1 + 10_000
    nacked = [standby.records[r.id] for r in claimed[3:]]
    assert all(r.last_error is nacked[0].last_error for r in nacked)
    assert all(r.due_at is nacked[0].due_at for r in nacked)
    assert [standby.records[r.id] for r in claimed] == [elected.records[r.id] for r in claimed]


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.integers(0, 5),
            st.one_of(st.none(), st.dictionaries(st.sampled_from("abc"), st.text(max_size=3))),
        ),
        st.tuples(st.just("reschedule"), st.integers(0, 5), st.integers(-10, 100)),
        st.tuples(st.just("claim"), st.integers(1, 3)),
        st.tuples(st.just("nack"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("extend"), st.integers(0, 5)),
        st.tuples(st.just("retry_dead"), st.integers(0, 0)),
        st.tuples(st.just("cancel"), st.integers(0, 5)),
        st.tuples(st.just("fold"), st.integers(0, 0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_no_operation_changes_another_records_headers(ops: list[tuple[Any, ...]]) -> None:
    journal = Journal()
    model: dict[str, dict[str, str]] = {}  # the headers each stored id was put with
    held: dict[str, str] = {}  # id -> lease token of a claimed record
    now = NOW
    for op in ops:
        now = Now(now.floor + 1, now.ceil + 1)
        kind, *args = op
        if kind == "put":
            id = f"m{args[0]}"
            if journal.records.get(id) is not None and id in held:
                continue  # a message in flight cannot be replaced
            _sent(journal, [_request(id, args[1], delay_ms=0)], now)
            model[id] = dict(args[1] or {})
            held.pop(id, None)
        elif kind == "reschedule":
            journal.reschedule(f"m{args[0]}", now, delay_ms=args[1], at_ms=None)
        elif kind == "claim":
            for record in journal.claim(now, args[0], 10_000):
                held[record.id] = record.lease or ""
        elif kind in ("nack", "release", "extend") and f"m{args[0]}" in held:
            id = f"m{args[0]}"
            token = held.pop(id)
            if kind == "nack":
                journal.nack(id, token, now, delay_ms=0, error="e", dead=args[1])
            elif kind == "release":
                journal.release(id, token, now)
            else:
                journal.extend(id, token, now, 10_000)
                held[id] = token
        elif kind == "retry_dead":
            journal.retry_dead(None, now)
        elif kind == "cancel" and f"m{args[0]}" not in held:
            if journal.cancel(f"m{args[0]}", now):
                model.pop(f"m{args[0]}")
        elif kind == "fold":
            journal = _folded(journal)
        assert {id: dict(r.headers) for id, r in journal.records.items()} == model
    bare = [r for r in journal.records.values() if not r.headers]
    if len(bare) >= 2:
        assert bare[0].headers is bare[1].headers
