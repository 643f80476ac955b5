"""The stores at the edges the model tests seldom reach, one direct case each.

The hypothesis model (test_store_model.py) walks random sequences; these pin the
cases it reaches only by luck: an item put due at once beside an earlier timer polled
too soon, ties across ``push`` and ``push_due``, the exact ``limit``, a reschedule
that leaves a wheel item in its slot, the slot a wheel opens next (near 0, where a
tick's start rounds below it, at the wheel's last tick), and the wheel's opened heap
under cancels. Each was found by a mutant that survived ``make mutate``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest

from delayq import DelayQueue, FakeClock, HeapStore, WheelStore

StoreFactory = Callable[[], Any]
STORES: dict[str, StoreFactory] = {
    "heap": HeapStore,
    "wheel-1ms": lambda: WheelStore(tick=0.001),
    "wheel-1s": lambda: WheelStore(tick=1.0),
}
EVERY_STORE = pytest.mark.parametrize("factory", list(STORES.values()), ids=list(STORES))

#: Stale entries the wheel's opened heap may keep beyond twice its live ones.
WHEEL_READY_SLACK = 8


def values(handles: list[Any]) -> list[Any]:
    return [handle.value for handle in handles]


# -- both stores -----------------------------------------------------------------------------


@EVERY_STORE
@pytest.mark.parametrize(
    "timers",
    [[("a", 1.0), ("b", 20.0), ("c", 10.0)], [("b", 10.0), ("a", 1.0)]],
    ids=["in-order-first", "out-of-order-first"],
)
def test_an_item_put_due_at_once_waits_behind_an_earlier_timer(
    factory: StoreFactory, timers: list[tuple[str, float]]
) -> None:
    # Timers polled too early (0.5), then an item put due at once when the clock reads
    # 3: the timer "a", due since 1, comes out first (a HeapStore keeps "a" in its
    # in-order lane in one case, in its heap in the other).
    store = factory()
    for value, deadline in timers:
        store.push(value, deadline)
    assert store.pop_due(0.5) is None
    store.push_due("x", 3.0)
    assert values(store.pop_due_many(3.0, 10)) == ["a", "x"]
    later = sorted((d, v) for v, d in timers if v != "a")
    assert values(store.pop_due_many(20.0, 10)) == [v for _, v in later]


@EVERY_STORE
def test_a_tie_between_push_and_push_due_comes_out_in_put_order(factory: StoreFactory) -> None:
    store = factory()
    store.push("timer", 5.0)  # put at 0 with a delay of 5
    store.push_due("now", 5.0)  # put at 5 with no delay
    assert store.peek().value == "timer"
    assert values(store.pop_due_many(5.0, 10)) == ["timer", "now"]


@EVERY_STORE
def test_pop_due_many_returns_exactly_limit_items(factory: StoreFactory) -> None:
    store = factory()
    for i in range(5):
        store.push(i, float(i))
    assert values(store.pop_due_many(10.0, 3)) == [0, 1, 2]
    assert len(store) == 2
    assert values(store.pop_due_many(10.0, 1)) == [3]
    assert values(store.pop_due_many(10.0, 5)) == [4]


@EVERY_STORE
def test_a_done_handle_still_tells_its_due_time_on_its_queues_clock(
    factory: StoreFactory,
) -> None:
    clock = FakeClock(monotonic=100.0, wall=1_000_000.0)
    queue: DelayQueue[str] = DelayQueue(factory(), clock=clock)
    taken = queue.put("taken", delay=5)
    cancelled = queue.put("cancelled", delay=7)
    assert queue.cancel(cancelled)
    clock.advance(5.0)
    assert queue.get_nowait() == "taken"
    assert not taken.pending
    assert taken.due_at == datetime.fromtimestamp(1_000_005.0, timezone.utc)
    assert cancelled.due_at == datetime.fromtimestamp(1_000_007.0, timezone.utc)


# -- the wheel ----------------------------------------------------------------------------------


def test_wheel_next_deadline_is_the_slot_opening_then_the_exact_deadline() -> None:
    # Tick 1 is a slot at first (the cursor starts at tick 0): next_deadline answers
    # when it opens; once opened, the item's own deadline, after the last poll.
    store: WheelStore[str] = WheelStore(tick=1.0)
    item = store.push("x", 1.5)
    assert store.next_deadline() == 1.0
    assert store.pop_due(1.0) is None
    assert store.next_deadline() == 1.5
    assert store.pop_due(1.5) is item


@pytest.mark.parametrize(
    ("tick", "index"),
    [(0.1, 43), (0.7, 3), (1 / 3, 7), (0.003, 49)],
    ids=["0.1s-43", "0.7s-3", "third-7", "3ms-49"],
)
def test_wheel_slot_opening_is_a_time_that_opens_it(tick: float, index: int) -> None:
    # index * tick rounds to a float of tick index - 1 for these ticks: the opening
    # time given must be the first float of the slot's tick, or a consumer that polls
    # then opens nothing and is told the same time again (a spin).
    assert int(index * tick / tick) == index - 1  # the case this test is about
    store: WheelStore[str] = WheelStore(tick=tick)
    deadline = (index + 0.5) * tick
    item = store.push("x", deadline)
    opens = store.next_deadline()
    assert opens is not None
    assert opens <= deadline
    assert int(opens / tick) == index
    assert int(math.nextafter(opens, -math.inf) / tick) == index - 1
    assert store.pop_due(opens) is None
    assert store.next_deadline() == deadline
    assert store.pop_due(deadline) is item


def test_wheel_reschedule_later_keeps_the_item_in_its_slot() -> None:
    # A later deadline leaves the item where it is (keep-alive resets are O(1)): its
    # slot still opens first, and it is placed again then.
    store: WheelStore[str] = WheelStore(tick=1.0)
    item = store.push("x", 10.0)
    assert store.reschedule(item, 50.0)
    assert store.reschedule(item, 50.0)  # the same deadline again: still kept
    assert item.deadline == 50.0
    assert store.next_deadline() == 10.0
    assert store.pop_due(10.0) is None
    assert store.next_deadline() == 50.0
    assert store.peek() is item
    assert store.pop_due(49.9) is None
    assert store.pop_due(50.0) is item


def test_wheel_reschedule_from_the_overflow_to_a_slot_moves_it() -> None:
    store: WheelStore[str] = WheelStore(tick=1.0)
    item = store.push("x", 1e300)
    assert store.reschedule(item, 1e301)  # later, in the overflow: kept there
    assert store.next_deadline() == 1e301
    assert store.reschedule(item, 10.0)
    assert store.next_deadline() == 10.0
    assert store.pop_due(10.0) is item


@pytest.mark.parametrize("tick", [0.001, 1.0])
def test_wheel_peek_sees_past_an_item_rescheduled_later_in_an_earlier_slot(tick: float) -> None:
    # `moved` stays in the slot of tick 5 with a deadline in tick 10; `first` sits in
    # the slot of tick 10, earlier within that tick.
    store: WheelStore[str] = WheelStore(tick=tick)
    assert store.pop_due(1.5 * tick) is None  # the wheel has opened tick 1
    moved = store.push("moved", 5 * tick)
    first = store.push("first", 10.2 * tick)
    assert store.reschedule(moved, 10.5 * tick)
    assert store.peek() is first
    assert values(store.pop_due_many(11 * tick, 10)) == ["first", "moved"]


def test_wheel_overflow_opens_only_at_the_wheels_last_tick() -> None:
    # An item beyond the wheel's 2**60 ticks waits in the overflow list; a poll long
    # before that must not bring it ahead of an item still in a slot.
    store: WheelStore[str] = WheelStore(tick=1.0)
    soon = store.push("soon", 100.0)
    store.push("far", 1e300)
    assert store.pop_due(1.0) is None
    assert store.peek() is soon
    nd = store.next_deadline()
    assert nd is not None
    assert nd <= 100.0
    assert values(store.pop_due_many(1e300, 10)) == ["soon", "far"]


def _opened_entries(store: WheelStore[Any]) -> tuple[int, int]:
    """Entries of the wheel's opened heap: all of them, and the live ones."""
    opened = store._ready
    return len(opened), sum(entry[2] is not None for entry in opened)


