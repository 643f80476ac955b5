"""The SyncLane hands the outcomes of a busy lane to the loop in batches, and loses or
holds back none: a long call's outcome goes at once, held ones go when fewer than a
round of calls wait, on :meth:`SyncLane.deliver` and when the lane closes."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from delayq.runtime import pool
from delayq.runtime.pool import NotStarted, SyncLane

from ._helpers import wait_for

Outcome = tuple[str, BaseException | None, Any]


class _Lane:
    """A one-thread lane and the outcomes it handed over, in order."""

    def __init__(self, batch: int) -> None:
        self.lane = SyncLane(1, batch=batch)
        self.outcomes: list[Outcome] = []

    def submit(self, name: str, fn: Callable[[], Any]) -> None:
        def done(
            call: Any,
            error: BaseException | None,
            result: Any,
            started: float | None,
            took: float,
        ) -> None:
            self.outcomes.append((name, error, result))

        self.lane.submit_many([fn], done)

    def names(self) -> list[str]:
        return [outcome[0] for outcome in self.outcomes]


def _blocker(event: threading.Event) -> Callable[[], str]:
    def wait() -> str:
        assert event.wait(10)
        return "freed"

    return wait


def _fill(
    lane: _Lane,
    first: threading.Event,
    quick: dict[str, Callable[[], Any]],
    second: threading.Event,
) -> None:
    """Queue a call blocked on ``first``, the ``quick`` ones, a call blocked on
    ``second`` ("long"), and two more ("x", "y") behind it."""
    lane.submit("first", _blocker(first))
    for name, fn in quick.items():
        lane.submit(name, fn)
    lane.submit("long", _blocker(second))
    lane.submit("x", lambda: "x")
    lane.submit("y", lambda: "y")


async def _release(lane: _Lane, second: threading.Event, count: int) -> _Lane:
    """Let the long call end, wait for ``count`` outcomes in all, close the lane."""
    second.set()
    await wait_for(lambda: len(lane.outcomes) == count)
    lane.lane.close()
    return lane


def _ran(main: Callable[[], Coroutine[Any, Any, _Lane]], *events: threading.Event) -> _Lane:
    """``main()`` run, then every event set (no thread left blocked); its lane."""
    try:
        return asyncio.run(main())
    finally:
        for event in events:
            event.set()


def _raise() -> None:
    raise ValueError("boom")


@pytest.fixture
def no_long_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """No call counts as long: a loaded machine must not change what a test sees."""
    monkeypatch.setattr(pool, "LONG_CALL", float("inf"))


@pytest.mark.usefixtures("no_long_calls")
def test_a_busy_lane_hands_outcomes_over_in_batches_and_loses_none() -> None:
    """batch=3: the outcomes of three calls that ended while a round waited go once the
    third ended (the next call runs on); the rest go as the lane runs out of calls;
    every outcome in the order its call ended."""
    second = threading.Event()

    async def main() -> _Lane:
        lane = _Lane(batch=3)
        first = threading.Event()
        _fill(lane, first, {"q0": lambda: 0, "q1": _raise}, second)
        first.set()
        await wait_for(lambda: len(lane.outcomes) == 3)
        await asyncio.sleep(0.1)
        assert lane.names() == ["first", "q0", "q1"]  # the long one runs: nothing more
        return await _release(lane, second, 6)

    lane = _ran(main, second)
    assert lane.names() == ["first", "q0", "q1", "long", "x", "y"]
    outcomes = {name: (error, result) for name, error, result in lane.outcomes}
    assert outcomes["first"] == (None, "freed")
    assert outcomes["q0"] == (None, 0)
    assert isinstance(outcomes["q1"][0], ValueError)
    assert outcomes["y"] == (None, "y")


@pytest.mark.usefixtures("no_long_calls")
@pytest.mark.parametrize("how", ["deliver", "close"])
def test_outcomes_held_for_a_batch_go_on_deliver_and_on_close(how: str) -> None:
    """Two calls ended while a third runs long and two more wait: their outcomes are
    held for the batch, and handed over by deliver() (the worker's renewal beat) or
    by close() (a stop), while the long call still runs."""
    second = threading.Event()

    async def main() -> _Lane:
        lane = _Lane(batch=10)
        first = threading.Event()
        _fill(lane, first, {"quick": lambda: "quick"}, second)
        first.set()
        await asyncio.sleep(0.2)  # first and quick end; long runs
        assert lane.outcomes == []  # held: a round waits, the batch is not full
        if how == "deliver":
            lane.lane.deliver()
        else:
            lane.lane.close()
        assert lane.names()[:2] == ["first", "quick"]
        return await _release(lane, second, 5)

    lane = _ran(main, second)
    outcomes = {name: (error, result) for name, error, result in lane.outcomes}
    assert outcomes["long"] == (None, "freed")
    if how == "deliver":
        assert outcomes["x"] == (None, "x")
        assert outcomes["y"] == (None, "y")
    else:  # dropped by the close before a thread took them
        assert isinstance(outcomes["x"][0], NotStarted)
        assert isinstance(outcomes["y"][0], NotStarted)


def test_a_long_calls_outcome_goes_at_once() -> None:
    """A call that ran LONG_CALL or longer is not held for a batch, even while a round
    of calls waits."""
    free = threading.Event()

    async def main() -> _Lane:
        lane = _Lane(batch=10)
        lane.submit("slow", lambda: time.sleep(0.02) or "slow")
        lane.submit("held", _blocker(free))
        lane.submit("x", lambda: "x")
        await wait_for(lambda: len(lane.outcomes) == 1)
        assert lane.names() == ["slow"]
        free.set()
        await wait_for(lambda: len(lane.outcomes) == 3)
        lane.lane.close()
        return lane

    try:
        asyncio.run(main())
    finally:
        free.set()


@pytest.mark.usefixtures("no_long_calls")
def test_run_with_a_timeout_returns_an_outcome_held_for_a_batch() -> None:
    """run() (a call with a timeout: the worker's job path) gets its result once the
    timeout is up when its call ended in time but its outcome was held for a batch
    behind a call that runs on."""
    first, second = threading.Event(), threading.Event()

    def done(
        call: Any, error: BaseException | None, result: Any, started: float | None, took: float
    ) -> None:
        pass

    async def main() -> Any:
        lane = SyncLane(1, batch=10)
        lane.submit_many([_blocker(first)], done)
        run = asyncio.create_task(lane.run(lambda: "ran", timeout=0.05))
        await asyncio.sleep(0.01)  # queued behind the first
        lane.submit_many([_blocker(second)], done)
        lane.submit_many([lambda: None], done)
        first.set()
        try:
            return await asyncio.wait_for(run, 5)  # the second still runs
        finally:
            second.set()
            lane.close()

    try:
        assert asyncio.run(main()) == "ran"
    finally:
        first.set()
        second.set()


def test_submit_many_runs_every_call_in_order_and_a_closed_lane_starts_none() -> None:
    """submit_many (a claim's sync calls in one hand-over) runs them in the order
    given, across the lane's threads, and gives each outcome to ``done`` with its call
    and how long it ran; on a closed lane ``done`` gets NotStarted for each at once."""
    seen: list[int] = []
    outcomes: dict[int, tuple[BaseException | None, Any]] = {}
    took_: dict[int, float] = {}

    class Call:
        def __init__(self, i: int) -> None:
            self.i = i

        def __call__(self) -> int:
            seen.append(self.i)
            return self.i * self.i

    def done(
        call: Call, error: BaseException | None, result: Any, started: float | None, took: float
    ) -> None:
        outcomes[call.i] = (error, result)
        took_[call.i] = took

    async def main() -> None:
        lane = SyncLane(1, batch=1)
        lane.submit_many([Call(i) for i in range(20)], done)
        await wait_for(lambda: len(outcomes) == 20)
        lane.close()
        lane.submit_many([Call(i) for i in range(20, 23)], done)

    asyncio.run(main())
    assert seen == list(range(20))
    assert all(outcomes[i] == (None, i * i) for i in range(20))
    assert all(isinstance(outcomes[i][0], NotStarted) for i in range(20, 23))
    assert all(0 <= took_[i] < 5 for i in range(20))
    assert all(took_[i] == 0.0 for i in range(20, 23))


def test_the_gate_lets_in_at_once_as_enter_would_and_never_past_a_waiter() -> None:
    async def scenario() -> None:
        gate = pool.Gate(1)
        assert gate.try_enter()  # free, nobody waiting: in, as enter() would be
        assert not gate.try_enter()  # full
        waiter = asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)
        gate.leave()  # the place goes to the waiter, not to a later try_enter()
        assert not gate.try_enter()
        assert await waiter
        gate.leave()
        gate.close()
        assert not gate.try_enter()  # closed: nobody, as enter() returns False
        assert not await gate.enter()

    asyncio.run(scenario())


def test_a_call_held_until_its_not_before_starts_at_or_after_it_and_a_close_drops_it() -> None:
    """A call given a not_before (a message claimed ahead of its due time) starts at or
    after that instant, never before, while due calls behind it run on the other
    threads meanwhile; one still held when the lane closes never runs: ``done`` gets
    NotStarted, at once, not at its instant."""
    ran: dict[str, float] = {}
    outcomes: dict[str, BaseException | None] = {}

    def call(name: str) -> Callable[[], None]:
        def fn() -> None:
            ran[name] = time.monotonic()

        fn.__name__ = name
        return fn

    def done(
        fn: Any, error: BaseException | None, result: Any, started: float | None, took: float
    ) -> None:
        outcomes[fn.__name__] = error

    async def main() -> tuple[float, float]:
        lane = SyncLane(2, batch=1)
        held_until = time.monotonic() + 0.2
        lane.submit_many([call("held")], done, held_until)
        lane.submit_many([call("due")], done)
        await wait_for(lambda: "held" in outcomes)
        far = time.monotonic() + 30.0
        lane.submit_many([call("far")], done, far)
        await asyncio.sleep(0.05)  # a thread holds it now
        closed = time.monotonic()
        lane.close()
        await wait_for(lambda: "far" in outcomes)
        assert time.monotonic() - closed < 5.0
        return held_until, closed

    held_until, _ = asyncio.run(main())
    assert ran["held"] >= held_until
    assert ran["due"] < held_until  # not queued behind the held call
    assert outcomes["held"] is None
    assert outcomes["due"] is None
    assert "far" not in ran
    assert isinstance(outcomes["far"], NotStarted)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_every_call_of_submit_many_gets_its_own_outcome_once(threads: int, batch: int) -> None:
    """Whatever the threads and the batch: each call's outcome (what it returned, or
    what it raised: None here stands for a raise) comes to ``done`` once, with its own
    call, its start and how long it ran."""
    draw = random.Random(threads * 10 + batch)
    calls = [None if draw.random() < 0.3 else draw.randrange(1000) for _ in range(40)]
    got: dict[int, tuple[Any, BaseException | None, Any, float | None, float]] = {}
    came: list[int] = []

    def call(n: int, value: int | None) -> Callable[[], Any]:
        def fn() -> Any:
            if value is None:
                raise ValueError(n)
            return (n, value)

        return fn

    fns = [call(n, value) for n, value in enumerate(calls)]
    index = {id(fn): n for n, fn in enumerate(fns)}

    def done(
        fn: Any, error: BaseException | None, result: Any, started: float | None, took: float
    ) -> None:
        n = index[id(fn)]
        came.append(n)  # (an assert here would go to the loop's exception handler)
        got[n] = (fn, error, result, started, took)

    async def main() -> None:
        lane = SyncLane(threads, batch=batch)
        lane.submit_many(fns, done)
        try:
            await wait_for(lambda: len(got) == len(fns))
        finally:
            lane.close()

    asyncio.run(main())
    assert sorted(came) == list(range(len(calls)))  # each once
    for n, value in enumerate(calls):
        fn, error, result, started, took = got[n]
        assert fn is fns[n]
        if value is None:
            assert isinstance(error, ValueError)
            assert error.args == (n,)
            assert result is None
        else:
            assert (error, result) == (None, (n, value))
        assert started is not None
        assert took >= 0.0
