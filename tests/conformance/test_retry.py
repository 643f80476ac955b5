"""nack, the retry policy's backoff, dead letters, retry_dead and purge."""

from __future__ import annotations

import time
from typing import Any

import pytest

from delayq import LeaseLost
from delayq.durable import RetryPolicy, State

from ._helpers import ceil_ms, now_ms


def test_nack_without_delay_uses_the_retry_policy(make_queue: Any) -> None:
    q = make_queue(retry=RetryPolicy(max_attempts=5, base=2.0, factor=3.0, jitter=0))
    msg_id = q.put("x")
    for attempt, expected_ms in ((1, 2000), (2, 6000), (3, 18000)):
        [msg] = q.reserve(wait=0)
        assert msg.attempts == attempt
        before = now_ms()
        assert q.nack(msg, error=f"fail {attempt}") is State.SCHEDULED
        seen = q.get(msg_id)
        assert seen.state is State.SCHEDULED
        assert seen.last_error == f"fail {attempt}"
        assert before + expected_ms <= seen.due_at <= ceil_ms() + expected_ms + 1
        assert q.reschedule(msg_id, delay=0)


def test_backoff_is_capped_and_jittered(make_queue: Any) -> None:
    q = make_queue(retry=RetryPolicy(base=10.0, factor=10.0, max_delay=30.0, jitter=0.5))
    msg_id = q.put("x")
    for _ in range(3):
        [msg] = q.reserve(wait=0)
        before = now_ms()
        q.nack(msg)
        due = q.get(msg_id).due_at
        assert before + 4_999 <= due <= ceil_ms() + 30_000 + 1
        assert q.reschedule(msg_id, delay=0)


def test_nack_with_delay(q: Any) -> None:
    msg_id = q.put("x")
    [msg] = q.reserve(wait=0)
    before = now_ms()
    # Long enough that the two calls after it never reach its due time (a slow broker
    # on a loaded machine took more than 2 s for them); the reschedule ends it.
    q.nack(msg, delay="30s")
    assert before + 30_000 <= q.get(msg_id).due_at <= ceil_ms() + 30_000
    assert q.reserve(wait=0) == []
    assert q.reschedule(msg_id, delay=0)
    [msg] = q.reserve(wait=0)
    assert msg.attempts == 2
    q.nack(msg, delay=0)
    [again] = q.reserve(wait=0)
    assert again.attempts == 3


def test_after_the_last_attempt_the_message_is_dead_with_its_last_error(q: Any) -> None:
    msg_id = q.put({"order": 7}, max_attempts=2)
    [msg] = q.reserve(wait=0)
    assert q.nack(msg, delay=0, error="first failure") is State.SCHEDULED
    [msg] = q.reserve(wait=0)
    assert msg.attempts == 2
    assert q.nack(msg, delay=0, error=RuntimeError("second failure")) is State.DEAD
    seen = q.get(msg_id)
    assert seen.state is State.DEAD
    assert seen.attempts == 2
    assert seen.last_error == "RuntimeError: second failure"
    assert q.reserve(wait=0) == []
    [dead] = q.dead()
    assert dead.id == msg_id
    assert dead.payload == {"order": 7}
    assert dead.lease is None
    assert q.stats().dead == 1


def test_queue_retry_policy_sets_max_attempts(make_queue: Any) -> None:
    q = make_queue(retry=RetryPolicy(max_attempts=1))
    msg_id = q.put("x")
    assert q.get(msg_id).max_attempts == 1
    [msg] = q.reserve(wait=0)
    assert q.nack(msg) is State.DEAD
    other = q.put("y", max_attempts=3)
    assert q.get(other).max_attempts == 3


def test_dead_is_oldest_first_and_limited(q: Any) -> None:
    ids = [q.put(i, max_attempts=1) for i in range(5)]
    for _ in ids:
        [msg] = q.reserve(wait=0)
        q.nack(msg, error="x")
    assert [m.id for m in q.dead()] == ids
    assert [m.id for m in q.dead(limit=2)] == ids[:2]
    assert all(m.state is State.DEAD for m in q.dead())


def test_retry_dead_makes_messages_ready_with_attempts_reset(q: Any) -> None:
    ids = [q.put(i, max_attempts=1) for i in range(3)]
    for _ in ids:
        [msg] = q.reserve(wait=0)
        q.nack(msg, error="boom")
    q.put("alive", delay=60)
    assert q.retry_dead([ids[1], "unknown-id"]) == 1
    seen = q.get(ids[1])
    assert seen.state is State.READY
    assert seen.attempts == 0
    assert q.stats().dead == 2
    assert q.retry_dead() == 2
    assert q.retry_dead() == 0
    assert q.stats().dead == 0
    got = q.reserve(wait=0, max=10)
    assert sorted(m.id for m in got) == sorted(ids)
    assert all(m.attempts == 1 for m in got)