@pytest.mark.parametrize("where", ["opened", "overflow"])
def test_wheel_opened_heap_compacts_exactly_when_stale_entries_outnumber_live_ones(
    where: str,
) -> None:
    # Items in the opened heap (put due, or the overflow opened at the last tick) are
    # cancelled, rescheduled and taken at random. A cancelled entry stays behind (O(1))
    # until the stale ones outnumber the live ones by more than a slack: then, and only
    # then, they are dropped. So memory stays within twice the live entries and each
    # rebuild is paid for by as many cancels. The live items all still come out, in order.
    rng = random.Random(11)
    store: WheelStore[int] = WheelStore(tick=1.0)
    base = 0.25 if where == "opened" else 2e18
    step = 0.001 if where == "opened" else 1024.0
    for _round in range(2):
        handles = {i: store.push(i, base + i * step) for i in range(41)}
        if where == "overflow":
            assert store.pop_due(1.5e18) is None  # opens the overflow into the heap
        now = base - step
        for _ in range(150):
            before, live = _opened_entries(store)
            assert live == len(store) == len(handles)
            roll = rng.random()
            if roll < 0.5:
                assert store.cancel(handles.pop(rng.choice(sorted(handles))))
                live -= 1
                compact = before > 2 * live + WHEEL_READY_SLACK
                assert _opened_entries(store) == ((live, live) if compact else (before, live))
            elif roll < 0.8:
                i = rng.choice(sorted(handles))
                assert store.reschedule(handles[i], now + step + rng.randrange(41) * step)
                compact = before > 2 * (live - 1) + WHEEL_READY_SLACK
                assert _opened_entries(store) == ((live, live) if compact else (before + 1, live))
            else:
                now += step * rng.randrange(4)
                handle = store.pop_due(now)
                if handle is not None:
                    assert handles.pop(handle.value) is handle
            if len(handles) < 5:
                break
        expected = [handle.value for handle in sorted(handles.values())]
        assert values(store.pop_due_many(math.inf, 100)) == expected
        assert store.clear() == []


