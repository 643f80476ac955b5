"""The put's arguments of a request whose id the facade drew (packed without checking
its form, issue 38) are those of the same request with the id given: the plain path,
but for the on_conflict of a uniform batch of drawn ids ('n': stored without looking;
what such a batch stores is tested equal to the plain path's in test_redis.py)."""

from __future__ import annotations

import dataclasses

import pytest

from delayq.durable.message import PutRequest
from delayq.durable.serializer import Codec

pytest.importorskip("redis")

from delayq.backends.redis._scripts import put_args, put_one_args
from delayq.durable.facade import build_request


def _given(request: PutRequest) -> PutRequest:
    return dataclasses.replace(request, generated_id=False)


@pytest.mark.parametrize(
    "options",
    [{}, {"delay": 5}, {"max_attempts": 2, "headers": {"h": "v"}}],
    ids=["uniform", "delay", "headers"],
)
def test_drawn_ids_pack_as_given_ones(options: dict[str, object]) -> None:
    codec = Codec()
    drawn = [build_request(codec, 3, {"n": i}, **options) for i in range(300)]  # type: ignore[arg-type]
    drawn.append(build_request(codec, 3, "mixed", id="chosen"))
    assert all(r.generated_id for r in drawn[:-1])
    given = [_given(r) for r in drawn]
    assert put_args(drawn) == put_args(given)
    alike, plain = put_args(drawn[:-1]), put_args(given[:-1])
    if "headers" in options:  # not the uniform form: no shared on_conflict
        assert alike == plain
    else:
        assert alike[0] == -300
        assert (alike[1], plain[1]) == (b"n", b"i")
        assert alike[2:] == plain[2:]
    assert put_args(drawn, [7] * len(drawn)) == put_args(given, [7] * len(given))
    assert put_one_args(drawn[0]) == put_one_args(given[0])
    packed = [a for a in put_args(drawn) if isinstance(a, bytes) and a[:1] == b"\x00"]
    assert len(packed) == 300  # the 16 bytes' form
