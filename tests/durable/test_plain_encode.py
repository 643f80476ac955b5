"""A plain payload in delayq's JSON (``Codec.encode`` of a dict, list, str, number...),
which is written by a C encoder shared by every thread and without the table of the
containers it is inside, is stored byte for byte as ``JSONSerializer.dumps`` writes it,
and refused with the same exception type and text: over values of many shapes (nested,
unicode, lone surrogates, NaN, big ints, bytes, sets, circular, too deep, too many
values, past the size limit), at any ``max_payload``, and from many threads at once."""

from __future__ import annotations

import threading
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from delayq.durable.serializer import Codec, JSONSerializer

from .test_dict_template import _circular, _deep, _outcome, special, values


class _DumpsPath(JSONSerializer):
    """delayq's JSON, taken through ``dumps()`` and the payload walk every other
    serializer gets (Codec takes its own path for JSONSerializer alone)."""


payloads = st.one_of(values, special, st.lists(st.one_of(values, special), max_size=3))
limits = st.sampled_from([None, 64, 300, 1 << 20])


@settings(max_examples=500)
@given(payload=payloads, max_payload=limits)
@example(payload="\ud800", max_payload=None)
@example(payload={"\udfff": 1}, max_payload=None)
@example(payload=_circular(), max_payload=None)
@example(payload={"k": [_circular()]}, max_payload=64)
@example(payload=_deep(5000), max_payload=None)
@example(payload=[float("nan")], max_payload=None)
@example(payload=2**200, max_payload=None)
@example(payload={(1, 2): 3}, max_payload=None)
def test_a_plain_payload_encodes_as_dumps_writes_it(payload: Any, max_payload: int | None) -> None:
    fast = _outcome(Codec(None, max_payload), payload)
    plain = _outcome(Codec(_DumpsPath(), max_payload), payload)
    assert fast == plain


def test_threads_sharing_the_encoder_each_get_their_own_payload() -> None:
    codec = Codec()
    payloads = [
        {"n": n, "items": [str(n) * (n % 7), {"x": [n] * (n % 5)}], "é": n / 3} for n in range(64)
    ]
    expected = [JSONSerializer().dumps(payload) for payload in payloads]
    wrong: list[int] = []
    start = threading.Barrier(8)

    def run(offset: int) -> None:
        start.wait()
        for round_ in range(300):
            n = (offset + round_) % len(payloads)
            if round_ % 50 == 0:
                # A refusal halfway through (a circular value) leaves no state behind.
                assert _outcome(codec, {"a": _circular()})[0] == "TypeError"
            if codec.encode(payloads[n])[0] != expected[n]:
                wrong.append(n)

    threads = [threading.Thread(target=run, args=(i * 8,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
