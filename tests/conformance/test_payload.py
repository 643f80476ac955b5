"""Payload rules: JSON round trip, bytes untouched, TypeError, PayloadTooLarge."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from delayq import PayloadTooLarge

from ._helpers import total

ROUND_TRIP = [
    {"order": 42, "items": [1, 2.5, None, True], "name": "Zoë ✓"},
    [1, "two", {"three": 3}],
    "plain text",
    12345678901234567890,
    -0.5,
    None,
    False,
    {},
]


@pytest.mark.parametrize("payload", ROUND_TRIP, ids=lambda p: type(p).__name__)
def test_json_round_trip(q: Any, payload: Any) -> None:
    msg_id = q.put(payload)
    assert q.get(msg_id).payload == payload
    [msg] = q.reserve(wait=0)
    assert msg.payload == payload


def test_tuples_come_back_as_lists(q: Any) -> None:
    q.put({"pair": (1, 2)})
    [msg] = q.reserve(wait=0)
    assert msg.payload == {"pair": [1, 2]}


@pytest.mark.parametrize(
    "payload", [b"", b"\x00\xff\xfe raw", bytes(range(256)), bytearray(b"abc"), memoryview(b"mv")]
)
def test_bytes_pass_through_untouched(q: Any, payload: Any) -> None:
    msg_id = q.put(payload)
    got = q.get(msg_id).payload
    assert type(got) is bytes
    assert got == bytes(payload)


def test_bytes_that_look_like_json_stay_bytes(q: Any) -> None:
    q.put(b'{"a": 1}')
    [msg] = q.reserve(wait=0)
    assert msg.payload == b'{"a": 1}'


@pytest.mark.parametrize(
    "payload", [object(), {1, 2}, {"nan": float("nan")}, {"inf": float("inf")}, {(1,): "tuple key"}]
)
def test_unserializable_payload_raises_type_error_and_stores_nothing(q: Any, payload: Any) -> None:
    with pytest.raises(TypeError):
        q.put(payload)
    with pytest.raises(TypeError):
        q.put(payload, id="fixed")
    assert total(q) == 0


def test_circular_payload_raises_type_error(q: Any) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TypeError):
        q.put(loop)
    assert total(q) == 0


def test_default_size_limit_is_one_mebibyte(q: Any) -> None:
    limit = 1024 * 1024
    q.put(b"x" * limit)
    with pytest.raises(PayloadTooLarge):
        q.put(b"x" * (limit + 1))
    with pytest.raises(PayloadTooLarge):
        q.put("y" * limit)
    assert total(q) == 1


def test_size_limit_is_configurable(make_queue: Any) -> None:
    q = make_queue(max_payload=100)
    q.put(b"x" * 100)
    with pytest.raises(PayloadTooLarge):
        q.put(b"x" * 101)
    with pytest.raises(ValueError, match="limit"):
        q.put({"text": "z" * 200})
    unlimited = make_queue(max_payload=None)
    unlimited.put(b"x" * (2 * 1024 * 1024))
    assert total(q) == 1


class _Upper:
    """A toy serializer: JSON with upper-cased strings on the way in."""

    name = "upper"

    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj.upper() if isinstance(obj, str) else obj).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


def test_custom_serializer(make_queue: Any) -> None:
    q = make_queue(serializer=_Upper())
    q.put("shout")
    q.put(b"raw bytes")
    assert [m.payload for m in q.reserve(wait=0, max=2)] == ["SHOUT", b"raw bytes"]


def test_a_module_with_str_dumps_works_as_serializer(make_queue: Any) -> None:
    q = make_queue(serializer=json)
    q.put({"k": [1, 2]})
    [msg] = q.reserve(wait=0)
    assert msg.payload == {"k": [1, 2]}


def test_pickle_is_opt_in_with_a_warning(make_queue: Any) -> None:
    with pytest.warns(UserWarning, match="pickle"):
        q = make_queue(serializer=pickle)
    q.put({1, 2, 3})
    [msg] = q.reserve(wait=0)
    assert msg.payload == {1, 2, 3}
