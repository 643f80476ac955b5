"""Behaviour of the Scheduler: timing, ids, cancel/reschedule, errors, shutdown, threads.

Timing tests use a FakeClock: fake time moves only in ``advance``, so "not yet
fired" is checked without sleeping. A callback is claimed (and ``pending`` drops)
before any callback of its batch runs, so once a sentinel due at the same fake time
has run, ``pending`` tells exactly which timers were taken.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from delayq import DelayQueue, FakeClock, HeapStore, QueueClosed, TimerStore, WheelStore
from delayq.inproc import scheduler as scheduler_module
from delayq.inproc.scheduler import Scheduler, Timer

WAIT = 10.0  # real seconds a test waits for a callback before it fails


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll until ``predicate()`` is true; fail the test after ``timeout`` real seconds."""
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            pytest.fail("timed out waiting for the scheduler")
        time.sleep(0.001)


class Recorder:
    """A callback factory that records (name, clock time, thread name) of every run."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.runs: list[tuple[str, float, str]] = []

    def __call__(self, name: str) -> None:
        with self.lock:
            self.runs.append((name, self.clock.monotonic(), threading.current_thread().name))

    @property
    def names(self) -> list[str]:
        with self.lock:
            return [name for name, _, _ in self.runs]

    def count(self) -> int:
        with self.lock:
            return len(self.runs)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["heap", "wheel"])
def sched(request: pytest.FixtureRequest, clock: FakeClock) -> Iterator[Scheduler]:
    """A one-worker scheduler on a FakeClock (one worker: callbacks run in order)."""
    store: TimerStore[Timer] = HeapStore() if request.param == "heap" else WheelStore(tick=0.001)
    scheduler = Scheduler(1, store=store, clock=clock)
    yield scheduler
    scheduler.shutdown(wait=True, cancel_pending=True)


def test_fires_at_its_time_never_early_in_order(sched: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    timers = {
        "a": sched.call_later(3, rec, "a"),
        "b": sched.call_later(1, rec, "b"),
        "c": sched.call_later("2s", rec, "c"),
        "d": sched.call_later(timedelta(seconds=2), rec, "d"),
    }
    assert sched.pending == len(sched) == 4
    clock.advance(0.5)
    sched.call_later(0, rec, "sentinel")
    wait_for(lambda: rec.count() == 1)
    assert sched.pending == 4
    assert all(timer.pending for timer in timers.values())

    clock.advance(0.5)
    wait_for(lambda: rec.count() == 2)
    clock.advance(1)
    wait_for(lambda: rec.count() == 4)
    clock.advance(1)
    wait_for(lambda: rec.count() == 5)
    assert rec.names == ["sentinel", "b", "c", "d", "a"]  # equal deadlines: in call order
    for name, ran_at, _ in rec.runs[1:]:
        assert ran_at >= timers[name].deadline
    assert not any(timer.pending or timer.cancelled for timer in timers.values())
    assert sched.pending == 0


def test_real_clock_never_early_and_in_order() -> None:
    rng = random.Random(5)
    rec = Recorder(time)
    with Scheduler(1) as scheduler:
        timers = {
            str(n): scheduler.call_later(rng.uniform(-0.05, 0.3), rec, str(n)) for n in range(40)
        }
    assert len(rec.runs) == 40
    expected = sorted(timers, key=lambda name: (timers[name].deadline, int(name)))
    assert rec.names == expected
    for name, ran_at, _ in rec.runs:
        assert ran_at >= timers[name].deadline


def test_call_at_datetime_and_epoch(sched: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    wall = datetime.fromtimestamp(clock.time(), tz=timezone.utc)
    dt_timer = sched.call_at(wall + timedelta(seconds=2), rec, "datetime")
    epoch_timer = sched.call_at(clock.time() + 1, rec, "epoch")
    past_timer = sched.call_at(clock.time() - 60, rec, "past")
    assert dt_timer.deadline == pytest.approx(clock.monotonic() + 2)
    assert epoch_timer.deadline == pytest.approx(clock.monotonic() + 1)
    assert past_timer.deadline == clock.monotonic()
    wait_for(lambda: rec.count() == 1)
    clock.advance(2)
    wait_for(lambda: rec.count() == 3)
    assert rec.names == ["past", "epoch", "datetime"]


def test_same_id_replaces_the_pending_timer(sched: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    old = sched.call_later(10, rec, "old", id="conn-1")
    new = sched.call_later(5, rec, "new", id="conn-1")
    assert new is not old
    assert old.id == new.id == "conn-1"
    assert not old.pending
    assert old.cancelled
    assert new.pending
    assert sched.pending == 1
    assert not sched.cancel(old)  # the old handle names the replaced timer, not the id

    newer = sched.call_later(7, rec, "newer", id="conn-1")  # a keep-alive reset
    assert not new.pending
    clock.advance(10)
    wait_for(lambda: rec.count() == 1)
    assert rec.names == ["newer"]
    assert sched.pending == 0
    assert not newer.pending
    assert not newer.cancelled

    # the id is free again once its timer fired
    again = sched.call_later(1, rec, "again", id="conn-1")
    assert not newer.cancelled
    clock.advance(1)
    wait_for(lambda: rec.count() == 2)
    assert not again.pending


def test_cancel_by_id_and_by_handle(sched: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    by_id = sched.call_later(1, rec, "by_id", id=("user", 7))
    by_handle = sched.call_later(1, rec, "by_handle")
    by_method = sched.call_later(1, rec, "by_method", id=42)
    kept = sched.call_later(1, rec, "kept", id="kept")

    assert sched.cancel(("user", 7))
    assert not sched.cancel(("user", 7))
    assert not sched.cancel(by_id)
    assert sched.cancel(by_handle)
    assert not sched.cancel(by_handle)
    assert by_method.cancel()
    assert not by_method.cancel()
    assert not sched.cancel("unknown")
    assert not sched.cancel(None)
    assert by_id.cancelled
    assert by_handle.cancelled
    assert kept.pending
    assert sched.pending == 1

    clock.advance(1)
    wait_for(lambda: rec.count() == 1)
    assert rec.names == ["kept"]
    assert not sched.cancel("kept")  # already fired
    assert not sched.cancel(kept)
    assert not kept.cancelled


def test_cancel_a_timer_of_another_scheduler_raises(sched: Scheduler, clock: FakeClock) -> None:
    with Scheduler(1, clock=clock) as other:
        foreign = other.call_later(1, print)
        with pytest.raises(ValueError, match="another scheduler"):
            sched.cancel(foreign)
        with pytest.raises(ValueError, match="another scheduler"):
            sched.reschedule(foreign, delay=2)
        assert foreign.cancel()


def test_reschedule_by_id_and_by_handle(sched: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    start = clock.monotonic()
    later = sched.call_later(1, rec, "later", id="later")
    sooner = sched.call_later(5, rec, "sooner")
    method = sched.call_later(2, rec, "method")

    assert sched.reschedule("later", delay=4)
    assert later.deadline == start + 4
    assert sched.reschedule(sooner, delay="500ms")
    assert sooner.deadline == start + 0.5
    assert method.reschedule(at=clock.time() + 3)
    assert method.deadline == pytest.approx(start + 3)
    assert not sched.reschedule("unknown", delay=1)
    assert sched.pending == 3

    clock.advance(1)
    wait_for(lambda: rec.count() == 1)
    assert sched.pending == 2  # "later" was moved away from t=1
    clock.advance(3)
    wait_for(lambda: rec.count() == 3)
    assert rec.names == ["sooner", "method", "later"]
    assert not sched.reschedule(later, delay=1)
    assert not sched.reschedule("later", delay=1)


def test_reschedule_to_now_and_the_id_keeps_its_timer(sched: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    timer = sched.call_later(100, rec, "x", id="x")
    assert sched.reschedule("x")  # neither delay nor at: due now
    wait_for(lambda: rec.count() == 1)
    assert not timer.pending
    assert sched._by_id == {}


def test_raising_callback_is_logged_and_later_timers_fire(
    sched: Scheduler, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder(clock)

    def boom() -> None:
        raise RuntimeError("boom in a callback")

    caplog.set_level(logging.ERROR, logger="delayq")
    sched.call_later(1, boom, id="boom")
    sched.call_later(2, rec, "after")
    clock.advance(1)
    wait_for(lambda: any("boom" in r.getMessage() for r in caplog.records))
    clock.advance(1)
    wait_for(lambda: rec.count() == 1)
    record = next(r for r in caplog.records if "boom" in r.getMessage())
    assert record.name == "delayq"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    assert sched.pending == 0
    assert sched._by_id == {}


def test_shutdown_waits_for_pending_timers_to_fire() -> None:
    rec = Recorder(time)
    scheduler = Scheduler(2)
    timers = [scheduler.call_later(0.05 + n * 0.01, rec, str(n)) for n in range(5)]
    scheduler.shutdown(wait=True, cancel_pending=False)
    assert sorted(rec.names) == [str(n) for n in range(5)]
    assert scheduler.pending == 0
    assert not any(timer.pending for timer in timers)
    for timer, (_, ran_at, _) in zip(timers, sorted(rec.runs), strict=True):
        assert ran_at >= timer.deadline


def test_context_manager_exit_fires_pending_timers() -> None:
    rec = Recorder(time)
    with Scheduler() as scheduler:
        scheduler.call_later(0.05, rec, "a")
        scheduler.call_later("80ms", rec, "b", id="b")
    assert sorted(rec.names) == ["a", "b"]
    assert scheduler.closed


def test_shutdown_cancel_pending_drops_them(clock: FakeClock) -> None:
    rec = Recorder(clock)
    scheduler = Scheduler(2, clock=clock)
    timers = [scheduler.call_later(n + 1, rec, str(n), id=n) for n in range(5)]
    scheduler.shutdown(wait=True, cancel_pending=True)  # returns although fake time stands
    clock.advance(100)
    assert rec.runs == []
    assert all(timer.cancelled for timer in timers)
    assert scheduler.pending == 0
    assert scheduler._by_id == {}


def test_calls_after_shutdown_raise_but_cancel_still_works(clock: FakeClock) -> None:
    rec = Recorder(clock)
    scheduler = Scheduler(1, clock=clock)
    keep = scheduler.call_later(1, rec, "keep", id="keep")
    drop = scheduler.call_later(1, rec, "drop", id="drop")
    scheduler.shutdown(wait=False)
    with pytest.raises(QueueClosed):
        scheduler.call_later(1, rec, "late")
    with pytest.raises(QueueClosed):
        scheduler.call_at(clock.time() + 1, rec, "late")
    with pytest.raises(QueueClosed):
        scheduler.call_later(1, rec, "late", id="keep")  # no replacement either
    assert keep.pending
    assert scheduler.cancel("drop")
    assert drop.cancelled
    assert scheduler.reschedule("keep", delay=2)
    clock.advance(2)
    scheduler.shutdown(wait=True)
    assert rec.names == ["keep"]
    assert scheduler.pending == 0


def test_callbacks_run_concurrently_on_max_workers_threads() -> None:
    workers = 3
    barrier = threading.Barrier(workers, timeout=WAIT)
    names: list[str] = []
    lock = threading.Lock()
    active = peak = 0

    def meet() -> None:
        nonlocal active, peak
        with lock:
            names.append(threading.current_thread().name)
            active += 1
            peak = max(peak, active)
        barrier.wait()  # breaks (and fails the test) unless `workers` callbacks overlap
        time.sleep(0.02)
        with lock:
            active -= 1

    with Scheduler(workers) as scheduler:
        assert scheduler.max_workers == workers
        for _ in range(workers * 2):
            scheduler.call_later(0, meet)
    assert len(names) == workers * 2
    assert peak == workers  # never more than max_workers at once
    assert len(set(names)) == workers
    assert all("delayq" in name for name in names)
    assert not barrier.broken


def test_dispatcher_thread_is_named_delayq() -> None:
    with Scheduler(1):
        names = [thread.name for thread in threading.enumerate()]
    assert any("delayq" in name and "dispatcher" in name for name in names)


def test_a_callback_can_schedule_cancel_and_reschedule(sched: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    sched.call_later(5, rec, "doomed", id="doomed")
    sched.call_later(5, rec, "moved", id="moved")

    def first() -> None:
        rec("first")
        sched.call_later(1, rec, "second", id="second")
        assert sched.cancel("doomed")
        assert sched.reschedule("moved", delay=0)
        sched.call_later(1, rec, "re-armed", id="first")  # re-arm its own id

    sched.call_later(0, first, id="first")
    wait_for(lambda: rec.count() == 2)
    assert rec.names == ["first", "moved"]
    clock.advance(1)
    wait_for(lambda: rec.count() == 4)
    assert rec.names[2:] == ["second", "re-armed"]
    assert sched.pending == 0
    assert sched._by_id == {}


def test_shutdown_from_a_callback_does_not_deadlock(clock: FakeClock) -> None:
    done = threading.Event()
    scheduler = Scheduler(1, clock=clock)

    def stop() -> None:
        scheduler.shutdown(wait=True)  # must not wait on its own worker
        done.set()

    scheduler.call_later(0, stop)
    assert done.wait(WAIT)
    assert scheduler.closed
    scheduler.shutdown(wait=True)


def test_a_partial_passes_an_id_argument_and_kwargs_pass_through(
    sched: Scheduler, clock: FakeClock
) -> None:
    got: list[dict[str, Any]] = []

    def callback(*args: Any, **kwargs: Any) -> None:
        got.append({"args": args, **kwargs})

    sched.call_later(0, functools.partial(callback, id="arg"), 1, 2, delay="kw", fn="kw", id="t")
    wait_for(lambda: len(got) == 1)
    assert got == [{"args": (1, 2), "id": "arg", "delay": "kw", "fn": "kw"}]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.call_later("soon", print), ValueError),
        (lambda s: s.call_later(float("nan"), print), ValueError),
        (lambda s: s.call_later(float("inf"), print), ValueError),
        (lambda s: s.call_later(True, print), TypeError),
        (lambda s: s.call_later(None, print), TypeError),
        (lambda s: s.call_later([1], print), TypeError),
        (lambda s: s.call_later(1, "not callable"), TypeError),
        (lambda s: s.call_later(1, None), TypeError),
        (lambda s: s.call_later(1, print, id=["unhashable"]), TypeError),
        (lambda s: s.call_at(datetime(2030, 1, 1), print), ValueError),
        (lambda s: s.call_at(None, print), TypeError),
        (lambda s: s.call_at("tomorrow", print), TypeError),
        (lambda s: s.call_at(float("nan"), print), ValueError),
    ],
)
def test_bad_input_raises_and_schedules_nothing(
    sched: Scheduler, call: Callable[[Scheduler], object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        call(sched)
    assert sched.pending == 0
    assert sched._queue.peek() is None
    assert sched._by_id == {}


@pytest.mark.parametrize(
    ("delay", "at", "error"),
    [
        ("1 hour", None, ValueError),
        (1, 2.0, ValueError),
        (float("nan"), None, ValueError),
        (None, datetime(2030, 1, 1), ValueError),
        (True, None, TypeError),
    ],
)
def test_bad_input_leaves_a_pending_timer_as_it_was(
    sched: Scheduler, clock: FakeClock, delay: Any, at: Any, error: type[Exception]
) -> None:
    timer = sched.call_later(5, print, id="k")
    if at is None:
        with pytest.raises(error):
            sched.call_later(delay, print, id="k")
    elif delay is None:
        with pytest.raises(error):
            sched.call_at(at, print, id="k")
    with pytest.raises(error):
        sched.reschedule("k", delay=delay, at=at)
    assert timer.pending
    assert timer.deadline == clock.monotonic() + 5
    assert sched._by_id == {"k": timer}


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        Scheduler(0)
    with pytest.raises(TypeError, match="max_workers"):
        Scheduler(2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clock"):
        Scheduler(clock=object())  # type: ignore[arg-type]


def test_cancel_true_means_the_callback_never_runs() -> None:
    # Timers fall due while they are being cancelled, so some cancels race the
    # dispatcher: each timer must either run or be cancelled, never both or neither.
    ran: set[int] = set()
    lock = threading.Lock()

    def run(n: int) -> None:
        with lock:
            ran.add(n)

    cancelled: set[int] = set()
    with Scheduler(4) as scheduler:
        timers = [scheduler.call_later(0.0005 * (n % 20), run, n, id=n) for n in range(2000)]
        for n, timer in enumerate(timers):
            if n % 2 and (scheduler.cancel(n) if n % 4 == 1 else timer.cancel()):
                cancelled.add(n)
    assert not ran & cancelled
    assert ran | cancelled == set(range(2000))
    assert scheduler._by_id == {}


def test_reschedule_racing_the_dispatcher_runs_each_timer_once() -> None:
    counts: dict[int, int] = {}
    ran_at: dict[int, float] = {}
    lock = threading.Lock()

    def run(n: int) -> None:
        now = time.monotonic()
        with lock:
            counts[n] = counts.get(n, 0) + 1
            ran_at[n] = now

    with Scheduler(2) as scheduler:
        timers = [scheduler.call_later(0, run, n, id=n) for n in range(1000)]
        moved = {n for n in range(1000) if scheduler.reschedule(n, delay=0.05)}
    assert counts == dict.fromkeys(range(1000), 1)
    for n in moved:
        assert ran_at[n] >= timers[n].deadline
    assert scheduler.pending == 0


def test_timer_repr_and_properties(sched: Scheduler, clock: FakeClock) -> None:
    timer = sched.call_later(1, print, id="r")
    assert isinstance(timer, Timer)
    assert "pending" in repr(timer)
    assert "'r'" in repr(timer)
    assert sched.clock is clock
    assert "open" in repr(sched)
    timer.cancel()
    assert "cancelled" in repr(timer)


class PausingQueue(DelayQueue[Any]):
    """A DelayQueue whose ``get_many`` stops after taking items, until ``go`` is set:
    it holds the dispatcher between taking due timers and claiming them."""

    taken: threading.Event
    go: threading.Event

    def get_many(self, max: int = 100, timeout: float | None = None) -> list[Any]:
        items = super().get_many(max, timeout)
        self.taken.set()
        assert self.go.wait(WAIT)
        return items


@pytest.fixture
def paused(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[Scheduler]:
    """A one-worker scheduler whose dispatcher pauses as described in PausingQueue."""
    monkeypatch.setattr(PausingQueue, "taken", threading.Event(), raising=False)
    monkeypatch.setattr(PausingQueue, "go", threading.Event(), raising=False)
    monkeypatch.setattr(scheduler_module, "DelayQueue", PausingQueue)
    scheduler = Scheduler(1, clock=clock)
    yield scheduler
    PausingQueue.go.set()
    scheduler.shutdown(wait=True, cancel_pending=True)


def _take(scheduler: Scheduler, clock: FakeClock, timer: Timer) -> None:
    """Let the dispatcher take ``timer`` out of the queue and hold it there."""
    clock.advance(timer.deadline - clock.monotonic())
    assert PausingQueue.taken.wait(WAIT)
    assert timer.pending  # taken from the queue, not yet claimed


@pytest.mark.parametrize("how", ["id", "handle", "replace", "shutdown"])
def test_cancel_of_a_taken_timer_wins(paused: Scheduler, clock: FakeClock, how: str) -> None:
    rec = Recorder(clock)
    timer = paused.call_later(1, rec, "taken", id="x")
    _take(paused, clock, timer)
    if how == "id":
        assert paused.cancel("x")
    elif how == "handle":
        assert timer.cancel()
    elif how == "replace":
        paused.call_later(0, rec, "replacement", id="x")
    else:
        # The dispatcher has the timer in hand: it drops it when it tries to claim it.
        paused.shutdown(wait=False, cancel_pending=True)
    PausingQueue.go.set()
    if how != "shutdown":
        assert timer.cancelled
        paused.call_later(0, rec, "sentinel")
        wait_for(lambda: "sentinel" in rec.names)
    paused.shutdown(wait=True)
    assert timer.cancelled
    assert "taken" not in rec.names
    assert paused.pending == 0
    assert paused._by_id == {}


def test_reschedule_of_a_taken_timer_moves_it(paused: Scheduler, clock: FakeClock) -> None:
    rec = Recorder(clock)
    timer = paused.call_later(1, rec, "taken", id="x")
    _take(paused, clock, timer)
    assert paused.reschedule("x", delay=2)
    assert timer.deadline == clock.monotonic() + 2
    PausingQueue.go.set()
    paused.call_later(0, rec, "sentinel")
    wait_for(lambda: rec.count() == 1)
    assert timer.pending
    clock.advance(2)
    wait_for(lambda: rec.count() == 2)
    assert rec.names == ["sentinel", "taken"]
    assert rec.runs[1][1] >= timer.deadline


def test_timer_due_at() -> None:
    clock = FakeClock(monotonic=1_000.0, wall=1_700_000_000.0)
    with Scheduler(clock=clock) as sched:
        timer = sched.call_later(2.5, print, id="t")
        assert timer.due_at == datetime.fromtimestamp(1_700_000_002.5, timezone.utc)
        assert "due=2023-11-14T22:13:22.500Z (in 2.5s)" in repr(timer)
        sched.reschedule("t", delay=60)
        assert timer.due_at == datetime.fromtimestamp(1_700_000_060, timezone.utc)
        assert sched.cancel("t")
