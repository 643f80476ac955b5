"""``put`` and ``reschedule`` decide a delay given as an int or a float without the
duration parser (the hot path); these tests hold that fast path to the plain one,
:func:`delayq._duration.deadline_from`: for every delay, the same deadline, due at once
exactly when the plain deadline is now, and the same exception with the same message.
"""

from __future__ import annotations

import asyncio
import math
import queue as stdlib_queue
import sys
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq import AsyncDelayQueue, DelayQueue, FakeClock, HeapStore
from delayq._duration import deadline_from

WALL = 1_700_000_000.0
BIG = sys.float_info.max


class Seconds(float):
    pass


class Count(int):
    pass


EDGES: list[object] = [
    None,
    0,
    0.0,
    -0.0,
    1,
    -1,
    30,
    0.25,
    -1e-9,
    5e-324,
    -5e-324,
    1e300,
    1e308,
    BIG,
    -BIG,
    2**1023,
    2**1024,
    -(2**1024),
    10**400,
    -(10**400),
    math.inf,
    -math.inf,
    math.nan,
    -math.nan,
    True,
    False,
    Seconds(2.5),
    Count(-3),
    "30",
    "-5s",
    "soon",
    timedelta(seconds=3),
    b"1",
    [1],
]


def outcome(call: Any) -> tuple[object, ...]:
    try:
        return ("ok", call())
    except Exception as exc:  # the answer for bad input, compared as it is
        return ("raises", type(exc), str(exc))


def plain(delay: object, now: float) -> tuple[object, ...]:
    return outcome(lambda: deadline_from(delay, None, now, WALL))


def check_put(delay: object, now: float) -> None:
    """A put of ``delay`` on a queue whose clock reads ``now``: the plain answer, and
    the item due at once exactly when its deadline is now."""
    q: DelayQueue[str] = DelayQueue(HeapStore(), clock=FakeClock(monotonic=now, wall=WALL))
    expected = plain(delay, now)
    got = outcome(lambda: q.put("x", delay=delay).deadline)
    assert got == expected, delay
    if got[0] == "ok":
        try:
            due = [q.get_nowait()]
        except stdlib_queue.Empty:
            due = []
        assert due == (["x"] if expected[1] == now else []), delay
    else:
        assert len(q) == 0  # refused before anything was written


def check_reschedule(delay: object, now: float) -> None:
    q: DelayQueue[str] = DelayQueue(HeapStore(), clock=FakeClock(monotonic=now, wall=WALL))
    handle = q.put("x", delay=1.0)
    expected = plain(delay, now)
    got = outcome(lambda: q.reschedule(handle, delay=delay) and handle.deadline)
    assert got == expected, delay
    if got[0] == "raises":
        assert handle.deadline == now + 1.0  # unchanged


@pytest.mark.parametrize("now", [1_000.0, 0.0, 1e308], ids=["now", "zero", "near-max"])
@pytest.mark.parametrize("delay", EDGES, ids=lambda delay: repr(delay)[:24])
def test_put_and_reschedule_answer_as_the_plain_path(delay: object, now: float) -> None:
    check_put(delay, now)
    check_reschedule(delay, now)


def test_the_async_face_answers_alike() -> None:
    async def run() -> None:
        clock = FakeClock(monotonic=1_000.0, wall=WALL)
        q: AsyncDelayQueue[str] = AsyncDelayQueue(HeapStore(), clock=clock)
        for delay in EDGES:
            assert outcome(lambda d=delay: q.put("x", delay=d).deadline) == plain(delay, 1_000.0)

    asyncio.run(run())


@given(
    delay=st.one_of(
        st.integers(),
        st.integers(min_value=-(2**1100), max_value=2**1100),
        st.floats(),
        st.floats(min_value=-1e-6, max_value=1e-6),
    ),
    now=st.one_of(st.floats(min_value=0.0, max_value=1e9), st.floats(min_value=0.0, max_value=BIG)),
)
def test_any_int_or_float_gets_the_plain_answer(delay: float, now: float) -> None:
    check_put(delay, now)
    check_reschedule(delay, now)
