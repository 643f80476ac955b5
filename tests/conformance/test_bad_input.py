"""Bad input on every entry point: a clear exception, and nothing written."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import pytest

from delayq.durable import State

from ._helpers import total

NAN = float("nan")
INF = float("inf")

BAD_PUT = [
    ({"delay": NAN}, ValueError),
    ({"delay": INF}, ValueError),
    ({"delay": "soon"}, ValueError),
    ({"delay": "5 minutes"}, ValueError),
    ({"delay": True}, TypeError),
    ({"delay": [1]}, TypeError),
    ({"delay": 1e300}, ValueError),
    ({"at": datetime(2030, 1, 1)}, ValueError),
    ({"at": NAN}, ValueError),
    ({"at": "tomorrow"}, TypeError),
    ({"at": 1e300}, ValueError),
    ({"delay": 1, "at": 2_000_000_000}, ValueError),
    ({"id": ""}, ValueError),
    ({"id": "x" * 256}, ValueError),
    ({"id": "nul\x00"}, ValueError),
    ({"id": 5}, TypeError),
    ({"id": b"bytes"}, TypeError),
    ({"on_conflict": "maybe"}, ValueError),
    ({"on_conflict": None}, ValueError),
    ({"max_attempts": 0}, ValueError),
    ({"max_attempts": "3"}, TypeError),
    ({"max_attempts": 2.0}, TypeError),
    ({"max_attempts": True}, TypeError),
    ({"headers": {"a": 1}}, TypeError),
    ({"headers": {1: "a"}}, TypeError),
    ({"headers": [("a", "b")]}, TypeError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_PUT, ids=lambda v: repr(v)[:40])
def test_put_rejects_bad_arguments(q: Any, kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        q.put("payload", **kwargs)
    with pytest.raises(error):
        q.put_many([{"payload": "fine"}, {"payload": "payload", **kwargs}])
    assert total(q) == 0


BAD_RESERVE = [
    ({"lease": 0}, ValueError),
    ({"lease": -1}, ValueError),
    ({"lease": NAN}, ValueError),
    ({"lease": None}, TypeError),
    ({"max": 0}, ValueError),
    ({"max": 1.5}, TypeError),
    ({"max": True}, TypeError),
    ({"wait": -1}, ValueError),
    ({"wait": NAN}, ValueError),
    ({"wait": "x"}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_RESERVE, ids=lambda v: repr(v)[:40])
def test_reserve_rejects_bad_arguments(q: Any, kwargs: dict[str, Any], error: type) -> None:
    q.put("x")
    with pytest.raises(error):
        q.reserve(**{"wait": 0, **kwargs})
    seen = q.get(q.reserve(wait=0)[0].id)
    assert seen.attempts == 1


def test_ack_nack_release_extend_reject_bad_arguments(q: Any, make_queue: Any) -> None:
    msg_id = q.put("x")
    [msg] = q.reserve(wait=0)
    from_get = q.get(msg_id)
    foreign = dataclasses.replace(msg, queue="another-queue")
    for call in (q.ack, q.nack, q.release, q.extend):
        with pytest.raises(ValueError, match="lease"):
            call(from_get)
        with pytest.raises(ValueError, match="queue"):
            call(foreign)
        with pytest.raises(TypeError):
            call(msg_id)
    with pytest.raises(ValueError, match="unknown duration"):
        q.nack(msg, delay="later")
    with pytest.raises(ValueError, match="finite"):
        q.nack(msg, delay=NAN)
    with pytest.raises(TypeError):
        q.nack(msg, error=42)
    with pytest.raises(TypeError, match="dead"):
        q.nack(msg, dead="yes")
    with pytest.raises(TypeError, match="dead"):
        q.nack(msg, dead=1)
    with pytest.raises(ValueError, match="dead"):
        q.nack(msg, delay=5, dead=True)
    with pytest.raises(TypeError):
        q.nack(msg, error=42, dead=True)
    with pytest.raises(ValueError, match="lease"):
        q.extend(msg, 0)
    with pytest.raises(ValueError, match="lease"):
        q.extend(msg, -5)
    seen = q.get(msg_id)
    assert (seen.state, seen.attempts, seen.last_error) == (State.ACTIVE, 1, None)
    q.ack(msg)


def test_id_entry_points_reject_bad_ids(q: Any) -> None:
    msg_id = q.put("x", delay=60)
    due = q.get(msg_id).due_at
    for bad, error in (("", ValueError), (None, TypeError), (7, TypeError)):
        with pytest.raises(error):
            q.get(bad)
        with pytest.raises(error):
            q.cancel(bad)
        with pytest.raises(error):
            q.reschedule(bad, delay=1)
    with pytest.raises(ValueError, match="finite"):
        q.reschedule(msg_id, delay=NAN)
    with pytest.raises(ValueError, match="not both"):
        q.reschedule(msg_id, delay=1, at=2_000_000_000)
    with pytest.raises(ValueError, match="aware"):
        q.reschedule(msg_id, at=datetime(2030, 1, 1))
    assert q.get(msg_id).due_at == due


def test_dead_letter_entry_points_reject_bad_arguments(q: Any) -> None:
    q.put("x", max_attempts=1)
    [msg] = q.reserve(wait=0)
    q.nack(msg)
    with pytest.raises(ValueError, match="limit"):
        q.dead(limit=0)
    with pytest.raises(TypeError):
        q.dead(limit="10")
    with pytest.raises(TypeError):
        q.retry_dead(msg.id)  # a bare str is not a list of ids
    with pytest.raises(ValueError, match="id"):
        q.retry_dead([msg.id, ""])
    with pytest.raises(ValueError, match="state"):
        q.purge("nope")
    with pytest.raises(ValueError, match="state"):
        q.purge(3)
    assert q.stats().dead == 1


def test_bad_queue_arguments(make_queue: Any) -> None:
    with pytest.raises(ValueError, match="name"):
        make_queue(name="")
    with pytest.raises(TypeError):
        make_queue(retry={"max_attempts": 3})
    with pytest.raises(TypeError):
        make_queue(serializer="json")
    with pytest.raises(ValueError, match="max_payload"):
        make_queue(max_payload=0)
    with pytest.raises(TypeError):
        make_queue(no_such_option=1)
