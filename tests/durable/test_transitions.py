"""The pure state transitions of delayq.durable.message, with explicit now_ms."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import DuplicateId, LeaseLost
from delayq.durable import Now, PutRequest, Record, State
from delayq.durable.message import (
    apply_ack,
    apply_ack_many,
    apply_extend,
    apply_nack,
    apply_put,
    apply_release,
    apply_reschedule,
    apply_reserve,
    apply_retry_dead,
    apply_unclaim,
    can_cancel,
    compute_stats,
    is_due,
    lag_of,
    matches_state,
    observe,
    resolve_due,
    settle,
)

NOW = 1_700_000_000_000


def at(ms: int, *, sub_ms: bool = False) -> Now:
    """The backend's now at epoch ms ``ms`` (plus a fraction of a ms when ``sub_ms``)."""
    return Now(ms, ms + 1 if sub_ms else ms)


def _request(**kwargs: object) -> PutRequest:
    fields: dict[str, object] = {
        "id": "m",
        "payload": b"{}",
        "encoding": "json",
        "max_attempts": 3,
        **kwargs,
    }
    return PutRequest(**fields)  # type: ignore[arg-type]


def _stored_at(now: Now, **kwargs: object) -> Record:
    record = apply_put(None, _request(**kwargs), now, 1)
    assert record is not None
    return record


def _stored(**kwargs: object) -> Record:
    return _stored_at(at(NOW), **kwargs)


@given(
    delay=st.one_of(st.none(), st.integers(-(10**9), 10**9)),
    at_ms=st.one_of(st.none(), st.integers(0, 2 * NOW)),
    now_ms=st.integers(0, 2 * NOW),
    sub_ms=st.booleans(),
)
def test_resolve_due_is_never_before_now(
    delay: int | None, at_ms: int | None, now_ms: int, sub_ms: bool
) -> None:
    now = at(now_ms, sub_ms=sub_ms)
    due = resolve_due(delay, at_ms, now)
    assert due >= now.floor
    if at_ms is not None:
        assert due == max(at_ms, now.floor)
    elif delay is not None and delay > 0:
        # a positive delay counts from the ceiling: never before it has passed
        assert due == now.ceil + delay
    else:
        assert due == now.floor  # due now: reservable at once


@given(seconds=st.floats(0, 4e9, allow_nan=False))
def test_now_of_seconds_brackets_the_reading(seconds: float) -> None:
    now = Now.of_seconds(seconds)
    assert now.floor <= seconds * 1000.0 <= now.ceil
    assert now.ceil - now.floor in (0, 1)
    assert (now.ceil == now.floor) == (seconds * 1000.0 == now.floor)


def test_computed_times_start_from_the_ceiling() -> None:
    now = at(NOW, sub_ms=True)  # NOW + a fraction of a millisecond
    record = _stored_at(now, delay_ms=5)
    assert record.due_at == NOW + 6  # not NOW + 5: that would be up to 1 ms early
    assert not is_due(record, NOW + 5)
    assert is_due(record, NOW + 6)
    assert _stored_at(now).due_at == NOW  # due now: the floor, reservable at once
    active = apply_reserve(_stored_at(now), now, 100, "t")
    assert active.lease_until == NOW + 101  # a lease never ends early either
    assert apply_extend(active, "t", now, 200).lease_until == NOW + 201
    back = apply_nack(active, "t", now, delay_ms=5, error=None, seq=2)
    assert back.due_at == NOW + 6
    assert apply_nack(active, "t", now, delay_ms=0, error=None, seq=2).due_at == NOW
    moved = apply_reschedule(_stored_at(now), now, resolve_due(5, None, now), 3)
    assert moved is not None
    assert moved.due_at == NOW + 6


