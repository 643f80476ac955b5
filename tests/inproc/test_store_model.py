"""The timer stores against a plain sorted-list model, with hypothesis.

Both stores must behave exactly like a list of ``(deadline, seq)`` entries kept in
order: ``pop_due(now)`` returns the earliest entry whose deadline is ``<= now``,
ties in put order, a rescheduled entry goes behind the entries that already have
its new deadline. The wheel is documented as exact when polled, so it is held to
the same model; only ``next_deadline`` differs (the wheel may answer with the time
its next slot opens: never later than the earliest deadline).
"""

from __future__ import annotations

import gc
import math
import os
import random
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from delayq import Handle, HeapStore, WheelStore

StoreFactory = Callable[[], Any]

STORES: dict[str, StoreFactory] = {
    "heap": HeapStore,
    "wheel-1ms": lambda: WheelStore(tick=0.001),
    "wheel-7ms": lambda: WheelStore(tick=0.007),
    "wheel-1s": lambda: WheelStore(tick=1.0),
}

YEAR = 365.25 * 86_400.0
SPECIAL_DEADLINES = [
    0.0,
    -1.0,
    -1e9,
    1e-9,
    0.001,
    1.0,
    1e9,
    100 * YEAR,
    1_000 * YEAR,
    1e16,  # beyond the wheel's 2**60 ticks at 1 ms: its overflow list
    1e300,
]

deadlines = st.one_of(
    st.sampled_from(SPECIAL_DEADLINES),
    st.floats(min_value=-10.0, max_value=10.0, allow_nan=False),
    st.integers(min_value=-3, max_value=12).map(float),  # many ties
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
)
offsets = st.one_of(
    st.sampled_from([0.0, -1.0, 0.0005, 0.001, 1.0, 63.5, 64.0, 4096.0, 1e6, YEAR]),
    st.floats(min_value=-100.0, max_value=100.0, allow_nan=False),
)
steps = st.one_of(
    st.sampled_from([0.0, 0.001, 0.0015, 0.999, 1.0, 64.0, 4097.0, 1e6, YEAR]),
    st.floats(min_value=0.0, max_value=20.0, allow_nan=False),
)
jumps = st.sampled_from([1e9, 100 * YEAR, 1e16, 1e17, 1e301])

