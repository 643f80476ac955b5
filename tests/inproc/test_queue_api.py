"""The public surface of DelayQueue and AsyncDelayQueue, on every store."""

from __future__ import annotations

import asyncio
import math
import queue as stdlib_queue
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import delayq
from delayq import (
    AsyncDelayQueue,
    DelayQueue,
    FakeClock,
    Handle,
    HeapStore,
    QueueClosed,
    WheelStore,
)

pytestmark = pytest.mark.timeout(30)

MONO, WALL = 1_000.0, 1_700_000_000.0
AnyQueue = Any  # DelayQueue[Any] | AsyncDelayQueue[Any]


class Face:
    """Drives either face with one vocabulary; the async face runs under asyncio.run."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.cls: Callable[..., AnyQueue] = DelayQueue if kind == "sync" else AsyncDelayQueue

    def __repr__(self) -> str:
        return self.kind

    def get(self, q: AnyQueue, timeout: float = 5.0) -> Any:
        if self.kind == "sync":
            return q.get(timeout=timeout)
        return asyncio.run(asyncio.wait_for(q.get(), timeout))

    def get_many(self, q: AnyQueue, max: int = 100) -> list[Any]:
        if self.kind == "sync":
            return q.get_many(max=max, timeout=5.0)  # type: ignore[no-any-return]
        return asyncio.run(asyncio.wait_for(q.get_many(max=max), 5.0))

    def drain(self, q: AnyQueue) -> list[Any]:
        """Iterate until the (closed) queue is empty."""
        if self.kind == "sync":
            return list(q)

        async def run() -> list[Any]:
            return [item async for item in q]

        return asyncio.run(asyncio.wait_for(run(), 5.0))


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Face:
    return Face(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(monotonic=MONO, wall=WALL)


@pytest.fixture
def q(face: Face, make_store: Callable[[], Any], clock: FakeClock) -> AnyQueue:
    return face.cls(store=make_store(), clock=clock)


def drain_due(q: AnyQueue) -> list[Any]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except stdlib_queue.Empty:
            return out


# -- construction ------------------------------------------------------------------------


def test_default_store_and_clock(face: Face) -> None:
    q = face.cls()
    h = q.put("x")
    assert face.get(q) == "x"
    assert not h.pending
    assert not q.closed
    assert q.clock.monotonic() == pytest.approx(time.monotonic(), abs=1.0)


def test_a_store_cannot_be_shared_by_two_queues(face: Face, make_store: Any) -> None:
    store = make_store()
    face.cls(store=store)
    with pytest.raises(ValueError, match="one queue"):
        DelayQueue(store=store)
    with pytest.raises(ValueError, match="one queue"):
        AsyncDelayQueue(store=store)
    used = make_store()
    used.push("x", 0.0)
    with pytest.raises(ValueError, match="one queue"):
        face.cls(store=used)


def test_a_clock_must_be_a_clock(face: Face) -> None:
    with pytest.raises(TypeError, match="clock"):
        face.cls(clock=time.monotonic)


# -- ordering and timing ------------------------------------------------------------------------


def test_due_items_come_out_by_deadline_then_put_order(q: AnyQueue, clock: FakeClock) -> None:
    q.put("c1", delay=3)
    q.put("a", delay=1)
    q.put("c2", delay=3)
    q.put("now1")
    q.put("b", delay=2.0)
    q.put("now2", delay=0)
    q.put("c3", delay="3s")
    assert drain_due(q) == ["now1", "now2"]
    clock.advance(10)
    assert drain_due(q) == ["a", "b", "c1", "c2", "c3"]


def test_never_early_on_a_fake_clock(q: AnyQueue, clock: FakeClock) -> None:
    h = q.put("x", delay=10)
    assert h.deadline == MONO + 10
    clock.advance(9.999)
    with pytest.raises(stdlib_queue.Empty):
        q.get_nowait()
    assert h.pending
    clock.advance(0.001)  # exactly at the deadline: due
    assert q.get_nowait() == "x"
    assert not h.pending


@pytest.mark.timeout(20)
def test_never_early_in_real_time(face: Face, make_store: Any) -> None:
    q = face.cls(store=make_store())
    delays = [0.12, 0.01, 0.05, 0.0, 0.08, 0.03, 0.05, 0.1]
    handles = {i: q.put(i, delay=d) for i, d in enumerate(delays)}
    out = []
    for _ in delays:
        item = face.get(q, timeout=5.0)
        assert time.monotonic() >= handles[item].deadline
        out.append(item)
    expected = sorted(range(len(delays)), key=lambda i: (handles[i].deadline, i))
    assert out == expected
    assert len(q) == 0


def test_put_alone_is_due_now(q: AnyQueue, face: Face) -> None:
    h = q.put("x")
    assert h.deadline == MONO
    assert q.get_nowait() == "x"
    q.put("y")
    assert face.get(q) == "y"


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [
        (2, 2.0),
        (0.5, 0.5),
        (timedelta(seconds=3), 3.0),
        (timedelta(milliseconds=1), 0.001),
        ("250ms", 0.25),
        ("90s", 90.0),
        ("30m", 1_800.0),
        ("1h30m", 5_400.0),
        ("1.5h", 5_400.0),
        ("2d", 172_800.0),
        ("500us", 0.0005),
    ],
)
def test_delay_forms(q: AnyQueue, clock: FakeClock, delay: object, seconds: float) -> None:
    h = q.put("x", delay=delay)
    assert h.deadline == pytest.approx(MONO + seconds, abs=1e-9)
    clock.advance(seconds * 0.999)
    assert drain_due(q) == []
    clock.advance(seconds * 0.001 + 1e-6)
    assert drain_due(q) == ["x"]


def test_at_forms(q: AnyQueue, clock: FakeClock) -> None:
    when = datetime.fromtimestamp(WALL + 30, tz=timezone.utc)
    h1 = q.put("aware", at=when)
    h2 = q.put("epoch", at=WALL + 30)
    h3 = q.put("int-epoch", at=int(WALL) + 60)
    h4 = q.put("other-tz", at=when.astimezone(timezone(timedelta(hours=-5))))
    assert h1.deadline == pytest.approx(MONO + 30)
    assert h2.deadline == MONO + 30
    assert h3.deadline == MONO + 60
    assert h4.deadline == pytest.approx(MONO + 30)
    clock.advance(29.99)
    assert drain_due(q) == []
    clock.advance(0.02)
    assert drain_due(q) == ["aware", "epoch", "other-tz"]
    # at= was converted once, at put: moving the wall clock alone changes nothing.
    clock._wall -= 1_000
    clock.advance(30)
    assert drain_due(q) == ["int-epoch"]


def test_negative_delay_and_past_at_are_due_now_behind_items_already_due(
    q: AnyQueue, clock: FakeClock
) -> None:
    q.put("earlier", delay=5)
    clock.advance(10)
    q.put("now")
    neg = q.put("negative", delay=-5)
    past = q.put("past-at", at=WALL)  # 10 s ago
    old = q.put("long-ago", at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    q.put("neg-str-td", delay=timedelta(hours=-1))
    assert neg.deadline == past.deadline == old.deadline == clock.monotonic()
    assert drain_due(q) == ["earlier", "now", "negative", "past-at", "long-ago", "neg-str-td"]


BAD_PUTS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"delay": math.nan}, ValueError),
    ({"delay": math.inf}, ValueError),
    ({"delay": -math.inf}, ValueError),
    ({"delay": 1e308 * 10}, ValueError),
    ({"delay": "5 minutes"}, ValueError),
    ({"delay": "1m1h"}, ValueError),
    ({"delay": ""}, ValueError),
    ({"delay": "5 s"}, ValueError),
    ({"delay": "nan"}, ValueError),
    ({"delay": True}, TypeError),
    ({"delay": False}, TypeError),
    ({"delay": [1]}, TypeError),
    ({"delay": b"5s"}, TypeError),
    ({"at": datetime(2030, 1, 1)}, ValueError),  # naive
    ({"at": math.nan}, ValueError),
    ({"at": math.inf}, ValueError),
    ({"at": -math.inf}, ValueError),
    ({"at": True}, TypeError),
    ({"at": "2030-01-01T00:00:00Z"}, TypeError),
    ({"delay": 1, "at": WALL + 5}, ValueError),
    ({"delay": 0, "at": WALL}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_PUTS, ids=[repr(k) for k, _ in BAD_PUTS])
def test_bad_put_raises_and_changes_nothing(
    q: AnyQueue, clock: FakeClock, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    keep = q.put("keep", delay=1)
    with pytest.raises(error):
        q.put("bad", **kwargs)
    assert len(q) == 1
    assert q.peek() is keep
    clock.advance(1e6)
    assert drain_due(q) == ["keep"]


@pytest.mark.parametrize(("kwargs", "error"), BAD_PUTS, ids=[repr(k) for k, _ in BAD_PUTS])
def test_bad_reschedule_raises_and_changes_nothing(
    q: AnyQueue, clock: FakeClock, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    h = q.put("x", delay=5)
    with pytest.raises(error):
        q.reschedule(h, **kwargs)
    assert h.pending
    assert h.deadline == MONO + 5
    clock.advance(4.9)
    assert drain_due(q) == []
    clock.advance(0.1)
    assert drain_due(q) == ["x"]


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("1s", TypeError),
    ],
)
def test_bad_timeout(make_store: Any, timeout: Any, error: type[Exception]) -> None:
    q: DelayQueue[str] = DelayQueue(store=make_store())
    q.put("x")
    with pytest.raises(error):
        q.get(timeout=timeout)
    with pytest.raises(error):
        q.get_many(timeout=timeout)
    assert len(q) == 1


@pytest.mark.parametrize(
    ("max_items", "error"), [(0, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_bad_max(face: Face, make_store: Any, max_items: Any, error: type[Exception]) -> None:
    q = face.cls(store=make_store())
    q.put("x")
    with pytest.raises(error):
        face.get_many(q, max=max_items)
    assert len(q) == 1


# -- getting --------------------------------------------------------------------------------


def test_get_nowait_raises_stdlib_empty(q: AnyQueue) -> None:
    with pytest.raises(stdlib_queue.Empty):
        q.get_nowait()
    q.put("later", delay=1)
    with pytest.raises(stdlib_queue.Empty):
        q.get_nowait()


def test_get_with_timeout_raises_empty_in_real_time(make_store: Any) -> None:
    q: DelayQueue[str] = DelayQueue(store=make_store())
    q.put("later", delay=30)
    start = time.monotonic()
    with pytest.raises(stdlib_queue.Empty):
        q.get(timeout=0.05)
    assert time.monotonic() - start >= 0.05
    with pytest.raises(stdlib_queue.Empty):
        q.get(timeout=0)
    with pytest.raises(stdlib_queue.Empty):
        q.get_many(timeout=0.01)
    assert len(q) == 1


def test_get_timeout_runs_on_the_queue_clock(make_store: Any, clock: FakeClock) -> None:
    q: DelayQueue[str] = DelayQueue(store=make_store(), clock=clock)
    q.put("later", delay=100)
    errors: list[BaseException] = []

    def getter() -> None:
        try:
            q.get(timeout=5)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=getter)
    t.start()
    time.sleep(0.05)
    assert t.is_alive()  # fake time has not moved
    clock.advance(5)
    t.join(2)
    assert not t.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], stdlib_queue.Empty)


def test_get_many(q: AnyQueue, face: Face, clock: FakeClock) -> None:
    for i in range(5):
        q.put(i)
    q.put("later", delay=1)
    assert face.get_many(q, max=3) == [0, 1, 2]
    assert face.get_many(q) == [3, 4]
    clock.advance(1)
    assert face.get_many(q, max=1) == ["later"]
    assert len(q) == 0


def test_get_many_takes_every_due_item_up_to_max_in_one_go(q: AnyQueue, face: Face) -> None:
    for i in range(250):
        q.put(i)
    assert face.get_many(q) == list(range(100))  # the default max
    assert face.get_many(q, max=1_000) == list(range(100, 250))


def test_sync_get_many_with_timeout(make_store: Any) -> None:
    q: DelayQueue[int] = DelayQueue(store=make_store())
    with pytest.raises(stdlib_queue.Empty):
        q.get_many(max=10, timeout=0.02)
    q.put(1, delay=0.05)
    q.put(2, delay=0.05)
    got = q.get_many(max=10, timeout=2)
    assert got in ([1, 2], [1])
    if got == [1]:
        assert q.get(timeout=2) == 2


def test_peek_returns_the_same_handle(q: AnyQueue, clock: FakeClock) -> None:
    assert q.peek() is None
    later = q.put("later", delay=10)
    assert q.peek() is later
    first = q.put("first", delay=5)
    assert q.peek() is first
    assert isinstance(first, Handle)
    assert first.value == "first"
    assert first.pending
    assert first.deadline == MONO + 5
    assert q.reschedule(first, delay=20)
    assert q.peek() is later  # not due yet, but first to come out
    assert q.cancel(later)
    assert q.peek() is first
    assert first.deadline == MONO + 20
    clock.advance(20)
    assert q.get_nowait() == "first"
    assert q.peek() is None


def test_len_and_clear(q: AnyQueue, clock: FakeClock) -> None:
    assert len(q) == 0
    hs = [q.put("c", delay=3), q.put("a", delay=1), q.put("now"), q.put("b", delay=2)]
    assert len(q) == 4
    q.cancel(hs[3])
    assert len(q) == 3
    assert q.clear() == ["now", "a", "c"]
    assert len(q) == 0
    assert not any(h.pending for h in hs)
    assert q.clear() == []
    assert q.cancel(hs[0]) is False
    clock.advance(10)
    assert drain_due(q) == []
    q.put("after-clear")
    assert q.get_nowait() == "after-clear"


def test_handles(q: AnyQueue, clock: FakeClock) -> None:
    a = q.put({"k": 1}, delay=1)
    b = q.put({"k": 1}, delay=1)
    assert a is not b
    assert a != b
    assert len({a, b}) == 2  # hashable, by identity
    assert "pending" in repr(a)
    clock.advance(1)
    assert q.get_nowait() == {"k": 1}
    assert not a.pending
    assert b.pending
    assert "done" in repr(a)
    assert a.deadline == MONO + 1  # still tells when it was due


def test_cancel(q: AnyQueue, clock: FakeClock) -> None:
    h = q.put("x", delay=1)
    other = q.put("y", delay=1)
    assert q.cancel(h) is True
    assert q.cancel(h) is False
    assert not h.pending
    clock.advance(1)
    assert drain_due(q) == ["y"]
    assert q.cancel(other) is False  # already came out


def test_reschedule(q: AnyQueue, clock: FakeClock) -> None:
    a = q.put("a", delay=5)
    b = q.put("b", delay=10)
    c = q.put("c", delay=10)
    assert q.reschedule(a, delay=10)  # behind b and c now
    assert a.deadline == MONO + 10
    assert q.reschedule(c, at=WALL + 1)
    assert c.deadline == MONO + 1
    clock.advance(1)
    assert drain_due(q) == ["c"]
    assert q.reschedule(b)  # neither: now
    assert drain_due(q) == ["b"]
    assert q.reschedule(b, delay=1) is False  # no longer pending
    assert q.cancel(a)
    assert q.reschedule(a, delay=1) is False
    assert not a.pending
    clock.advance(100)
    assert drain_due(q) == []


def test_reschedule_into_the_past_is_due_now_behind_items_already_due(
    q: AnyQueue, clock: FakeClock
) -> None:
    q.put("first", delay=1)
    h = q.put("moved", delay=50)
    clock.advance(2)
    q.put("second")
    assert q.reschedule(h, delay=-10)
    assert h.deadline == clock.monotonic()
    assert drain_due(q) == ["first", "second", "moved"]


def test_handles_of_another_queue_raise_value_error(face: Face, make_store: Any) -> None:
    q1 = face.cls(store=make_store())
    q2 = face.cls(store=make_store())
    foreign = q2.put("x", delay=10)
    mine = q1.put("y", delay=10)
    for call in (q1.cancel, q1.reschedule):
        with pytest.raises(ValueError, match="another"):
            call(foreign)
    with pytest.raises(ValueError, match="another"):
        q1.reschedule(foreign, delay=1)
    assert foreign.pending
    assert mine.pending
    assert len(q1) == 1
    assert len(q2) == 1
    with pytest.raises(TypeError):
        q1.cancel("not a handle")
    with pytest.raises(TypeError):
        q1.cancel([0.0, 1.0, "x", None])


# -- closing --------------------------------------------------------------------------------


def test_close(q: AnyQueue, face: Face, clock: FakeClock) -> None:
    due = q.put("due")
    later = q.put("later", delay=5)
    gone = q.put("gone", delay=7)
    moved = q.put("moved", delay=9)
    q.close()
    q.close()  # idempotent
    assert q.closed
    with pytest.raises(QueueClosed):
        q.put("x")
    with pytest.raises(QueueClosed):
        q.put("x", delay=1)
    assert len(q) == 4
    # cancel, reschedule and clear still work
    assert q.cancel(gone)
    assert q.reschedule(moved, delay=6)
    assert q.get_nowait() == "due"
    assert not due.pending
    with pytest.raises(stdlib_queue.Empty):  # closed but not empty
        q.get_nowait()
    clock.advance(5)
    assert face.get(q) == "later"
    assert not later.pending
    clock.advance(1)
    assert face.get(q) == "moved"
    with pytest.raises(QueueClosed):
        q.get_nowait()
    with pytest.raises(QueueClosed):
        face.get(q)
    with pytest.raises(QueueClosed):
        face.get_many(q)
    assert face.drain(q) == []


def test_clear_after_close_drains(q: AnyQueue, face: Face) -> None:
    q.put("x", delay=5)
    q.close()
    assert q.clear() == ["x"]
    with pytest.raises(QueueClosed):
        face.get(q)


def test_iteration_ends_when_closed_and_empty(q: AnyQueue, face: Face, clock: FakeClock) -> None:
    for i in range(5):
        q.put(i)
    q.put(5, delay=1)
    clock.advance(1)
    q.close()
    assert face.drain(q) == [0, 1, 2, 3, 4, 5]


def test_sync_iteration_follows_items_as_they_fall_due(make_store: Any) -> None:
    q: DelayQueue[int] = DelayQueue(store=make_store())
    for i, d in enumerate([0.03, 0.01, 0.02]):
        q.put(i, delay=d)
    out = []
    for item in q:
        out.append(item)
        if len(out) == 3:
            q.close()
    assert out == [1, 2, 0]


def test_async_get_has_no_timeout_argument() -> None:
    q: AsyncDelayQueue[int] = AsyncDelayQueue()

    async def run() -> None:
        with pytest.raises(TypeError):
            await q.get(timeout=1)  # type: ignore[call-arg]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(q.get(), 0.02)

    asyncio.run(run())
    assert q._debug_state() == {"waiters": 0, "sleepers": 0}


def test_repr(q: AnyQueue) -> None:
    q.put("x")
    assert "open" in repr(q)
    assert "pending=1" in repr(q)
    q.close()
    assert "closed" in repr(q)


def test_exports() -> None:
    for name in ("DelayQueue", "AsyncDelayQueue", "HeapStore", "WheelStore", "QueueClosed"):
        assert name in delayq.__all__
    assert issubclass(delayq.QueueClosed, delayq.DelayqError)
    assert HeapStore is delayq.HeapStore
    assert WheelStore is delayq.WheelStore


def test_due_at_is_the_deadline_on_the_wall_clock(q: AnyQueue, clock: FakeClock) -> None:
    h = q.put("x", delay=90)
    due = datetime.fromtimestamp(WALL + 90, timezone.utc)
    assert h.due_at == due
    assert h.due_at.tzinfo is timezone.utc
    assert q.peek() is h
    assert "due=2023-11-14T22:14:50.000Z (in 1m30s)" in repr(h)
    assert f"deadline={MONO + 90:.6f}" in repr(h)
    clock.advance(30)
    assert h.due_at == due  # time passing does not move it
    assert "(in 1m)" in repr(h)
    at = datetime.fromtimestamp(WALL + 3600, timezone.utc)
    q.reschedule(h, at=at)
    assert abs(h.due_at - at) < timedelta(milliseconds=1)
    q.reschedule(h, delay="250ms")
    assert "(in 250ms)" in repr(h)
    clock.advance(1.5)
    assert q.get_nowait() == "x"
    assert h.due_at == datetime.fromtimestamp(WALL + 30.25, timezone.utc)  # when it was due
    assert "(1.25s ago)" in repr(h)
    assert "done" in repr(h)


def test_due_at_of_a_cancelled_handle_and_of_a_far_one(q: AnyQueue, clock: FakeClock) -> None:
    h = q.put("x", delay=5)
    assert q.cancel(h)
    assert h.due_at == datetime.fromtimestamp(WALL + 5, timezone.utc)
    far = q.put("far", delay=1e15)  # beyond what a datetime holds
    assert far.due_at == datetime.max.replace(tzinfo=timezone.utc)
    assert "due=beyond year 9999" in repr(far)


def test_due_at_on_the_system_clock(make_store: Callable[[], Any]) -> None:
    q: DelayQueue[str] = DelayQueue(make_store())
    before = datetime.now(timezone.utc)
    h = q.put("x", delay="1h")
    after = datetime.now(timezone.utc)
    assert before + timedelta(hours=1) <= h.due_at + timedelta(milliseconds=1)
    assert h.due_at <= after + timedelta(hours=1, milliseconds=1)


def test_a_store_serves_one_queue_whatever_its_clock() -> None:
    store: HeapStore[str] = HeapStore()
    with pytest.raises(TypeError):
        DelayQueue(store, clock=object())  # type: ignore[arg-type]
    DelayQueue(store)  # the refused clock did not bind it
    with pytest.raises(ValueError, match="belongs to one queue"):
        DelayQueue(store, clock=FakeClock())