def test_nack_dead_kills_at_once() -> None:
    record = apply_reserve(_stored(max_attempts=5), at(NOW), 100, "t1")
    dead = apply_nack(record, "t1", at(NOW + 10), delay_ms=500, error="bad", seq=7, dead=True)
    assert (dead.state, dead.attempts, dead.last_error, dead.seq) == (State.DEAD, 1, "bad", 7)
    assert (dead.lease, dead.lease_until, dead.due_at) == (None, None, record.due_at)
    with pytest.raises(LeaseLost):
        apply_nack(dead, "t1", at(NOW + 10), delay_ms=0, error=None, seq=8, dead=True)
    with pytest.raises(LeaseLost):  # an expired lease is lost, dead or not
        apply_nack(record, "t1", at(NOW + 100), delay_ms=0, error=None, seq=8, dead=True)


def test_release_restores_the_record_before_its_claim() -> None:
    before = _stored(delay_ms=0)
    before = apply_nack(
        apply_reserve(before, at(NOW), 100, "t0"), "t0", at(NOW), delay_ms=0, error="e", seq=5
    )
    claimed = apply_reserve(before, at(NOW + 1), 100, "t1")
    assert apply_release(claimed, "t1", at(NOW + 50)) == before
    with pytest.raises(LeaseLost):
        apply_release(claimed, "other", at(NOW + 50))
    with pytest.raises(LeaseLost):
        apply_release(claimed, "t1", at(NOW + 101))  # expired
    with pytest.raises(LeaseLost):
        apply_release(None, "t1", at(NOW))


def test_unclaim_restores_the_record_before_its_claim_even_after_its_lease() -> None:
    """A claim no caller received is undone also once its lease has run out, as long
    as the record still carries it; not once the expiry was settled (written) or the
    message was claimed again or acked."""
    before = _stored(delay_ms=0, max_attempts=1)
    claimed = apply_reserve(before, at(NOW + 1), 100, "t1")
    assert apply_unclaim(claimed, "t1") == before
    assert settle(claimed, NOW + 101).state is State.DEAD  # what a release left it
    assert apply_unclaim(claimed, "t1") == before  # expired, not settled: undone
    assert apply_unclaim(claimed, "other") is None
    assert apply_unclaim(settle(claimed, NOW + 101), "t1") is None
    assert apply_unclaim(None, "t1") is None


def test_put_conflicts() -> None:
    first = _stored(delay_ms=1000)
    assert first.due_at == NOW + 1000
    assert apply_put(first, _request(payload=b"2"), at(NOW), 2) is None
    with pytest.raises(DuplicateId):
        apply_put(first, _request(on_conflict="error"), at(NOW), 2)
    replaced = apply_put(first, _request(payload=b"2", on_conflict="replace"), at(NOW), 2)
    assert replaced is not None
    assert (replaced.payload, replaced.seq, replaced.due_at) == (b"2", 2, NOW)
    active = apply_reserve(replaced, at(NOW), 100, "t")
    with pytest.raises(DuplicateId):
        apply_put(active, _request(on_conflict="replace"), at(NOW), 3)
    # once the lease expired the message is no longer in flight
    assert apply_put(active, _request(on_conflict="replace"), at(NOW + 100), 3) is not None


def test_lease_cycle_and_fencing() -> None:
    record = apply_reserve(_stored(), at(NOW), 100, "t1")
    assert (record.state, record.attempts, record.lease_until) == (State.ACTIVE, 1, NOW + 100)
    apply_ack(record, "t1", at(NOW + 99))
    with pytest.raises(LeaseLost):
        apply_ack(record, "t1", at(NOW + 100))
    with pytest.raises(LeaseLost):
        apply_ack(record, "other", at(NOW))
    with pytest.raises(LeaseLost):
        apply_ack(None, "t1", at(NOW))
    extended = apply_extend(record, "t1", at(NOW + 50), 1000)
    assert extended.lease_until == NOW + 1050
    with pytest.raises(LeaseLost):
        apply_extend(record, "t1", at(NOW + 100), 1000)


