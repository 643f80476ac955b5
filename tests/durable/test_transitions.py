"""The pure state transitions of delayq.durable.message, with explicit now_ms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import DuplicateId, LeaseLost
from delayq.durable import PutRequest, Record, State
from delayq.durable.message import (
    apply_ack,
    apply_extend,
    apply_nack,
    apply_put,
    apply_reschedule,
    apply_reserve,
    apply_retry_dead,
    can_cancel,
    compute_stats,
    observe,
    resolve_due,
    settle,
)

NOW = 1_700_000_000_000


def _request(**kwargs: object) -> PutRequest:
    fields: dict[str, object] = {
        "id": "m",
        "payload": b"{}",
        "encoding": "json",
        "max_attempts": 3,
        **kwargs,
    }
    return PutRequest(**fields)  # type: ignore[arg-type]


def _stored(**kwargs: object) -> Record:
    record = apply_put(None, _request(**kwargs), NOW, 1)
    assert record is not None
    return record


@given(
    delay=st.one_of(st.none(), st.integers(-(10**9), 10**9)),
    at=st.one_of(st.none(), st.integers(0, 2 * NOW)),
    now=st.integers(0, 2 * NOW),
)
def test_resolve_due_is_never_before_now(delay: int | None, at: int | None, now: int) -> None:
    due = resolve_due(delay, at, now)
    assert due >= now
    if at is not None:
        assert due == max(at, now)
    elif delay is not None:
        assert due == max(now + delay, now)


def test_put_conflicts() -> None:
    first = _stored(delay_ms=1000)
    assert first.due_at == NOW + 1000
    assert apply_put(first, _request(payload=b"2"), NOW, 2) is None
    with pytest.raises(DuplicateId):
        apply_put(first, _request(on_conflict="error"), NOW, 2)
    replaced = apply_put(first, _request(payload=b"2", on_conflict="replace"), NOW, 2)
    assert replaced is not None
    assert (replaced.payload, replaced.seq, replaced.due_at) == (b"2", 2, NOW)
    active = apply_reserve(replaced, NOW, 100, "t")
    with pytest.raises(DuplicateId):
        apply_put(active, _request(on_conflict="replace"), NOW, 3)
    # once the lease expired the message is no longer in flight
    assert apply_put(active, _request(on_conflict="replace"), NOW + 100, 3) is not None


def test_lease_cycle_and_fencing() -> None:
    record = apply_reserve(_stored(), NOW, 100, "t1")
    assert (record.state, record.attempts, record.lease_until) == (State.ACTIVE, 1, NOW + 100)
    apply_ack(record, "t1", NOW + 99)
    with pytest.raises(LeaseLost):
        apply_ack(record, "t1", NOW + 100)
    with pytest.raises(LeaseLost):
        apply_ack(record, "other", NOW)
    with pytest.raises(LeaseLost):
        apply_ack(None, "t1", NOW)
    extended = apply_extend(record, "t1", NOW + 50, 1000)
    assert extended.lease_until == NOW + 1050
    with pytest.raises(LeaseLost):
        apply_extend(record, "t1", NOW + 100, 1000)


def test_expired_lease_settles_to_scheduled_then_dead() -> None:
    record = apply_reserve(_stored(max_attempts=2), NOW, 100, "t1")
    assert settle(record, NOW + 99) is record
    again = settle(record, NOW + 100)
    assert (again.state, again.due_at, again.attempts) == (State.SCHEDULED, NOW + 100, 1)
    assert again.last_error == "lease expired"
    assert observe(again, NOW + 100).state is State.READY
    second = apply_reserve(again, NOW + 200, 100, "t2")
    dead = settle(second, NOW + 300)
    assert (dead.state, dead.lease, dead.last_error) == (State.DEAD, None, "lease expired")


def test_nack_requeues_then_kills() -> None:
    record = apply_reserve(_stored(max_attempts=2), NOW, 100, "t1")
    back = apply_nack(record, "t1", NOW + 10, delay_ms=500, error="e1", seq=7)
    assert (back.state, back.due_at, back.seq, back.last_error) == (
        State.SCHEDULED,
        NOW + 510,
        7,
        "e1",
    )
    record = apply_reserve(back, NOW + 600, 100, "t2")
    dead = apply_nack(record, "t2", NOW + 610, delay_ms=500, error="e2", seq=8)
    assert (dead.state, dead.last_error, dead.attempts) == (State.DEAD, "e2", 2)
    with pytest.raises(LeaseLost):
        apply_nack(dead, "t2", NOW + 610, delay_ms=0, error=None, seq=9)


def test_cancel_reschedule_retry_dead() -> None:
    record = _stored(delay_ms=1000)
    assert can_cancel(record, NOW)
    assert not can_cancel(None, NOW)
    active = apply_reserve(record, NOW, 100, "t")
    assert not can_cancel(active, NOW)
    assert apply_reschedule(active, NOW, NOW + 5, 2) is None
    moved = apply_reschedule(record, NOW, NOW - 5, 2)
    assert moved is not None
    assert (moved.due_at, moved.seq) == (NOW, 2)
    assert apply_retry_dead(record, NOW, 3) is None
    dead = apply_nack(
        apply_reserve(_stored(max_attempts=1), NOW, 100, "t"),
        "t",
        NOW,
        delay_ms=0,
        error="x",
        seq=4,
    )
    assert can_cancel(dead, NOW)
    assert apply_reschedule(dead, NOW, NOW, 5) is None
    revived = apply_retry_dead(dead, NOW + 1, 5)
    assert revived is not None
    assert (revived.state, revived.attempts, revived.due_at) == (State.SCHEDULED, 0, NOW + 1)


def test_stats() -> None:
    ready = _stored()
    scheduled = _stored(id="s", delay_ms=5000)
    active = apply_reserve(_stored(id="a"), NOW, 100_000, "t")
    stats = compute_stats([ready, scheduled, active], NOW + 250)
    assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (1, 1, 1, 0)
    assert stats.next_due_at == NOW
    assert stats.lag == 0.25
    assert compute_stats([], NOW).next_due_at is None
