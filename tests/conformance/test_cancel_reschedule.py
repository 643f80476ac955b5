"""cancel and reschedule in every state."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from delayq.durable import State

from ._helpers import ceil_ms, in_thread, now_ms


def _dead(q: Any) -> str:
    msg_id = q.put("dead", max_attempts=1)
    [msg] = q.reserve(wait=0)
    q.nack(msg, error="x")
    return msg_id


def test_cancel_in_every_state(q: Any) -> None:
    dead = _dead(q)
    active_id = q.put("a")
    [active] = q.reserve(wait=0)
    scheduled = q.put("s", delay=60)
    ready = q.put("r")
    states = {i: q.get(i).state for i in (dead, active_id, scheduled, ready)}
    assert list(states.values()) == [State.DEAD, State.ACTIVE, State.SCHEDULED, State.READY]
    assert q.cancel(active_id) is False
    assert q.get(active_id).state is State.ACTIVE
    for msg_id in (dead, scheduled, ready):
        assert q.cancel(msg_id) is True
        assert q.get(msg_id) is None
        assert q.cancel(msg_id) is False
    assert q.cancel("unknown") is False
    q.ack(active)
    assert q.stats().total == 0


def test_cancel_after_a_lease_expired(q: Any) -> None:
    msg_id = q.put("x")
    # A lease long enough for the cancel's round trip on every backend (kafka's on its
    # test broker is ~10 ms, several times that under load; a loaded CI run saw more
    # than 0.2 s between two calls), short enough to wait out.
    [_msg] = q.reserve(wait=0, lease=1.0)
    assert q.cancel(msg_id) is False
    time.sleep(1.1)
    assert q.cancel(msg_id) is True
    assert q.get(msg_id) is None
    assert q.reserve(wait=0) == []


def test_cancel_wakes_nothing_and_is_not_delivered(q: Any) -> None:
    msg_id = q.put("x", delay=0.1)
    assert q.cancel(msg_id)
    assert q.reserve(wait=0.3) == []


def test_reschedule_scheduled_and_ready(q: Any) -> None:
    scheduled = q.put("s", delay=60)
    ready = q.put("r")
    before = now_ms()
    assert q.reschedule(scheduled, delay=0) is True
    assert q.get(scheduled).state is State.READY
    assert q.reschedule(ready, delay=120) is True
    seen = q.get(ready)
    assert seen.state is State.SCHEDULED
    assert before + 120_000 <= seen.due_at <= ceil_ms() + 120_000
    at = time.time() + 30
    assert q.reschedule(ready, at=at)
    assert q.get(ready).due_at == math.ceil(at * 1000)
    [msg] = q.reserve(wait=0, max=5)
    assert msg.id == scheduled


def test_reschedule_without_a_time_is_refused_and_moves_nothing(q: Any) -> None:
    msg_id = q.put("x", delay=60)
    due = q.get(msg_id).due_at
    with pytest.raises(TypeError, match="delay or at"):
        q.reschedule(msg_id)
    with pytest.raises(TypeError, match="delay or at"):
        q.reschedule(msg_id, delay=None, at=None)
    assert q.get(msg_id).due_at == due
    assert q.reserve(wait=0) == []


def test_reschedule_in_flight_dead_or_unknown_is_false(q: Any) -> None:
    dead = _dead(q)
    q.put("a")
    [active] = q.reserve(wait=0)
    assert q.reschedule(active.id, delay=10) is False
    assert q.reschedule(dead, delay=10) is False
    assert q.reschedule("unknown", delay=0) is False
    assert q.get(active.id).state is State.ACTIVE
    assert q.get(dead).state is State.DEAD
    q.ack(active)


def test_rescheduled_message_goes_behind_those_already_due(q: Any) -> None:
    first = q.put("first")
    q.put("second")
    time.sleep(0.01)
    assert q.reschedule(first, delay=0)
    assert [m.payload for m in q.reserve(wait=0, max=2)] == ["second", "first"]


def test_reschedule_earlier_wakes_a_waiting_reserve(q: Any) -> None:
    msg_id = q.put("x", delay=60)
    waiting = in_thread(q.reserve, wait=10)
    time.sleep(0.1)
    started = time.monotonic()
    assert q.reschedule(msg_id, delay=0.05)
    [msg] = waiting.result(5)
    assert msg.id == msg_id
    assert time.monotonic() - started < 3


def test_reschedule_later_is_not_delivered_early(q: Any) -> None:
    msg_id = q.put("x", delay=0.05)
    assert q.reschedule(msg_id, delay=60)
    assert q.reserve(wait=0.2) == []
    assert q.get(msg_id).state is State.SCHEDULED