def test_expired_lease_settles_to_scheduled_then_dead() -> None:
    record = apply_reserve(_stored(max_attempts=2), at(NOW), 100, "t1")
    assert settle(record, NOW + 99) is record
    again = settle(record, NOW + 100)
    assert (again.state, again.due_at, again.attempts) == (State.SCHEDULED, NOW + 100, 1)
    assert again.last_error == "lease expired"
    assert observe(again, NOW + 100).state is State.READY
    second = apply_reserve(again, at(NOW + 200), 100, "t2")
    dead = settle(second, NOW + 300)
    assert (dead.state, dead.lease, dead.last_error) == (State.DEAD, None, "lease expired")


def test_nack_requeues_then_kills() -> None:
    record = apply_reserve(_stored(max_attempts=2), at(NOW), 100, "t1")
    back = apply_nack(record, "t1", at(NOW + 10), delay_ms=500, error="e1", seq=7)
    assert (back.state, back.due_at, back.seq, back.last_error) == (
        State.SCHEDULED,
        NOW + 510,
        7,
        "e1",
    )
    record = apply_reserve(back, at(NOW + 600), 100, "t2")
    dead = apply_nack(record, "t2", at(NOW + 610), delay_ms=500, error="e2", seq=8)
    assert (dead.state, dead.last_error, dead.attempts) == (State.DEAD, "e2", 2)
    with pytest.raises(LeaseLost):
        apply_nack(dead, "t2", at(NOW + 610), delay_ms=0, error=None, seq=9)


def test_cancel_reschedule_retry_dead() -> None:
    record = _stored(delay_ms=1000)
    assert can_cancel(record, at(NOW))
    assert not can_cancel(None, at(NOW))
    active = apply_reserve(record, at(NOW), 100, "t")
    assert not can_cancel(active, at(NOW))
    assert apply_reschedule(active, at(NOW), NOW + 5, 2) is None
    moved = apply_reschedule(record, at(NOW), NOW - 5, 2)
    assert moved is not None
    assert (moved.due_at, moved.seq) == (NOW, 2)
    assert apply_retry_dead(record, at(NOW), 3) is None
    dead = apply_nack(
        apply_reserve(_stored(max_attempts=1), at(NOW), 100, "t"),
        "t",
        at(NOW),
        delay_ms=0,
        error="x",
        seq=4,
    )
    assert can_cancel(dead, at(NOW))
    assert apply_reschedule(dead, at(NOW), NOW, 5) is None
    revived = apply_retry_dead(dead, at(NOW + 1), 5)
    assert revived is not None
    assert (revived.state, revived.attempts, revived.due_at) == (State.SCHEDULED, 0, NOW + 1)


def test_stats() -> None:
    ready = _stored()
    scheduled = _stored(id="s", delay_ms=5000)
    active = apply_reserve(_stored(id="a"), at(NOW), 100_000, "t")
    stats = compute_stats([ready, scheduled, active], NOW + 250)
    assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (1, 1, 1, 0)
    assert stats.next_due_at == NOW
    assert stats.lag == 0.25
    assert compute_stats([], NOW).next_due_at is None


def test_ack_many_acks_held_leases_in_order_and_reports_the_lost() -> None:
    a = apply_reserve(_stored_at(at(NOW), id="a"), at(NOW), 100, "ta")
    b = apply_reserve(_stored_at(at(NOW), id="b"), at(NOW), 100, "tb")
    records = {"a": a, "b": b}
    items = [("b", "tb"), ("a", "wrong"), ("a", "ta"), ("b", "tb"), ("zz", "t")]
    assert apply_ack_many(records, items, at(NOW + 50)) == (["b", "a"], ["a", "b", "zz"])
    # Once the leases expired nothing is acked.
    assert apply_ack_many(records, [("a", "ta"), ("b", "tb")], at(NOW + 100)) == ([], ["a", "b"])
    assert apply_ack_many(records, [], at(NOW)) == ([], [])


_STATES = st.sampled_from([State.SCHEDULED, State.ACTIVE, State.DEAD])


