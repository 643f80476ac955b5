"""Clocks: SystemClock reads the real time, FakeClock moves only when told to."""

from __future__ import annotations

import gc
import inspect
import math
import threading
import time
import weakref
from typing import Any

import pytest

from delayq import Clock, DelayQueue, FakeClock, HeapStore, SystemClock, WheelStore
from delayq.inproc.store import TimerStore


def test_system_clock_reads_the_real_clocks() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    before = time.monotonic()
    assert before <= clock.monotonic() <= time.monotonic()
    assert abs(clock.time() - time.time()) < 5
    assert clock.wait_timeout(0.25) == 0.25
    assert clock.wait_timeout(-1.0) == 0.0
    assert clock.wait_timeout(0.0) == 0.0
    clock.subscribe(lambda: None)  # a no-op, must not fail
    clock.unsubscribe(lambda: None)


def test_fake_clock_moves_only_when_advanced() -> None:
    clock = FakeClock(monotonic=10.0, wall=1_000.0)
    assert isinstance(clock, Clock)
    assert clock.monotonic() == 10.0
    assert clock.time() == 1_000.0
    time.sleep(0.01)
    assert clock.monotonic() == 10.0
    assert clock.time() == 1_000.0
    clock.advance(2.5)
    assert clock.monotonic() == 12.5
    assert clock.time() == 1_002.5
    clock.advance(0)
    assert clock.monotonic() == 12.5
    assert clock.wait_timeout(5.0) is None  # never sleeps by itself
    defaults = FakeClock()
    assert defaults.monotonic() > 0
    assert defaults.time() > 1_600_000_000


@pytest.mark.parametrize("bad", [-1.0, -1e-9, math.nan, math.inf, -math.inf])
def test_fake_clock_advance_validates(bad: float) -> None:
    clock = FakeClock(monotonic=5.0, wall=7.0)
    calls = []
    clock.subscribe(lambda: calls.append(1))
    with pytest.raises(ValueError, match="advance"):
        clock.advance(bad)
    assert clock.monotonic() == 5.0
    assert clock.time() == 7.0
    assert calls == []


def test_fake_clock_wakes_subscribers_after_each_advance() -> None:
    clock = FakeClock()
    seen: list[float] = []

    def on_jump() -> None:
        seen.append(clock.monotonic())  # the new time is visible to the callback

    clock.subscribe(on_jump)
    clock.advance(1.0)
    clock.advance(0.5)
    assert seen == [1_001.0, 1_001.5]
    clock.unsubscribe(on_jump)
    clock.advance(1.0)
    assert seen == [1_001.0, 1_001.5]


def test_fake_clock_holds_bound_methods_weakly() -> None:
    clock = FakeClock()

    class Listener:
        def __init__(self) -> None:
            self.calls = 0

        def on_jump(self) -> None:
            self.calls += 1

    kept, dropped = Listener(), Listener()
    clock.subscribe(kept.on_jump)
    clock.subscribe(dropped.on_jump)
    clock.advance(1)
    assert kept.calls == dropped.calls == 1
    del dropped
    gc.collect()
    clock.advance(1)  # a collected subscriber is skipped, not an error
    assert kept.calls == 2
    clock.subscribe(Listener().on_jump)  # subscribing prunes the dead ones
    gc.collect()
    assert len(clock._subscribers) <= 2


def test_a_queue_on_a_fake_clock_can_be_garbage_collected() -> None:
    clock = FakeClock()
    queue: DelayQueue[int] = DelayQueue(clock=clock)
    ref = weakref.ref(queue)
    del queue
    gc.collect()
    assert ref() is None
    clock.advance(1.0)


def test_fake_clock_advance_is_thread_safe() -> None:
    clock = FakeClock(monotonic=0.0, wall=0.0)

    def work() -> None:
        for _ in range(1_000):
            clock.advance(0.5)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert clock.monotonic() == 2_000.0
    assert clock.time() == 2_000.0


def test_repr() -> None:
    assert "FakeClock" in repr(FakeClock(monotonic=1.0, wall=2.0))
    assert repr(SystemClock()) == "SystemClock()"


def _shape(function: Any) -> list[tuple[str, str, object]]:
    """What a caller sees of a callable: each parameter's name, kind and default (a
    builtin such as ``time.monotonic`` shows none: it takes no arguments)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except ValueError:
        return []
    return [(p.name, p.kind.name, p.default) for p in parameters]


PROTOCOLS = [(Clock, SystemClock), (Clock, FakeClock), (TimerStore, HeapStore)]
PROTOCOLS += [(TimerStore, WheelStore)]


@pytest.mark.parametrize(
    ("protocol", "cls"), PROTOCOLS, ids=[f"{c.__name__}-{p.__name__}" for p, c in PROTOCOLS]
)
def test_implementations_take_the_protocols_parameters(protocol: type, cls: type) -> None:
    """``isinstance`` against a runtime-checkable protocol sees only the names: each
    method must also take what the protocol says (names, kinds, defaults)."""
    instance = cls()
    members = [name for name, value in vars(protocol).items() if inspect.isfunction(value)]
    members = [name for name in members if not name.startswith("_") or name == "__len__"]
    assert members
    for name in members:
        wanted = _shape(getattr(protocol, name))[1:]  # without self
        assert _shape(getattr(instance, name)) == wanted, f"{cls.__name__}.{name}"


def test_reprs_say_what_a_store_and_a_schedule_hold() -> None:
    store: HeapStore[str] = HeapStore()
    assert repr(store) == "<HeapStore pending=0 entries=0>"
    handle = store.push("a", 10.0)
    store.push_due("b", 1.0)
    store.reschedule(handle, 20.0)  # a moved entry: the old one stays until compaction
    assert repr(store) == "<HeapStore pending=2 entries=3>"
