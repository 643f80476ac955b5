"""Inputs at the edge of what a queue can store: numbers no time fits, payloads nested
too deep, records it cannot decode, oversized headers. Each is a clear exception
before anything is written, the same on every face (and the same as over HTTP)."""

from __future__ import annotations

from typing import Any

import pytest

from delayq.durable import State

from ._helpers import total

# -- numbers out of range (issue 14, point 10) ----------------------------------------

HUGE = [1e308, 10**400, float("inf"), float("nan")]
#: What the ValueError of each says.
BOUND = "out of range|finite|at most"


@pytest.mark.parametrize("number", HUGE, ids=repr)
def test_an_out_of_range_time_is_a_value_error(q: Any, number: Any) -> None:
    msg_id = q.put("x", delay=60)
    due = q.get(msg_id).due_at
    for field in ("delay", "at"):
        with pytest.raises(ValueError, match=BOUND):
            q.put("y", **{field: number})
        with pytest.raises(ValueError, match=BOUND):
            q.put_many([{"payload": "fine"}, {"payload": "y", field: number}])
        with pytest.raises(ValueError, match=BOUND):
            q.reschedule(msg_id, **{field: number})
    with pytest.raises(ValueError, match=BOUND):
        q.reserve(wait=0, lease=number)
    with pytest.raises(ValueError, match=BOUND):
        q.reserve(wait=number)
    assert total(q) == 1
    assert q.get(msg_id).due_at == due


@pytest.mark.parametrize("number", HUGE, ids=repr)
def test_an_out_of_range_delay_or_lease_of_a_held_message_is_a_value_error(
    q: Any, number: Any
) -> None:
    q.put("x")
    [msg] = q.reserve(wait=0)
    with pytest.raises(ValueError, match=BOUND):
        q.nack(msg, delay=number)
    with pytest.raises(ValueError, match=BOUND):
        q.extend(msg, number)
    seen = q.get(msg.id)
    assert (seen.state, seen.attempts) == (State.ACTIVE, 1)
    q.ack(msg)


@pytest.mark.parametrize("field", ["delay", "at"])
def test_a_hugely_negative_time_means_now(q: Any, field: str) -> None:
    msg_id = q.put("x", **{field: -1e308})
    assert q.get(msg_id).state is State.READY
    assert q.reschedule(msg_id, **{field: -1e308})
    assert q.get(msg_id).state is State.READY