@st.composite
def _records(draw: st.DrawFn, id: str) -> Record:
    """A stored record of ``id`` in any stored state, leased or not, its lease ending
    around NOW."""
    state = draw(_STATES)
    leased = state is State.ACTIVE and draw(st.booleans())
    return Record(
        id=id,
        payload=draw(st.binary(max_size=4)),
        encoding=draw(st.sampled_from(["json", "bytes"])),
        due_at=draw(st.integers(NOW - 5, NOW + 5)),
        seq=draw(st.integers(1, 9)),
        attempts=draw(st.integers(0, 3)),
        max_attempts=draw(st.integers(1, 3)),
        state=state,
        headers=draw(st.sampled_from([{}, {"h": "v"}])),
        last_error=draw(st.sampled_from([None, "boom"])),
        lease=draw(st.sampled_from(["t1", "t2"])) if state is State.ACTIVE else None,
        lease_until=draw(st.one_of(st.none(), st.integers(NOW - 3, NOW + 3)))
        if leased or state is State.ACTIVE
        else None,
    )


@given(
    stored=st.lists(st.sampled_from("abc"), unique=True).flatmap(
        lambda ids: st.tuples(*(_records(id) for id in ids))
    ),
    items=st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["t1", "t2"])), max_size=8),
    now_ms=st.integers(NOW - 4, NOW + 4),
)
def test_ack_many_is_ack_of_each_item_in_turn(
    stored: tuple[Record, ...], items: list[tuple[str, str]], now_ms: int
) -> None:
    """apply_ack_many's outcome is apply_ack's for each item in order, an id acked
    earlier in the batch gone for the later ones (what it computes inline)."""
    records = {record.id: record for record in stored}
    now = at(now_ms)
    model = dict(records)
    acked, lost = [], []
    for id, token in items:
        try:
            apply_ack(model.get(id), token, now)
        except LeaseLost:
            lost.append(id)
            continue
        del model[id]
        acked.append(id)
    assert apply_ack_many(records, items, now) == (acked, lost)


