"""A payload filled into a :class:`DictTemplate` (``App.send_many``'s task envelope,
its fixed part written once per task) is stored byte for byte as the dict it stands
for, and refused as that dict is, with the same exception type and text: for every
codec (delayq's JSON at any ``max_payload``, a user's serializer), over values of many
shapes (nested, unicode, big ints, floats, bytes, sets, tuples, circular, too deep,
too many values, brackets inside strings, past the size limit), and for template
values the JSON path cannot write."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from delayq.durable.serializer import Codec, DictTemplate, Filled, JSONSerializer

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["\u2028", '"\\', "[[[[{{{{", "é\x00\n", "\ud800"]),
    st.binary(max_size=4),
    st.just({1, 2}),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(
            st.one_of(st.text(max_size=4), st.integers(), st.none()), inner, max_size=3
        ),
    ),
    max_leaves=12,
)


def _deep(depth: int) -> object:
    payload: object = 1
    for _ in range(depth):
        payload = [payload]
    return payload


def _circular() -> list[Any]:
    loop: list[Any] = [1]
    loop.append(loop)
    return loop


special = st.sampled_from(
    [
        _deep(61),  # within the depth limit inside the envelope
        _deep(63),  # the envelope's own level makes it one too deep
        _deep(200),
        [_deep(30), _deep(30)],
        "[" * 300,  # brackets in a string: counted, then walked
        ["x" * 50] * 4,  # past 128 bytes, within every limit
        list(range(100_001)),  # too many values
        "é" * 400,  # past the smaller max_payload in bytes, not in characters
        _circular(),
        {"k": _circular()},
        math.nan,
    ]
)
arguments = st.one_of(st.lists(st.one_of(values, special), max_size=3).map(tuple), values)
keywords = st.one_of(
    st.just({}),
    st.dictionaries(st.text(max_size=3), st.one_of(values, special), max_size=2),
    values,
)
names = st.one_of(st.just("job"), st.text(max_size=10), st.sampled_from(["é\u2028\"'", "a" * 200]))
codecs = st.sampled_from(
    [
        Codec(),
        Codec(None, 64),
        Codec(None, 300),
        Codec(JSONSerializer(), 1 << 20),
        Codec(json, None),  # a user's serializer: the dict's own path
    ]
)


def _outcome(codec: Codec, payload: object) -> tuple[str, Any]:
    try:
        return "ok", codec.encode(payload)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=400)
@given(codec=codecs, name=names, first=arguments, second=keywords)
@example(codec=Codec(), name="job", first=("\ud800",), second={})
@example(codec=Codec(), name="job", first=(), second={"\udfff": 1})
@example(codec=Codec(), name="\ud800", first=(), second={})
@example(codec=Codec(), name="job", first=(math.inf,), second={})
def test_a_filled_template_encodes_as_its_dict(
    codec: Codec, name: str, first: Any, second: Any
) -> None:
    template = DictTemplate({"task": name}, ("args", "kwargs"))
    filled = _outcome(codec, Filled((template, first, second)))
    plain = _outcome(codec, {"task": name, "args": first, "kwargs": second})
    assert filled == plain


@given(codec=codecs, fixed=st.dictionaries(st.text(max_size=3), values, max_size=3), first=values)
def test_any_fixed_part_encodes_as_its_dict(
    codec: Codec, fixed: dict[str, Any], first: Any
) -> None:
    fixed = {k: v for k, v in fixed.items() if k not in ("a", "b")}
    template = DictTemplate(fixed, ("a", "b"))
    filled = _outcome(codec, Filled((template, first, {})))
    plain = _outcome(codec, {**fixed, "a": first, "b": {}})
    assert filled == plain


def test_a_circular_value_is_refused_as_the_dict_is() -> None:
    codec = Codec()
    template = DictTemplate({"task": "job"}, ("args", "kwargs"))
    with pytest.raises(TypeError, match="Circular reference detected"):
        codec.encode(Filled((template, (_circular(),), {})))


@pytest.mark.parametrize(
    ("fixed", "keys", "error"),
    [
        ({"task": "job"}, ("args",), TypeError),
        ({"task": "job"}, ("args", "kwargs", "more"), TypeError),
        ({1: "job"}, ("args", "kwargs"), TypeError),
        ({"task": "job"}, ("task", "kwargs"), ValueError),
        ({"task": "job"}, ("args", "args"), ValueError),
    ],
)
def test_a_template_has_str_keys_and_two_that_vary(
    fixed: dict[Any, Any], keys: tuple[str, ...], error: type[Exception]
) -> None:
    with pytest.raises(error):
        DictTemplate(fixed, keys)  # type: ignore[arg-type]