def test_retry_dead_revives_messages_in_the_order_they_died(q: Any, backend_url: str) -> None:
    first, second, third = (q.put(i) for i in range(3))
    held = {m.id: m for m in q.reserve(wait=0, max=3)}
    for id in (third, first, second):
        q.nack(held[id], dead=True)
    assert [m.id for m in q.dead()] == [third, first, second]
    assert q.retry_dead() == 3
    revived = [m.id for m in q.reserve(wait=0, max=3)]
    if "shards=" in backend_url:  # each shard revives its own, in order: not across them
        assert sorted(revived) == sorted([third, first, second])
    else:
        assert revived == [third, first, second]


def test_retry_dead_revives_a_message_whose_last_lease_ran_out_unseen(q: Any) -> None:
    """Its lease ran out on its last attempt and nothing has looked since: it is dead
    already, and retry_dead (the first call that sees it) revives it."""
    msg_id = q.put("x", max_attempts=1)
    q.reserve(wait=0, lease=0.05)
    time.sleep(0.15)
    assert q.retry_dead([msg_id]) == 1
    seen = q.get(msg_id)
    assert seen.state is State.READY
    assert seen.attempts == 0


def test_retry_dead_ignores_messages_that_are_not_dead(q: Any) -> None:
    msg_id = q.put("x")
    assert q.retry_dead([msg_id]) == 0
    assert q.get(msg_id).attempts == 0


def test_purge_by_state_and_all(q: Any) -> None:
    q.put("scheduled", delay=60)
    q.put("dead", max_attempts=1)
    [dead] = q.reserve(wait=0)
    q.nack(dead, error="x")
    q.put("active")
    [active] = q.reserve(wait=0)
    q.put("ready")
    stats = q.stats()
    assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (1, 1, 1, 1)
    assert q.purge(State.DEAD) == 1
    assert q.purge("ready") == 1
    assert q.stats().dead == 0
    assert q.purge(State.SCHEDULED) == 1
    q.put("more")
    assert q.purge() == 2
    assert q.stats().total == 0
    assert active.payload == "active"


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_attempts_count_reservations(q: Any, max_attempts: int) -> None:
    msg_id = q.put("x", max_attempts=max_attempts)
    for attempt in range(1, max_attempts + 1):
        [msg] = q.reserve(wait=0)
        assert msg.attempts == attempt
        state = q.nack(msg, delay=0)
        assert state is (State.DEAD if attempt == max_attempts else State.SCHEDULED)
    assert q.get(msg_id).state is State.DEAD


def test_nack_dead_sends_the_message_to_dead_at_once_whatever_its_attempts(q: Any) -> None:
    msg_id = q.put({"bad": True}, max_attempts=5)
    q.put("next")
    [msg] = q.reserve(wait=0)
    assert q.nack(msg, error=ValueError("malformed"), dead=True) is State.DEAD
    seen = q.get(msg_id)
    assert (seen.state, seen.attempts, seen.last_error) == (
        State.DEAD,
        1,
        "ValueError: malformed",
    )
    assert [m.id for m in q.dead()] == [msg_id]
    assert [m.payload for m in q.reserve(wait=0, max=5)] == ["next"]
    stats = q.stats()
    assert (stats.dead, stats.active, stats.next_due_at) == (1, 1, None)
    assert q.retry_dead() == 1
    [again] = q.reserve(wait=0)
    assert (again.id, again.attempts) == (msg_id, 1)
    assert q.nack(again, dead=True) is State.DEAD
    assert q.get(msg_id).last_error is None


def test_nack_dead_needs_the_held_lease(q: Any) -> None:
    msg_id = q.put("x", max_attempts=5)
    [msg] = q.reserve(wait=0)
    q.ack(msg)
    with pytest.raises(LeaseLost):
        q.nack(msg, error="late", dead=True)
    assert q.get(msg_id) is None

    msg_id = q.put("y", max_attempts=5)
    [stale] = q.reserve(wait=0, lease=0.05)
    time.sleep(0.12)
    with pytest.raises(LeaseLost):
        q.nack(stale, error="late", dead=True)
    seen = q.get(msg_id)
    assert (seen.state, seen.attempts, seen.last_error) == (State.READY, 1, "lease expired")
    [current] = q.reserve(wait=0)
    with pytest.raises(LeaseLost):
        q.nack(stale, dead=True)
    assert q.get(msg_id).state is State.ACTIVE
    assert q.nack(current, dead=True) is State.DEAD