@given(record=_records("a"), now_ms=st.integers(NOW - 4, NOW + 4), lease_ms=st.integers(1, 9))
def test_a_claim_changes_only_what_a_claim_changes(
    record: Record, now_ms: int, lease_ms: int
) -> None:
    """apply_reserve's record is dataclasses.replace's with the claim's four fields,
    holding the very same objects for the others."""
    now = at(now_ms, sub_ms=True)
    claimed = apply_reserve(record, now, lease_ms, "tok")
    expected = dataclasses.replace(
        record,
        state=State.ACTIVE,
        attempts=record.attempts + 1,
        lease="tok",
        lease_until=now.ceil + lease_ms,
    )
    assert claimed == expected
    assert type(claimed) is Record
    for name in ("id", "payload", "encoding", "headers", "last_error"):
        assert getattr(claimed, name) is getattr(record, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        claimed.state = State.DEAD  # type: ignore[misc]


def test_matches_state_observes_the_settled_record() -> None:
    scheduled = _stored_at(at(NOW), delay_ms=1000)
    assert matches_state(scheduled, None, NOW)
    assert matches_state(scheduled, State.SCHEDULED, NOW)
    assert not matches_state(scheduled, State.READY, NOW)
    assert matches_state(scheduled, State.READY, NOW + 1000)  # due: shown ready
    active = apply_reserve(_stored(), at(NOW), 100, "t")
    assert matches_state(active, State.ACTIVE, NOW + 99)
    assert not matches_state(active, State.ACTIVE, NOW + 100)  # the lease expired
    assert matches_state(active, State.READY, NOW + 100)


def test_observe_shows_the_lease_token_only_when_asked() -> None:
    active = apply_reserve(_stored(), at(NOW), 100, "t")
    assert observe(active, NOW).lease == "t"
    assert observe(active, NOW, with_lease=True).lease == "t"
    hidden = observe(active, NOW, with_lease=False)
    assert (hidden.lease, hidden.lease_until, hidden.state) == (None, NOW + 100, State.ACTIVE)
    scheduled = _stored()
    assert observe(scheduled, NOW, with_lease=False) == observe(scheduled, NOW)


def test_settle_leaves_what_holds_no_lease_alone() -> None:
    record = _stored()
    assert settle(record, NOW + 10**9) is record
    active = apply_reserve(_stored(), at(NOW), 100, "t")
    dead = apply_nack(active, "t", at(NOW), delay_ms=0, error="x", seq=2, dead=True)
    assert settle(dead, NOW + 10**9) is dead


def test_stats_counts_every_record_and_finds_the_extremes() -> None:
    """Several records per state, out of order: counts add up, the next due time is
    the smallest of scheduled and ready ones, the lag is from the oldest ready one."""
    records = [
        _stored_at(at(NOW), id="r2", at_ms=NOW - 2_000),
        _stored_at(at(NOW - 5_000), id="r5"),  # ready since 5 s
        _stored_at(at(NOW), id="r1", at_ms=NOW - 1_000),
        _stored_at(at(NOW), id="s9", delay_ms=9_000),
        _stored_at(at(NOW), id="s3", delay_ms=3_000),
        apply_reserve(_stored_at(at(NOW), id="a1"), at(NOW), 60_000, "t"),
        apply_reserve(_stored_at(at(NOW), id="a2"), at(NOW), 60_000, "t"),
    ]
    stats = compute_stats(records, NOW)
    assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (2, 3, 2, 0)
    assert stats.next_due_at == NOW - 5_000
    assert stats.lag == 5.0
    only_scheduled = compute_stats(records[3:5], NOW)
    assert (only_scheduled.next_due_at, only_scheduled.lag) == (NOW + 3_000, 0.0)


def test_lag_of() -> None:
    assert lag_of(None, NOW) == 0.0
    assert lag_of(NOW, NOW) == 0.0
    assert lag_of(NOW + 5, NOW) == 0.0  # not due yet: no lag, never negative
    assert lag_of(NOW - 1, NOW) == 0.001
    assert lag_of(NOW - 1_500, NOW) == 1.5


def test_put_conflicts_name_the_id_and_keep_what_was_given() -> None:
    stored = _stored(encoding="bytes", headers={"k": "v"})
    assert (stored.encoding, dict(stored.headers)) == ("bytes", {"k": "v"})
    with pytest.raises(DuplicateId) as info:
        apply_put(stored, _request(on_conflict="error"), at(NOW), 2)
    assert str(info.value) == "a message with id 'm' exists"
    assert info.value.id == "m"
    active = apply_reserve(stored, at(NOW), 100, "t")
    with pytest.raises(DuplicateId) as info:
        apply_put(active, _request(on_conflict="replace"), at(NOW), 2)
    assert str(info.value) == "message 'm' is in flight: it cannot be replaced"
    assert info.value.id == "m"
    with pytest.raises(LeaseLost) as lost:
        apply_ack(active, "other", at(NOW))
    assert str(lost.value) == (
        "the lease expired or the message was reserved, acked or removed since"
    )


def test_retry_dead_settles_first_and_takes_the_new_seq() -> None:
    # A lease that expired on the last attempt: dead once settled at now.
    active = apply_reserve(_stored(max_attempts=1), at(NOW), 100, "t")
    revived = apply_retry_dead(active, at(NOW + 100), 42)
    assert revived is not None
    assert (revived.state, revived.due_at, revived.seq, revived.attempts) == (
        State.SCHEDULED,
        NOW + 100,
        42,
        0,
    )
    assert revived.last_error == "lease expired"
    assert apply_retry_dead(active, at(NOW + 99), 42) is None  # still held: not dead


def test_an_expired_lease_leaves_no_lease_behind() -> None:
    last = apply_reserve(_stored(max_attempts=1), at(NOW), 100, "t")
    dead = settle(last, NOW + 100)
    assert (dead.state, dead.lease, dead.lease_until) == (State.DEAD, None, None)
    again = settle(apply_reserve(_stored(max_attempts=2), at(NOW), 100, "t"), NOW + 100)
    assert (again.state, again.lease, again.lease_until) == (State.SCHEDULED, None, None)
    assert compute_stats([dead, again], NOW + 100).dead == 1
