"""stats(): counts per state, next_due_at (epoch ms), lag (seconds)."""

from __future__ import annotations

import time
from typing import Any

from delayq.durable import Stats


def test_empty_queue(q: Any) -> None:
    stats = q.stats()
    assert isinstance(stats, Stats)
    assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (0, 0, 0, 0)
    assert stats.next_due_at is None
    assert stats.lag == 0.0
    assert stats.total == 0


def test_counts_per_state(q: Any) -> None:
    q.put("dead", max_attempts=1)
    [dead] = q.reserve(wait=0)
    q.nack(dead, error="x")
    q.put("active")
    q.reserve(wait=0)
    later = [q.put(i, delay=60 + i) for i in range(3)]
    q.put("r1")
    q.put("r2")
    stats = q.stats()
    assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (3, 2, 1, 1)
    assert stats.total == 7
    assert stats.next_due_at <= q.get(later[0]).due_at


def test_next_due_at_is_the_earliest_waiting_message(q: Any) -> None:
    a = q.put("a", delay=120)
    q.put("b", delay=300)
    assert q.stats().next_due_at == q.get(a).due_at
    assert q.stats().lag == 0.0
    q.put("now")
    [msg] = q.reserve(wait=0)
    assert q.stats().next_due_at == q.get(a).due_at
    q.ack(msg)


def test_lag_of_the_oldest_ready_message(q: Any) -> None:
    first = q.put("first")
    time.sleep(0.1)
    before_second = time.time()
    q.put("second")
    stats = q.stats()
    assert stats.ready == 2
    assert stats.next_due_at == q.get(first).due_at
    assert 0.09 <= stats.lag < 5
    [msg] = q.reserve(wait=0)
    q.ack(msg)
    lag = q.stats().lag
    # Now the second message's: at most the time since it was put (the first one's
    # would be at least 0.1 s more), whatever the machine's load; 20 ms for the
    # millisecond rounding of due times and the two clocks' reads.
    assert lag <= time.time() - before_second + 0.02


def test_dead_and_active_do_not_count_for_next_due_or_lag(q: Any) -> None:
    q.put("x", max_attempts=1)
    [msg] = q.reserve(wait=0)
    time.sleep(0.05)
    stats = q.stats()
    assert (stats.active, stats.next_due_at, stats.lag) == (1, None, 0.0)
    q.nack(msg)
    stats = q.stats()
    assert (stats.dead, stats.next_due_at, stats.lag) == (1, None, 0.0)
