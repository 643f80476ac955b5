"""The consumer's view of a sharded queue's heads (``ShardView``, no I/O): which shard a
claim goes to and how far it may reach, so that global due order holds across shards."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("redis")

from delayq._fork import new_id
from delayq.backends.redis._scripts import Claim
from delayq.backends.redis._shards import ShardView, shard_of


def _now_ms() -> int:
    return int(time.time() * 1000)


def _learn(view: ShardView, shard: int, head: int | None, seq: int = 1) -> None:
    """What a claim of 0 on ``shard`` reports: its head (None: nothing pending)."""
    view.learn(shard, Claim([], _now_ms(), 0, head, seq), view.epochs[shard])


def test_a_claim_goes_to_the_earliest_head_bounded_by_the_next() -> None:
    now = _now_ms()
    view = ShardView(3)
    _learn(view, 0, now - 50, seq=7)
    _learn(view, 1, now - 90, seq=3)
    _learn(view, 2, None)
    assert view.pick() == (1, (now - 50, 7))


def test_nothing_is_picked_before_the_earliest_head_is_due() -> None:
    view = ShardView(2)
    _learn(view, 0, _now_ms() + 60_000)
    _learn(view, 1, None)
    assert view.pick() is None


def test_a_head_that_turned_unknown_still_bounds_the_claim_by_its_last_seen_value() -> None:
    now = _now_ms()
    view = ShardView(3)
    _learn(view, 0, now - 40, seq=5)
    _learn(view, 1, now - 90, seq=2)
    _learn(view, 2, now - 10, seq=9)
    # News for shards 0 and 1 (a listener heard their markers): both are looked at
    # first; a claim on shard 0 must not pass shard 1's message due 50 ms earlier.
    view.mark(0)
    view.mark(1)
    shard, bound = view.pick() or (None, None)
    assert shard in (0, 1)
    other = 1 if shard == 0 else 0
    assert bound == ({0: now - 40, 1: now - 90}[other], {0: 5, 1: 2}[other])


def test_news_during_a_look_keeps_the_head_unknown_but_its_value_seen() -> None:
    now = _now_ms()
    view = ShardView(2)
    _learn(view, 0, now - 20, seq=4)
    epoch = view.epochs[1]
    view.mark(1)  # news arrive while the look at shard 1 is under way
    view.learn(1, Claim([], now, 0, now - 70, 3), epoch)
    assert 1 in view.unknown()
    # Shard 1 is looked at again first, and shard 0's claim stops before its message.
    view.mark(0)
    assert view.pick() in ((0, (now - 70, 3)), (1, (now - 20, 4)))


@pytest.mark.parametrize("shards", [2, 3, 7, 16])
def test_generated_ids_drawn_in_a_burst_spread_evenly_over_shards(shards: int) -> None:
    """Generated ids share their leading timestamp digits within a burst; the shard
    hashes the whole id, so a burst still spreads as random ids would."""
    per_shard = 2000
    counts = [0] * shards
    for _ in range(per_shard * shards):
        counts[shard_of(new_id(), shards)] += 1
    # ~45 is one standard deviation here: 6 of them is never reached by chance
    assert all(abs(count - per_shard) < 6 * 45 for count in counts), counts


def test_a_claim_ahead_goes_to_the_shard_whose_due_time_comes_first_bounded_by_the_next() -> None:
    """Fire ahead: nothing is due, the earliest head is a due time within ``ahead_ms``:
    that shard is picked, bounded by the next head (its seq: the same due time on the
    other shard comes after it, to the next reserve)."""
    now = _now_ms()
    view = ShardView(3)
    _learn(view, 0, now + 20_000, seq=9)
    _learn(view, 1, now + 20_000, seq=4)
    _learn(view, 2, None)
    assert view.pick() is None
    assert view.pick(ahead_ms=2) is None  # 20 s away: not within 2 ms
    assert view.pick(ahead_ms=30_000) == (1, (now + 20_000, 9))


def test_a_lease_expiry_is_never_claimed_ahead_nor_woken_for_early() -> None:
    """A head with no seq is a lease expiry: the message is still held until then."""
    now = _now_ms()
    view = ShardView(2)
    _learn(view, 0, now + 20_000, seq=0)
    _learn(view, 1, None)
    assert view.pick(ahead_ms=30_000) is None
    assert view.seconds_until_next(ahead_ms=1_000) > 1.0  # not woken a second early
