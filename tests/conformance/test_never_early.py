"""Never early, below the millisecond: a message given a delay is never reserved
before that delay has passed, whatever fraction of a millisecond "now" fell on.

Each check measures, with ``time.time()`` (the clock every backend under test reads:
they run on this machine), from just before the call that sets the delay to just
after ``reserve`` returned the message: the message was claimed inside that span and
the delay started inside it, so the span can never be shorter than the delay. With
due times computed from the floor of now this failed for most short delays (the
message came up to 1 ms early).
"""

from __future__ import annotations

import random
import time
from typing import Any

REPEATS = 50
#: float seconds near 1.7e9 resolve ~0.24 us; a microsecond covers their rounding.
RESOLUTION = 1e-6


def _delays(seed: int) -> list[float]:
    """5 to 20 ms, whole milliseconds: the facade rounds a fraction of a millisecond
    up, which would hide up to 1 ms of earliness from the check."""
    rng = random.Random(seed)
    return [rng.randint(5, 20) / 1000 for _ in range(REPEATS)]


def _early(spans: list[tuple[float, float]]) -> list[str]:
    return [
        f"delay {delay * 1000:.3f} ms, reserved after {span * 1000:.3f} ms"
        for delay, span in spans
        if span < delay - RESOLUTION
    ]


def test_put_with_a_delay_is_never_reserved_early(q: Any) -> None:
    spans = []
    for delay in _delays(1):
        started = time.time()
        q.put("x", delay=delay)
        [msg] = q.reserve(wait=1)
        spans.append((delay, time.time() - started))
        q.ack(msg)
    assert _early(spans) == []


def test_nack_with_a_delay_is_never_reserved_early(q: Any) -> None:
    q.put("x", max_attempts=REPEATS + 1)
    [msg] = q.reserve(wait=0)
    spans = []
    for delay in _delays(2):
        started = time.time()
        q.nack(msg, delay=delay)
        [msg] = q.reserve(wait=1)
        spans.append((delay, time.time() - started))
    q.ack(msg)
    assert _early(spans) == []


def test_reschedule_with_a_delay_is_never_reserved_early(q: Any) -> None:
    spans = []
    for delay in _delays(3):
        msg_id = q.put("x", delay=3600)
        started = time.time()
        assert q.reschedule(msg_id, delay=delay)
        [msg] = q.reserve(wait=1)
        spans.append((delay, time.time() - started))
        q.ack(msg)
    assert _early(spans) == []
