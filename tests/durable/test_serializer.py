"""The default JSON serializer reads exactly what ``json.loads`` reads.

Its ``loads`` takes a short way for the UTF-8 documents delayq writes, and leaves
everything else to ``json.loads``: the same value for any input, or the same error.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.durable.serializer import (
    Codec,
    JSONSerializer,
    PayloadTooDeep,
    PayloadTooManyValues,
    too_deep,
)

SERIALIZER = JSONSerializer()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _outcome(read: Any, data: bytes) -> tuple[str, Any]:
    try:
        value = read(data)
    except Exception as exc:
        return "raised", type(exc)
    if isinstance(value, float) and math.isnan(value):
        return "nan", None
    return "value", value


@given(json_values)
def test_what_it_writes_it_reads_back(value: Any) -> None:
    assert SERIALIZER.loads(SERIALIZER.dumps(value)) == value


@given(json_values, st.sampled_from(["", " ", "\n", "\t "]), st.sampled_from(["", " ", "\r\n"]))
def test_documents_from_elsewhere_read_as_json_loads_reads_them(
    value: Any, before: str, after: str
) -> None:
    for encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-32"):
        data = (before + json.dumps(value) + after).encode(encoding)
        assert _outcome(SERIALIZER.loads, data) == _outcome(json.loads, data)


@given(st.binary(max_size=40))
def test_any_bytes_read_or_fail_as_json_loads_does(data: bytes) -> None:
    assert _outcome(SERIALIZER.loads, data) == _outcome(json.loads, data)


def test_malformed_documents_raise_what_json_loads_raises() -> None:
    for data in (b"", b"{", b'{"a":1}{"b":2}', b'{"a":1} x', b"tru", b"\xff"):
        assert _outcome(SERIALIZER.loads, data) == _outcome(json.loads, data)


def _lists(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_the_limits_hold_at_their_edges_whatever_the_length_of_the_text() -> None:
    # A text of 2 * 64 bytes or less is not counted (it cannot open 65 containers), one
    # under 100,000 bytes cannot hold more values: the edges either side of both.
    codec = Codec()
    assert codec.encode(_lists(64))[0] == b"[" * 64 + b"]" * 64
    with pytest.raises(PayloadTooDeep):
        codec.encode(_lists(65))
    assert codec.encode([0] * 99_999)[1] == "json"  # 100,000 values with the list
    with pytest.raises(PayloadTooManyValues):
        codec.encode([0] * 100_000)
    with pytest.raises(PayloadTooManyValues):
        codec.encode([[]] * 100_000)


def test_reading_holds_the_same_limits_at_their_edges() -> None:
    # read() skips the counts on a text too short to break a limit, as encode() does:
    # what it gives back either side of both edges is what the counts would decide.
    codec = Codec()
    deepest = b"[" * 64 + b"]" * 64  # 128 bytes: not counted
    assert codec.read(deepest, "json") == (_lists(64), None)
    payload, error = codec.read(b"[" * 65 + b"]" * 65, "json")  # 130 bytes: counted
    assert payload is None
    assert error is not None
    assert "nests more than 64" in error
    padded = b"[" * 65 + b"]" * 65 + b" " * 10  # longer, the same refusal
    assert codec.read(padded, "json")[1] == error
    many = json.dumps([0] * 99_999, separators=(",", ":")).encode()  # 100,000 values
    assert codec.read(many, "json") == ([0] * 99_999, None)
    payload, error = codec.read(json.dumps([0] * 100_000).encode(), "json")
    assert payload is None
    assert error is not None
    assert "more than 100000 values" in error


@given(json_values)
def test_a_short_text_reads_as_a_long_one(value: Any) -> None:
    data = json.dumps(value).encode()
    assert Codec().read(data, "json") == (json.loads(data), None)
    padded = data + b" " * 200  # past every short cut: counted, then read in full
    assert Codec().read(padded, "json") == (json.loads(padded), None)


@pytest.mark.parametrize("wrap", [list, tuple, lambda items: dict(enumerate(items))])
def test_an_empty_container_counts_at_the_depth_limit_beside_many_others(wrap: Any) -> None:
    # Beside a thousand empty containers (walked without stacking each): an empty list
    # at depth 65 is too deep, at 64 it is not.
    many: list[Any] = [[] for _ in range(1000)]
    assert too_deep(wrap([*many, _lists(64)]))
    assert not too_deep(wrap([*many, _lists(63)]))
    assert not too_deep(wrap(many))
    assert too_deep(_lists(65))
    assert not too_deep(_lists(64))


class _OtherJSON:
    """A serializer that is not delayq's JSON (read through its own loads, then walked
    for the limits)."""

    name = "other-json"

    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


_READ_CASES = [
    b"{}",
    b'{"task":"job","args":[1,2],"kwargs":{}}',
    b"not json",
    b"\xff\xfe",
    b"[1] [2]",
    _nested(64),
    _nested(65),
    _nested(65) + b" " * 10,
    _nested(200),
    json.dumps([0] * 99_999, separators=(",", ":")).encode(),
    json.dumps([0] * 100_000).encode(),
    json.dumps([[]] * 60_000, separators=(",", ":")).encode(),
]


@pytest.mark.parametrize("serializer", [None, _OtherJSON()])
@pytest.mark.parametrize("encoding", ["json", "other-json", "bytes"])
@pytest.mark.parametrize("data", _READ_CASES, ids=range(len(_READ_CASES)))
def test_read_gives_what_each_limit_and_failure_decides(
    serializer: Any, encoding: str, data: bytes
) -> None:
    """Codec.read, for delayq's JSON and for another serializer, gives back the payload,
    or None with why: raw bytes as they are, an undecodable text, too deep, too many
    values (each checked in that order), whatever short cut it takes."""
    codec = Codec(serializer)
    payload, error = codec.read(data, encoding)
    if encoding == "bytes":
        assert (payload, error) == (data, None)
        return
    try:
        value = json.loads(data)
    except ValueError as exc:
        why = " ".join(str(exc).split())[:200]
        value = None
    else:
        why = None
    if why is not None:
        assert payload is None
        assert error == (
            f"the payload (encoding {encoding!r}) cannot be decoded by this queue's "
            f"serializer ({codec.encoding}): {why}"
        )
        return
    if too_deep(value):
        assert (payload, error) == (
            None,
            "the payload nests more than 64 dicts/lists one inside the other: it cannot be shown",
        )
    elif data.count(b",") >= 99_999:
        assert payload is None
        assert error is not None
        assert "more than 100000 values" in error
    else:
        assert (payload, error) == (value, None)
