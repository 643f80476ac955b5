"""Inputs at the edge of what a queue can store: numbers no time fits, payloads nested
too deep, records it cannot decode, oversized headers. Each is a clear exception
before anything is written, the same on every face (and the same as over HTTP)."""

from __future__ import annotations

import json
import pickle
import warnings
from typing import Any

import pytest

from delayq.durable import State
from delayq.durable.message import HeadersTooLarge
from delayq.durable.serializer import PayloadTooDeep, PayloadTooManyValues

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


# -- payloads nested too deep, records of another serializer (issue 14, point 4) -------


def _nested(depth: int) -> Any:
    """A value inside ``depth`` containers: dicts, lists and tuples by turns."""
    value: Any = 1
    for level in range(depth):
        value = ({"k": value}, [value], (value,))[level % 3]
    return value


@pytest.mark.parametrize("depth", [65, 260, 5000])
def test_a_payload_nested_too_deep_is_a_value_error(q: Any, depth: int) -> None:
    with pytest.raises(PayloadTooDeep, match="more than 64"):
        q.put(_nested(depth))
    with pytest.raises(ValueError, match=r"item 1: .*more than 64"):
        q.put_many([{"payload": "fine"}, {"payload": _nested(depth)}])
    with pytest.raises(ValueError, match="more than 64"):
        q.put([["strings do not count: [[[{{{"] * 100, _nested(depth)])
    assert total(q) == 0


def test_a_payload_at_the_depth_limit_round_trips(q: Any) -> None:
    wide = [[["[{"] * 50 for _ in range(10)] for _ in range(10)]  # many brackets, shallow
    expected = json.loads(json.dumps(_nested(64)))
    msg_id = q.put(_nested(64))
    wide_id = q.put(wide)
    assert q.get(msg_id).payload == expected
    assert q.get(wide_id).payload == wide
    assert [msg.payload for msg in q.reserve(wait=0, max=5)] == [expected, wide]


def test_a_record_of_another_serializer_spoils_only_itself(make_queue: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pickle's warning
        pickled = make_queue(serializer=pickle)
    plain = make_queue(pickled.name)
    foreign = pickled.put({"made": "by pickle"})
    good = plain.put({"n": 1})
    json_read_by_pickle = plain.put({"n": 2})

    seen = plain.get(foreign)
    assert seen.payload is None
    assert "pickle" in seen.payload_error
    assert plain.get(good).payload_error is None
    assert [msg.payload for msg in plain.peek()] == [None, {"n": 1}, {"n": 2}]
    held = plain.reserve(wait=0, max=10)
    assert [(msg.id, msg.payload, msg.attempts) for msg in held] == [
        (foreign, None, 1),
        (good, {"n": 1}, 1),
        (json_read_by_pickle, {"n": 2}, 1),
    ]
    assert held[0].payload_error == seen.payload_error
    assert pickled.get(json_read_by_pickle).payload_error is not None
    assert pickled.get(foreign).payload == {"made": "by pickle"}
    assert plain.nack(held[0], dead=True) is State.DEAD
    plain.ack(held[1])
    [dead] = plain.dead()
    assert (dead.id, dead.payload, dead.payload_error) == (foreign, None, seen.payload_error)


# -- headers (issue 14, point 12) -------------------------------------------------------

LIMIT_BYTES = 64 * 1024

TOO_MANY_OR_LARGE = [
    {f"h{index}": "v" for index in range(65)},
    {"big": "x" * (LIMIT_BYTES - 2)},
    {"a": "é" * (LIMIT_BYTES // 2)},  # 2 bytes each in UTF-8: over by the name
]


@pytest.mark.parametrize("headers", TOO_MANY_OR_LARGE, ids=["65 headers", "bytes", "utf-8"])
def test_headers_too_many_or_too_large_are_a_value_error(q: Any, headers: dict[str, str]) -> None:
    with pytest.raises(HeadersTooLarge, match=r"at most 64 headers|the limit is 65536"):
        q.put("x", headers=headers)
    with pytest.raises(ValueError, match=r"item 1: .*(64 headers|65536)"):
        q.put_many([{"payload": "fine"}, {"payload": "x", "headers": headers}])
    assert total(q) == 0


def test_headers_at_the_limits_are_stored(q: Any) -> None:
    many = {f"h{index}": "v" for index in range(64)}
    large = {"big": "x" * (LIMIT_BYTES - 3)}
    wide = {"a": "é" * (LIMIT_BYTES // 2 - 1), "b": ""}  # exactly the limit
    ids = [q.put("x", headers=headers) for headers in (many, large, wide)]
    assert [dict(q.get(msg_id).headers) for msg_id in ids] == [many, large, wide]


# -- payloads of too many values (issue 33, point 2) ------------------------------------


def test_a_payload_of_too_many_values_is_a_value_error(q: Any) -> None:
    hostile: list[Any] = [[] for _ in range(340_000)]  # 1 MB of JSON, 25 MB decoded
    for payload in (hostile, {"k": [0] * 100_000}, [{"a": 1}] * 50_000):
        with pytest.raises(PayloadTooManyValues, match="more than 100000 values"):
            q.put(payload)
        with pytest.raises(ValueError, match=r"item 1: .*more than 100000 values"):
            q.put_many([{"payload": "fine"}, {"payload": payload}])
    assert total(q) == 0


def test_a_payload_at_the_value_limit_round_trips(q: Any) -> None:
    at_limit = [0] * 99_999  # the list and its 99,999 numbers: 100,000 values
    commas = ["a,b,c,[{"] * 20_000  # commas and brackets in strings count once each
    assert q.get(q.put(at_limit)).payload == at_limit
    assert q.get(q.put(commas)).payload == commas