SETTINGS = settings(
    # DELAYQ_HYPOTHESIS_EXAMPLES=2000 for a longer hunt; the default keeps the suite fast.
    max_examples=int(os.environ.get("DELAYQ_HYPOTHESIS_EXAMPLES", "120")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


#: Dead entries a HeapStore may keep beyond as many as it has live ones.
HEAP_SLACK = 16


def heap_entries(store: HeapStore[Any]) -> int:
    """Entries a HeapStore holds, dead or alive (its heap plus its FIFO lanes)."""
    return sum(len(getattr(store, name, ())) for name in ("_heap", "_lane", "_due"))


class Item:
    """A distinct value per put, so identity tells items apart."""

    __slots__ = ("__weakref__", "n")

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Item({self.n})"


class StoreModel(RuleBasedStateMachine):
    """Runs one store side by side with a sorted list of [deadline, seq, handle]."""

    handles = Bundle("handles")

    def __init__(self, factory: StoreFactory) -> None:
        super().__init__()
        self.store = factory()
        self.is_heap = isinstance(self.store, HeapStore)
        self.model: list[tuple[float, int, Handle[Item]]] = []
        self.seq = 0
        self.n = 0
        self.now = 0.0
        self.last_poll: float | None = None  # the last `now` given to pop_due*
        self.last_deadline: dict[int, float] = {}  # id(handle) -> its latest deadline
        self.values: dict[int, Item] = {}
        self.all_handles: list[Handle[Item]] = []

    # -- model helpers ---------------------------------------------------------------
    def _model_add(self, handle: Handle[Item], deadline: float) -> None:
        self.seq += 1
        self.model.append((deadline, self.seq, handle))
        self.model.sort(key=lambda e: (e[0], e[1]))
        self.last_deadline[id(handle)] = deadline

    def _model_index(self, handle: Handle[Item]) -> int | None:
        for i, entry in enumerate(self.model):
            if entry[2] is handle:
                return i
        return None

    def _due_prefix(self, limit: int) -> list[Handle[Item]]:
        out = []
        for deadline, _, handle in self.model:
            if deadline > self.now or len(out) >= limit:
                break
            out.append(handle)
        return out

    def _check_heap_bounded(self) -> None:
        if self.is_heap:
            assert heap_entries(self.store) <= 2 * len(self.store) + HEAP_SLACK

    # -- rules ---------------------------------------------------------------------------
    @initialize(start=st.one_of(st.just(0.0), st.floats(-1e3, 1e6, allow_nan=False)))
    def start(self, start: float) -> None:
        self.now = start

    @rule(target=handles, deadline=deadlines)
    def push(self, deadline: float) -> Handle[Item]:
        self.n += 1
        value = Item(self.n)
        handle = self.store.push(value, deadline)
        assert isinstance(handle, Handle)
        assert handle.value is value
        assert handle.deadline == deadline
        assert handle.pending
        self.values[id(handle)] = value
        self.all_handles.append(handle)
        self._model_add(handle, deadline)
        return handle

    @rule(target=handles, offset=offsets)
    def push_relative(self, offset: float) -> Handle[Item]:
        return self.push(self.now + offset)

    @rule(
        target=handles,
        delay=offsets,
        count=st.integers(min_value=1, max_value=12),
        step=st.sampled_from([0.0, 0.001, 1.0]),
    )
    def push_stream(self, delay: float, count: int, step: float) -> Any:
        """A burst of one fixed delay while time passes: the case of a HeapStore's
        lane, behind whatever was put before."""
        return multiple(*[self.push(self.now + delay + i * step) for i in range(count)])

    @rule(target=handles, lag=st.sampled_from([0.0, 0.0, 0.0, 1e-9, 0.5]))
    def push_due(self, lag: float) -> Handle[Item]:
        """An item due at once, as a queue puts it: its deadline is the clock's now
        (a little before now when another thread read the clock first)."""
        deadline = self.now - lag
        self.n += 1
        value = Item(self.n)
        handle = self.store.push_due(value, deadline)
        assert handle.value is value
        assert handle.deadline == deadline
        self.values[id(handle)] = value
        self.all_handles.append(handle)
        self._model_add(handle, deadline)
        return handle

    @rule(handle=handles)
    def cancel(self, handle: Handle[Item]) -> None:
        index = self._model_index(handle)
        assert self.store.cancel(handle) is (index is not None)
        if index is not None:
            del self.model[index]
        assert not handle.pending
        assert self.store.cancel(handle) is False
        self._check_heap_bounded()

    @rule(handle=handles, offset=offsets, absolute=st.booleans())
    def reschedule(self, handle: Handle[Item], offset: float, absolute: bool) -> None:
        deadline = offset if absolute else self.now + offset
        index = self._model_index(handle)
        before = handle.deadline
        assert self.store.reschedule(handle, deadline) is (index is not None)
        if index is None:
            assert not handle.pending
            assert handle.deadline == before
        else:
            del self.model[index]
            self._model_add(handle, deadline)
            assert handle.pending
            assert handle.deadline == deadline
        self._check_heap_bounded()

    @rule(step=steps)
    def advance(self, step: float) -> None:
        self.now += step

    @rule(to=jumps)
    def jump(self, to: float) -> None:
        self.now = max(self.now, to)

    @rule()
    def pop_due(self) -> None:
        expected = self._due_prefix(1)
        got = self.store.pop_due(self.now)
        self.last_poll = self.now
        if not expected:
            assert got is None
            return
        assert got is expected[0]
        assert not got.pending
        assert got.deadline <= self.now
        del self.model[0]

    @rule(limit=st.integers(min_value=1, max_value=8))
    def pop_due_many(self, limit: int) -> None:
        expected = self._due_prefix(limit)
        got = self.store.pop_due_many(self.now, limit)
        self.last_poll = self.now
        assert [id(h) for h in got] == [id(h) for h in expected]
        for handle in got:
            assert not handle.pending
        del self.model[: len(got)]

    @rule()
    def peek(self) -> None:
        got = self.store.peek()
        if not self.model:
            assert got is None
        else:
            assert got is self.model[0][2]
            assert got.pending

    @rule()
    def next_deadline(self) -> None:
        got = self.store.next_deadline()
        if not self.model:
            assert got is None
            return
        earliest = self.model[0][0]
        assert got is not None
        if self.is_heap:
            assert got == earliest
        else:
            assert got <= earliest
        poll = self.last_poll
        if poll is not None and earliest > poll:
            # Nothing is due at the last poll: the store must not ask to be polled
            # again at (or before) that same time, or a waiting consumer would spin.
            assert got > poll

    @rule()
    def clear(self) -> None:
        expected = [entry[2] for entry in self.model]
        got = self.store.clear()
        assert [id(h) for h in got] == [id(h) for h in expected]
        for handle in got:
            assert not handle.pending
        self.model.clear()
        assert len(self.store) == 0
        assert self.store.peek() is None
        assert self.store.next_deadline() is None

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def sizes_match(self) -> None:
        assert len(self.store) == len(self.model)

    @invariant()
    def handles_tell_the_truth(self) -> None:
        live = {id(entry[2]) for entry in self.model}
        for handle in self.all_handles:
            assert handle.pending is (id(handle) in live)
            assert handle.deadline == self.last_deadline[id(handle)]
            assert handle.value is self.values[id(handle)]


@pytest.mark.parametrize("factory", list(STORES.values()), ids=list(STORES))
def test_store_matches_sorted_list_model(factory: StoreFactory) -> None:
    run_state_machine_as_test(lambda: StoreModel(factory), settings=SETTINGS)


# -- targeted properties ---------------------------------------------------------------------

BOTH = pytest.mark.parametrize("factory", list(STORES.values()), ids=list(STORES))


@BOTH
def test_ties_come_out_in_put_order_and_reschedule_goes_behind(factory: StoreFactory) -> None:
    store = factory()
    a = store.push("a", 5.0)
    b = store.push("b", 5.0)
    c = store.push("c", 5.0)
    assert store.reschedule(a, 5.0)  # same deadline, but now behind b and c
    d = store.push("d", 5.0)
    assert [h.value for h in store.pop_due_many(5.0, 10)] == ["b", "c", "a", "d"]
    assert not any(h.pending for h in (a, b, c, d))


@BOTH
def test_reschedule_into_the_past_goes_behind_items_already_due(factory: StoreFactory) -> None:
    store = factory()
    store.push("early", 1.0)
    late = store.push("late", 1_000.0)
    store.push("due", 9.0)
    assert store.pop_due(8.0).value == "early"  # the store's now is 8
    assert store.reschedule(late, 8.0)  # "due now" at 8
    assert store.pop_due(8.0).value == "late"
    assert store.pop_due(8.5) is None
    assert store.pop_due(9.0).value == "due"


@BOTH
def test_pop_due_never_returns_an_item_early(factory: StoreFactory) -> None:
    store = factory()
    rng = random.Random(7)
    deadlines = sorted(rng.uniform(0.0, 30.0) for _ in range(500))
    for d in deadlines:
        store.push(d, d)
    now, out = 0.0, []
    while len(store):
        now += rng.uniform(0.0, 0.05)
        while (h := store.pop_due(now)) is not None:
            assert h.deadline <= now
            out.append(h.value)
    assert out == deadlines


@BOTH
def test_cancel_twice_returns_false(factory: StoreFactory) -> None:
    store = factory()
    h = store.push("x", 10.0)
    assert store.cancel(h) is True
    assert store.cancel(h) is False
    assert store.reschedule(h, 1.0) is False
    assert not h.pending
    popped = store.push("y", 0.0)
    assert store.pop_due(0.0) is popped
    assert store.cancel(popped) is False
    assert store.reschedule(popped, 5.0) is False
    assert len(store) == 0


@pytest.mark.parametrize("owner", list(STORES.values()), ids=list(STORES))
@pytest.mark.parametrize("other", list(STORES.values()), ids=list(STORES))
def test_a_handle_of_another_store_raises_value_error(
    owner: StoreFactory, other: StoreFactory
) -> None:
    mine, theirs = owner(), other()
    foreign = theirs.push("x", 1.0)
    moved = theirs.push("m", 2.0)
    theirs.reschedule(moved, 3.0)
    retired = theirs.push("r", 0.0)
    assert theirs.pop_due(0.0) is retired
    mine.push("own", 1.0)
    for handle in (foreign, moved, retired):
        with pytest.raises(ValueError, match="another"):
            mine.cancel(handle)
        with pytest.raises(ValueError, match="another"):
            mine.reschedule(handle, 5.0)
    assert len(mine) == 1
    assert len(theirs) == 2
    assert foreign.pending
    assert moved.pending


@BOTH
def test_clear_returns_handles_earliest_first(factory: StoreFactory) -> None:
    store = factory()
    far = store.push("far", 1e12)
    soon = store.push("soon", 2.0)
    now = store.push("now", 0.0)
    tie = store.push("tie", 2.0)
    store.reschedule(soon, 2.0)  # behind "tie" now
    assert store.clear() == [now, tie, soon, far]
    assert store.clear() == []
    assert len(store) == 0
    assert store.peek() is None
    assert store.next_deadline() is None
    assert store.pop_due(1e13) is None


@pytest.mark.parametrize("in_order", [False, True], ids=["random", "in-order"])
def test_heap_memory_stays_bounded_under_cancels_and_reschedules(in_order: bool) -> None:
    store: HeapStore[int] = HeapStore()
    rng = random.Random(3)
    clock = [0.0]

    def deadline() -> float:
        if in_order:  # one fixed delay: deadlines arrive in order
            clock[0] += 0.001
            return clock[0] + 30.0
        return rng.uniform(0, 100)

    handles = [store.push(i, deadline()) for i in range(2_000)]
    for _ in range(20_000):
        i = rng.randrange(len(handles))
        if rng.random() < 0.8:
            assert store.reschedule(handles[i], deadline())
        else:
            assert store.cancel(handles[i])
            handles[i] = store.push(-1, deadline())
        assert heap_entries(store) <= 2 * len(store) + HEAP_SLACK
    assert len(store) == 2_000
    # Cancel almost everything: the dead entries do not stay behind.
    for h in handles[10:]:
        assert store.cancel(h)
    assert len(store) == 10
    assert heap_entries(store) <= 2 * 10 + HEAP_SLACK
    assert sorted(h.value for h in store.pop_due_many(1e9, 100)) == sorted(
        h.value for h in handles[:10]
    )


def test_heap_releases_cancelled_values_once_compacted() -> None:
    store: HeapStore[Item] = HeapStore()
    refs = []
    keep = [store.push(Item(-1), 1.0) for _ in range(10)]
    for i in range(100):
        value = Item(i)
        refs.append(weakref.ref(value))
        store.cancel(store.push(value, 50.0))
        del value
    gc.collect()
    assert sum(ref() is not None for ref in refs) <= len(keep) + HEAP_SLACK
    assert len(store) == len(keep)


@pytest.mark.parametrize("tick", [0.001, 1.0])
@pytest.mark.parametrize(
    ("deadline", "poll"),
    [
        (10.0, None),  # a wheel slot
        (1e9, None),  # a high level
        (1e30, None),  # the overflow list
        (0.5, 0.6),  # opened and due, not yet taken
        (5.0005, 5.0001),  # opened (current tick), not yet due
    ],
    ids=["slot", "high-level", "overflow", "due", "current-tick"],
)
def test_wheel_frees_a_cancelled_item_at_once(
    tick: float, deadline: float, poll: float | None
) -> None:
    store: WheelStore[Item] = WheelStore(tick=tick)
    keep = store.push(Item(0), 1e6)
    value = Item(1)
    ref = weakref.ref(value)
    if poll is not None:
        first = store.push(Item(2), -1.0)
    handle = store.push(value, deadline)
    if poll is not None:
        assert store.pop_due(poll) is first  # opens the tick of `handle` too
        assert handle.pending
    del value
    assert store.cancel(handle)
    assert handle.value is ref()  # the handle itself still answers
    del handle
    gc.collect()
    assert ref() is None, "the wheel kept a reference to the cancelled item"
    assert len(store) == 1
    assert keep.pending


@pytest.mark.parametrize("tick", [0.001, 1.0])
def test_wheel_frees_a_rescheduled_away_entry(tick: float) -> None:
    store: WheelStore[Item] = WheelStore(tick=tick)
    value = Item(1)
    ref = weakref.ref(value)
    handle = store.push(value, 0.0)
    store.pop_due(-1.0)  # nothing due, but opened
    for i in range(50):
        store.reschedule(handle, float(i % 3))
    assert store.cancel(handle)
    del value, handle
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("tick", [0.001, 0.003, 0.007, 0.1])
def test_wheel_next_deadline_is_never_after_an_exact_deadline(tick: float) -> None:
    # Deadlines a float ulp below a tick boundary: the slot opening time k*tick can
    # round above them, yet pop_due returns them at their own deadline.
    for k in range(1, 300_000, 997):
        base = k * tick
        for deadline in (math.nextafter(base, -math.inf), base):
            store: WheelStore[int] = WheelStore(tick=tick)
            store.push(k, deadline)
            assert store.pop_due(math.nextafter(deadline, -math.inf)) is None
            nd = store.next_deadline()
            assert nd is not None
            assert nd <= deadline
            assert nd > math.nextafter(deadline, -math.inf) or nd == deadline
            assert store.pop_due(deadline).value == k


def test_wheel_tick_validation() -> None:
    assert WheelStore(tick=2).tick == 2.0
    for bad in (0, 0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="tick"):
            WheelStore(tick=bad)
    for wrong in (True, "1ms", None):
        with pytest.raises(TypeError, match=f"tick must be seconds, not {type(wrong).__name__}"):
            WheelStore(tick=wrong)  # type: ignore[arg-type]


@BOTH
def test_years_and_huge_deadlines_come_out_in_order(factory: StoreFactory) -> None:
    store = factory()
    values = [1e300, 1e16, 1_000 * YEAR, 100 * YEAR, YEAR, 86_400.0, 1.0, -5.0]
    for d in values:
        store.push(d, d)
    assert store.peek().value == -5.0
    assert [h.value for h in store.pop_due_many(2.0, 100)] == [-5.0, 1.0]
    assert store.pop_due(YEAR - 1) is not None  # 86400
    assert store.pop_due(YEAR - 1) is None
    out = [h.value for h in store.pop_due_many(math.inf, 100)]
    assert out == sorted(values)[3:]


@pytest.mark.parametrize("tick", [0.001, 0.007])
def test_wheel_item_put_after_the_overflow_opened_keeps_its_order(tick: float) -> None:
    # Found by the model: at a `now` past the wheel's 2**60 ticks, an item put "now"
    # went to the overflow list behind a later item that was already opened.
    store: WheelStore[str] = WheelStore(tick=tick)
    later = store.push("later", 1e16 + 64.0)
    assert store.pop_due(1e16) is None
    now = store.push("now", 1e16)
    assert store.peek() is now
    assert store.next_deadline() == 1e16
    assert store.pop_due(1e16) is now
    assert store.peek() is later
    assert store.pop_due(1e16 + 64.0) is later


@pytest.mark.parametrize("tick", [0.001, 1.0])
def test_wheel_peek_sees_the_overflow_beside_a_rescheduled_slot_item(tick: float) -> None:
    # Found by the model: an item rescheduled later stays in its slot; with a deadline
    # in the overflow range, peek returned it ahead of an earlier overflow item.
    store: WheelStore[str] = WheelStore(tick=tick)
    moved = store.push("moved", 5_000.0)
    first = store.push("first", 1e300)
    assert store.reschedule(moved, 1e300)
    assert store.peek() is first
    assert [h.value for h in store.pop_due_many(math.inf, 10)] == ["first", "moved"]