#: Dead entries a HeapStore may keep beyond as many as it has live ones.
HEAP_SLACK = 16


def _heap_entries(store: HeapStore[Any]) -> int:
    return len(store._heap) + len(store._lane) + len(store._due)


def test_heap_compacts_exactly_when_dead_entries_outnumber_live_ones() -> None:
    # The same rule for the heap and its lanes: a cancelled or moved entry stays behind
    # until the dead ones outnumber the live ones by more than the slack.
    rng = random.Random(5)
    store: HeapStore[int] = HeapStore()
    handles = {}
    now = 0.0
    for n in range(600):
        roll = rng.random() if len(handles) >= 10 else 0.0
        entries = _heap_entries(store)
        if roll < 0.3:
            handles[n] = store.push(n, now + rng.choice([5.0, rng.uniform(0, 10)]))
        elif roll < 0.4:
            handles[n] = store.push_due(n, now)
        elif roll < 0.6:
            assert store.cancel(handles.pop(rng.choice(sorted(handles))))
        elif roll < 0.9:
            i = rng.choice(sorted(handles))
            assert store.reschedule(handles[i], now + rng.uniform(0, 10))
            entries += 1  # the moved entry, pushed before the check
        else:
            now += 0.5
            for handle in store.pop_due_many(now, 3):
                assert handles.pop(handle.value) is handle
            continue
        live = len(store)
        assert live == len(handles)
        after = _heap_entries(store)
        if roll >= 0.4:  # a cancel or a reschedule: the check for compaction
            compact = 2 * (entries - live) > entries + HEAP_SLACK
            assert after == (live if compact else entries)
    expected = [handle.value for handle in sorted(handles.values(), key=lambda h: h.deadline)]
    assert values(store.pop_due_many(math.inf, 1_000)) == expected
