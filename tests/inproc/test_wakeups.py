"""No lost wake-ups: a waiting getter wakes for every change that concerns it.

Every case runs on both stores and three ways:
- ``thread``: DelayQueue, the getter a thread, the test acts from the main thread;
- ``task-xthread``: AsyncDelayQueue, the getter a task on a loop in another thread,
  the test acts from the main thread (the cross-thread wake path);
- ``task-loop``: the same, but the test acts on the loop's own thread.

Prompt wake-ups are checked against items due 30 s later, with bounds of a few
seconds at most: a lost wake-up fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue as stdlib_queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayq import AsyncDelayQueue, DelayQueue, FakeClock, HeapStore, QueueClosed, WheelStore

pytestmark = pytest.mark.timeout(30)

FAR = 30.0  # an item this far away must never be what a prompt wake-up waits for
PROMPT = 2.0  # generous: a wake-up normally takes well under a millisecond
Result = concurrent.futures.Future  # of (value, monotonic time when it came out)


class Harness:
    """Starts getters on one face and performs the test's actions on that face."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.queues: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        if kind != "thread":
            self.loop = asyncio.new_event_loop()
            runner = threading.Thread(target=self.loop.run_forever, daemon=True)
            runner.start()
            self.threads.append(runner)

    @property
    def is_async(self) -> bool:
        return self.loop is not None

    def make(self, store: Any, clock: FakeClock | None = None) -> Any:
        q = (AsyncDelayQueue if self.is_async else DelayQueue)(store=store, clock=clock)
        self.queues.append(q)
        return q

    def get(self, q: Any, *, many: int = 0) -> Result:
        """Start a blocking get (or get_many(max=many)); its future gives (value, when)."""
        if self.loop is not None:

            async def run() -> tuple[Any, float]:
                value = await (q.get_many(max=many) if many else q.get())
                return value, time.monotonic()

            return asyncio.run_coroutine_threadsafe(run(), self.loop)
        fut: Result = concurrent.futures.Future()

        def work() -> None:
            try:
                value = q.get_many(max=many, timeout=20) if many else q.get(timeout=20)
                fut.set_result((value, time.monotonic()))
            except BaseException as exc:
                fut.set_exception(exc)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        self.threads.append(t)
        return fut

    def act(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` as the test's action: on the loop thread for ``task-loop``."""
        if self.kind != "task-loop":
            return fn()
        assert self.loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(PROMPT)

    def wait_for_waiters(self, q: Any, n: int = 1) -> None:
        """Block until ``n`` getters sleep on ``q`` (so the action cannot race them)."""
        deadline = time.monotonic() + 5
        while True:
            if self.is_async:
                state = q._debug_state()
                if state["waiters"] >= n and state["sleepers"] >= n:
                    return
            elif q._waiters >= n:
                return
            assert time.monotonic() < deadline, "the getters never started waiting"
            time.sleep(0.002)

    def close(self) -> None:
        for q in self.queues:
            q.clear()
            q.close()
        if self.loop is not None:
            loop = self.loop

            async def cancel_all() -> None:
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
        for t in self.threads:
            t.join(5)
        if self.loop is not None:
            self.loop.close()


@pytest.fixture(params=["thread", "task-xthread", "task-loop"])
def h(request: pytest.FixtureRequest) -> Any:
    harness = Harness(request.param)
    yield harness
    harness.close()


def value_of(fut: Result, timeout: float = PROMPT) -> Any:
    return fut.result(timeout)[0]


def assert_still_waiting(fut: Result, for_seconds: float = 0.05) -> None:
    with pytest.raises(concurrent.futures.TimeoutError):
        fut.result(for_seconds)


# -- real time -------------------------------------------------------------------------------


def test_wakes_when_an_earlier_item_is_put(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    q.put("far", delay=FAR)
    fut = h.get(q)
    h.wait_for_waiters(q)
    start = time.monotonic()
    early = h.act(lambda: q.put("early", delay=0.05))
    value, when = fut.result(PROMPT)
    assert value == "early"
    assert when >= early.deadline
    assert when - start < PROMPT


def test_wakes_when_an_item_is_put_into_an_empty_queue(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert_still_waiting(fut)
    h.act(lambda: q.put("now"))
    assert value_of(fut) == "now"


def test_head_cancelled_then_the_next_item_comes_at_its_time(h: Harness, make_store: Any) -> None:
    # A fake clock: the cancel lands before the head is due however slow the machine
    # (times in binary fractions of a second, so the advances add up exactly).
    clock = FakeClock()
    q = h.make(make_store(), clock=clock)
    head = q.put("head", delay=1)
    q.put("later", delay=2.5)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert h.act(lambda: q.cancel(head))
    clock.advance(2)  # past the cancelled head, before the next
    assert_still_waiting(fut)
    clock.advance(0.5)
    assert value_of(fut) == "later"
    assert not head.pending


def test_head_cancelled_and_an_earlier_item_arrives(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    head = q.put("head", delay=FAR / 2)
    q.put("far", delay=FAR)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert h.act(lambda: q.cancel(head))
    assert_still_waiting(fut)
    h.act(lambda: q.put("soon", delay=0.02))
    assert value_of(fut) == "soon"


def test_head_rescheduled_earlier(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    head = q.put("head", delay=FAR)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert h.act(lambda: q.reschedule(head, delay=0.05))
    value, when = fut.result(PROMPT)
    assert value == "head"
    assert when >= head.deadline


def test_non_head_rescheduled_before_the_head(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    q.put("head", delay=FAR)
    other = q.put("other", delay=2 * FAR)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert h.act(lambda: q.reschedule(other, delay=0.03))
    assert value_of(fut) == "other"


def test_head_rescheduled_later_is_not_taken_early(h: Harness, make_store: Any) -> None:
    clock = FakeClock()  # the reschedule lands before the head is due, however slow
    q = h.make(make_store(), clock=clock)
    head = q.put("head", delay=1)
    q.put("next", delay=2)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert h.act(lambda: q.reschedule(head, delay=4))
    clock.advance(1.5)  # past the head's old time
    assert_still_waiting(fut)
    clock.advance(0.5)
    assert value_of(fut) == "next"
    fut = h.get(q)
    h.wait_for_waiters(q)
    clock.advance(1.75)
    assert_still_waiting(fut)
    clock.advance(0.25)
    assert value_of(fut) == "head"


def test_item_rescheduled_into_the_past(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    q.put("far", delay=FAR)
    moved = q.put("moved", delay=2 * FAR)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert h.act(lambda: q.reschedule(moved, delay=-5))
    assert value_of(fut) == "moved"


def test_clear_keeps_the_getter_waiting_correctly(h: Harness, make_store: Any) -> None:
    clock = FakeClock()  # the clear lands before the item is due, however slow
    q = h.make(make_store(), clock=clock)
    q.put("dropped", delay=1)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert h.act(q.clear) == ["dropped"]
    clock.advance(2)
    assert_still_waiting(fut)  # past the dropped item's time: nothing came
    h.act(lambda: q.put("new", delay=0.5))
    clock.advance(0.25)
    assert_still_waiting(fut)
    clock.advance(0.25)
    assert value_of(fut) == "new"


def test_clear_after_close_wakes_the_getter_to_raise(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    q.put("far", delay=FAR)
    fut = h.get(q)
    h.wait_for_waiters(q)
    h.act(q.close)
    assert_still_waiting(fut)  # closed, but an item is still pending
    h.act(q.clear)
    with pytest.raises(QueueClosed):
        fut.result(PROMPT)


def test_close_wakes_a_getter_of_an_empty_queue(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    fut = h.get(q)
    h.wait_for_waiters(q)
    h.act(q.close)
    with pytest.raises(QueueClosed):
        fut.result(PROMPT)


def test_after_close_getters_still_get_pending_items_then_raise(
    h: Harness, make_store: Any
) -> None:
    q = h.make(make_store())
    # Due well after the getter starts waiting, even on a loaded machine: at 0.1 s a
    # getter thread that started late took it at once and never waited (CI, 4 workers).
    item = q.put("pending", delay=0.5)
    fut = h.get(q)
    h.wait_for_waiters(q)
    h.act(q.close)
    value, when = fut.result(PROMPT)
    assert value == "pending"
    assert when >= item.deadline
    with pytest.raises(QueueClosed):
        h.get(q).result(PROMPT)


def test_cancelling_the_last_item_after_close_wakes_getters_to_raise(
    h: Harness, make_store: Any
) -> None:
    q = h.make(make_store())
    last = q.put("last", delay=FAR)
    futs = [h.get(q) for _ in range(3)]
    h.wait_for_waiters(q, 3)
    h.act(q.close)
    assert_still_waiting(futs[0])
    assert h.act(lambda: q.cancel(last))
    for fut in futs:
        with pytest.raises(QueueClosed):
            fut.result(PROMPT)


def test_several_getters_waiting_are_all_served(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    futs = [h.get(q) for _ in range(4)]
    h.wait_for_waiters(q, 4)

    def put_all() -> None:
        for i in range(4):
            q.put(i)

    h.act(put_all)
    assert sorted(value_of(f) for f in futs) == [0, 1, 2, 3]
    assert len(q) == 0


def test_several_getters_served_as_items_fall_due(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    futs = [h.get(q) for _ in range(3)]
    h.wait_for_waiters(q, 3)
    handles = h.act(lambda: [q.put(i, delay=0.02 * (3 - i)) for i in range(3)])
    results = [f.result(PROMPT) for f in futs]
    assert sorted(v for v, _ in results) == [0, 1, 2]
    for value, when in results:
        assert when >= handles[value].deadline


def test_get_many_getter_wakes_with_every_due_item(h: Harness, make_store: Any) -> None:
    q = h.make(make_store())
    q.put("far", delay=FAR)
    fut = h.get(q, many=10)

    h.wait_for_waiters(q)
    h.act(lambda: [q.put(i, delay=0.02) for i in range(3)])
    values = value_of(fut)
    assert values[0] == 0
    assert set(values) <= {0, 1, 2}
    rest = [] if len(values) == 3 else value_of(h.get(q, many=10))
    assert values + rest == [0, 1, 2]


# -- FakeClock -------------------------------------------------------------------------------


def test_fake_clock_advance_wakes_a_blocked_get(h: Harness, make_store: Any) -> None:
    clock = FakeClock()
    q = h.make(make_store(), clock=clock)
    item = q.put("x", delay=10)
    fut = h.get(q)
    h.wait_for_waiters(q)
    assert_still_waiting(fut)  # fake time stands still: no real timeout fires
    clock.advance(9.5)
    assert_still_waiting(fut)
    clock.advance(0.5)
    value, _ = fut.result(PROMPT)
    assert value == "x"
    assert clock.monotonic() >= item.deadline


def test_fake_clock_earlier_put_then_advance(h: Harness, make_store: Any) -> None:
    clock = FakeClock()
    q = h.make(make_store(), clock=clock)
    q.put("far", delay=1_000)
    fut = h.get(q)
    h.wait_for_waiters(q)
    head = h.act(lambda: q.put("head", delay=5))
    assert_still_waiting(fut)
    assert h.act(lambda: q.reschedule(head, delay=20))
    clock.advance(5)
    assert_still_waiting(fut)  # the head moved to 20 s: not due at 5 s
    clock.advance(15)
    assert value_of(fut) == "head"


def test_fake_clock_many_getters_one_advance(h: Harness, make_store: Any) -> None:
    clock = FakeClock()
    q = h.make(make_store(), clock=clock)
    for i in range(3):
        q.put(i, delay=1 + i)
    futs = [h.get(q) for _ in range(3)]
    h.wait_for_waiters(q, 3)
    clock.advance(3)
    assert sorted(value_of(f) for f in futs) == [0, 1, 2]


# -- the async face ----------------------------------------------------------------------------


@pytest.mark.parametrize("store_kind", ["heap", "wheel"])
def test_cancelling_a_waiting_get_task_leaves_nothing_behind(store_kind: str) -> None:
    q: AsyncDelayQueue[str] = AsyncDelayQueue(
        store=HeapStore() if store_kind == "heap" else WheelStore(tick=0.001)
    )

    async def run() -> None:
        q.put("far", delay=FAR)
        cancelled = asyncio.ensure_future(q.get())
        other = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.02)
        assert q._debug_state() == {"waiters": 2, "sleepers": 2}
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert q._debug_state() == {"waiters": 1, "sleepers": 1}
        q.put("next", delay=0.01)
        assert await asyncio.wait_for(other, PROMPT) == "next"
        assert q._debug_state() == {"waiters": 0, "sleepers": 0}
        # wait_for timing out cancels the get: nothing left behind either
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(q.get(), 0.02)
        assert q._debug_state() == {"waiters": 0, "sleepers": 0}

    asyncio.run(run())


def test_a_cancelled_getter_that_was_already_woken_passes_the_item_on() -> None:
    q: AsyncDelayQueue[str] = AsyncDelayQueue()

    async def run() -> None:
        first = asyncio.ensure_future(q.get())
        second = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.02)
        q.put("item")  # wakes one getter (on this thread: at once)...
        first.cancel()  # ...which is cancelled before it runs
        done = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 2)
        got = [r for r in done if r == "item"]
        assert len(got) == 1, done
        assert q._debug_state() == {"waiters": 0, "sleepers": 0}
        assert len(q) == 0

    asyncio.run(run())


def test_async_getters_fed_by_sync_producer_threads() -> None:
    q: AsyncDelayQueue[int] = AsyncDelayQueue()
    n = 300

    def produce(base: int) -> None:
        for i in range(n):
            q.put(base + i, delay=(i % 5) * 0.002)

    async def consume(out: list[int]) -> None:
        async for item in q:
            out.append(item)

    async def run() -> list[int]:
        out: list[int] = []
        tasks = [asyncio.ensure_future(consume(out)) for _ in range(3)]
        threads = [threading.Thread(target=produce, args=(k * n,)) for k in range(2)]
        await asyncio.sleep(0.01)
        for t in threads:
            t.start()
        while len(out) < 2 * n:
            await asyncio.sleep(0.01)
        for t in threads:
            t.join(5)
        q.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return out

    out = asyncio.run(run())
    assert sorted(out) == list(range(2 * n))
    assert q._debug_state() == {"waiters": 0, "sleepers": 0}


def test_sync_get_is_not_woken_by_a_later_put_but_still_gets_the_head() -> None:
    q: DelayQueue[str] = DelayQueue()
    head = q.put("head", delay=0.1)
    results: list[tuple[str, float]] = []

    def getter() -> None:
        results.append((q.get(timeout=5), time.monotonic()))

    t = threading.Thread(target=getter)
    t.start()
    time.sleep(0.02)
    q.put("later", delay=0.5)
    t.join(PROMPT)
    assert not t.is_alive()
    assert results[0][0] == "head"
    assert results[0][1] >= head.deadline


def test_sync_get_timeout_still_expires_with_items_pending() -> None:
    q: DelayQueue[str] = DelayQueue()
    q.put("far", delay=FAR)
    start = time.monotonic()
    with pytest.raises(stdlib_queue.Empty):
        q.get(timeout=0.1)
    assert 0.1 <= time.monotonic() - start < PROMPT
    assert q._waiters == 0
