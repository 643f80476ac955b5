"""queues(), peek() and due_counts(): read-only inspection, the same on every backend."""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from delayq import Queue, QueueClosed
from delayq.durable import State

from ._helpers import stored_request


def backend_now(q: Any) -> int:
    """The backend's now (epoch ms, its own clock), as due_counts reports it."""
    start, _ = q.due_counts(1, 1)
    return int(start)


def at(ms: int) -> float:
    """``at=`` (epoch seconds) for an epoch ms."""
    return ms / 1000.0


def expected_counts(dues: list[int], start: int, horizon_ms: int, buckets: int) -> list[int]:
    """The contract of due_counts, spelled out."""
    width = -(-horizon_ms // buckets)
    counts = [0] * buckets
    for due in dues:
        for i in range(buckets):
            if due > start and start + i * width <= due < start + (i + 1) * width:
                counts[i] += 1
    return counts


# -- queues() ----------------------------------------------------------------------------


def test_queues_lists_exactly_the_queues_with_messages(
    make_queue: Callable[..., Any], backend_url: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    ready = make_queue(f"ready-{tag}")
    later = make_queue(f"later-{tag}")
    empty = make_queue(f"empty-{tag}")
    dead = make_queue(f"dead-{tag}")
    # Glob and hash-tag characters: a put refuses '{' and '}' in a name now, but a queue
    # an older version stored under such a name is still listed (its SCAN pattern is
    # escaped), and readable.
    odd = make_queue(f"g*[?]\\}}:{{x}}:1-{tag}")
    ready.put("r")
    later.put("s", delay=3600)
    dead.put("d", max_attempts=1)
    dead.nack(dead.reserve(wait=0)[0])
    with Queue(backend_url) as raw:
        raw.backend.put(odd.name, [stored_request("o", b'"o"')])
    mine = {q.name for q in (ready, later, empty, dead, odd)}

    def listed() -> list[str]:
        return [name for name in ready.queues() if name in mine]

    assert listed() == sorted(mine - {empty.name})
    assert [name for name in empty.queues() if name in mine] == listed()  # any queue answers
    later.purge()
    odd.cancel(odd.peek()[0].id)
    assert listed() == sorted([ready.name, dead.name])
    [msg] = ready.reserve(wait=0, lease=60)
    assert ready.name in listed()  # an active message counts
    ready.ack(msg)
    dead.purge()
    assert listed() == []


def test_queues_of_a_closed_queue_raise(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    q.close()
    with pytest.raises(QueueClosed):
        q.queues()


# -- peek() ------------------------------------------------------------------------------


def test_peek_shows_waiting_messages_in_due_order_then_put_order(q: Any) -> None:
    first = q.put("active")
    [held] = q.reserve(wait=0, lease=60)
    assert held.id == first
    now = backend_now(q)
    far = q.put("far", at=at(now + 60_000))
    tie1 = q.put("tie1", at=at(now + 30_000))
    tie2 = q.put("tie2", at=at(now + 30_000))
    ready1 = q.put("ready1")
    ready2 = q.put("ready2", at=at(now - 5_000))  # a past at= is due now
    before = q.stats()
    counts = (before.scheduled, before.ready, before.active, before.dead, before.next_due_at)

    waiting = q.peek()
    assert [m.id for m in waiting] == [ready1, ready2, tie1, tie2, far]
    assert [m.state for m in waiting] == [State.READY] * 2 + [State.SCHEDULED] * 3
    assert [m.payload for m in waiting] == ["ready1", "ready2", "tie1", "tie2", "far"]
    assert all(m.queue == q.name for m in waiting)
    assert all(m.lease is None and m.lease_expires_at is None for m in waiting)
    assert [m.due_at for m in waiting] == [q.get(m.id).due_at for m in waiting]
    assert waiting[2].due_at == waiting[3].due_at
    assert [m.id for m in q.peek(State.READY)] == [ready1, ready2]
    assert [m.id for m in q.peek("READY", limit=1)] == [ready1]
    assert [m.id for m in q.peek("scheduled")] == [tie1, tie2, far]
    assert [m.id for m in q.peek("scheduled", limit=2)] == [tie1, tie2]
    assert [m.id for m in q.peek(limit=1)] == [ready1]
    # Nothing changed: same counts, and a reserve takes what peek showed first.
    after = q.stats()
    assert (after.scheduled, after.ready, after.active, after.dead, after.next_due_at) == counts
    [taken] = q.reserve(wait=0)
    assert taken.id == ready1
    q.ack(held)


def test_peek_active_by_lease_expiry_without_token_and_changes_nothing(q: Any) -> None:
    long = q.put("long")
    short = q.put("short")
    [held_long] = q.reserve(wait=0, lease=120)
    [held_short] = q.reserve(wait=0, lease=30)
    assert (held_long.id, held_short.id) == (long, short)
    active = q.peek("active")
    assert [m.id for m in active] == [short, long]
    assert all(m.state is State.ACTIVE and m.attempts == 1 for m in active)
    assert all(m.lease is None for m in active)
    expiries = [held_short.lease_expires_at, held_long.lease_expires_at]
    assert [m.lease_expires_at for m in active] == expiries
    assert [m.id for m in q.peek("active", limit=1)] == [short]
    assert q.peek() == []
    q.ack(held_short)  # the lease still holds
    q.ack(held_long)
    assert q.peek("active") == []


def test_peek_dead_is_dead(q: Any) -> None:
    for name in ("a", "b", "c"):
        q.put(name, id=name, max_attempts=1)
        q.nack(q.reserve(wait=0)[0], error=f"boom {name}")
    assert [m.id for m in q.peek("dead")] == [m.id for m in q.dead()] == ["a", "b", "c"]
    assert [m.id for m in q.peek(State.DEAD, limit=2)] == ["a", "b"]
    assert q.peek("dead")[0].last_error == "boom a"
    assert q.peek("dead")[0].state is State.DEAD


def test_peek_sees_an_expired_lease_settled(q: Any) -> None:
    back = q.put("back")
    gone = q.put("gone", max_attempts=1)
    [a, b] = q.reserve(wait=0, lease=0.05, max=2)
    assert {a.id, b.id} == {back, gone}
    time.sleep(0.15)
    assert q.peek("active") == []
    [again] = q.peek("ready")
    assert (again.id, again.state, again.attempts) == (back, State.READY, 1)
    assert again.due_at == (a if a.id == back else b).lease_expires_at
    assert [m.id for m in q.peek()] == [back]
    assert [m.id for m in q.peek("dead")] == [gone]


def test_peek_of_an_unknown_queue_is_empty(make_queue: Callable[..., Any]) -> None:
    q = make_queue()
    for state in (None, *State):
        assert q.peek(state) == []


def test_peek_reads_a_large_limit(q: Any) -> None:
    q.put_many([{"payload": i, "delay": 60 + i} for i in range(30)])
    assert [m.payload for m in q.peek(limit=10_000)] == list(range(30))


# -- due_counts() ------------------------------------------------------------------------


def test_due_counts_buckets_what_falls_due(q: Any) -> None:
    now = backend_now(q)
    for seconds in (15, 25, 25.5, 55, 200):
        q.put(seconds, at=at(now + int(seconds * 1000)))
    q.put("ready")  # due already: not counted
    q.put("past", at=at(now - 60_000))
    q.put("active")
    q.reserve(wait=0, max=3, lease=60)
    start, counts = q.due_counts(60, 6)
    assert now <= start <= now + 5_000
    assert counts == [0, 1, 2, 0, 0, 1]
    assert sum(counts) <= q.stats().scheduled
    start, counts = q.due_counts("1h", 1)
    assert counts == [5]
    assert sum(q.due_counts(datetime.timedelta(minutes=1))[1]) == 4
    assert len(q.due_counts()[1]) == 60


def test_due_counts_bucket_boundaries(q: Any) -> None:
    now = backend_now(q)
    width = 2_000
    base = now + 10 * width
    wanted = [base + k * width + d for k in range(3) for d in (-1, 0, 1)]
    wanted += [now + 1, now + 30 * width - 1, now + 30 * width, now + 30 * width + 5]
    ids = [q.put(due, at=at(due)) for due in wanted]
    dues = [q.get(id).due_at for id in ids]  # as stored (at= is rounded up to the ms)
    start, counts = q.due_counts(30 * width / 1000, 30)
    assert len(counts) == 30
    assert counts == expected_counts(dues, start, 30 * width, 30)
    # A width that does not divide the horizon: ceil(10_000 / 3) = 3334 ms per bucket,
    # so the last bucket reaches past the horizon.
    start, counts = q.due_counts(10, 3)
    assert counts == expected_counts(dues, start, 10_000, 3)


def test_due_counts_of_an_empty_queue(q: Any) -> None:
    before = int(time.time() * 1000) - 5_000
    start, counts = q.due_counts(10, 5)
    assert counts == [0] * 5
    assert before <= start


# -- bad input ---------------------------------------------------------------------------

BAD_PEEK: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"limit": 0}, ValueError),
    ({"limit": -1}, ValueError),
    ({"limit": 10_001}, ValueError),
    ({"limit": 1.5}, TypeError),
    ({"limit": True}, TypeError),
    ({"limit": "10"}, TypeError),
    ({"state": "nope"}, ValueError),
    ({"state": 3}, ValueError),
]

BAD_DUE_COUNTS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"horizon": 0}, ValueError),
    ({"horizon": -5}, ValueError),
    ({"horizon": float("nan")}, ValueError),
    ({"horizon": float("inf")}, ValueError),
    ({"horizon": "soon"}, ValueError),
    ({"horizon": "367d"}, ValueError),
    ({"horizon": True}, TypeError),
    ({"horizon": None}, TypeError),
    ({"buckets": 0}, ValueError),
    ({"buckets": 1001}, ValueError),
    ({"buckets": 2.0}, TypeError),
    ({"buckets": False}, TypeError),
]


def _no_call(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the backend was called with bad input")


@pytest.mark.parametrize(("kwargs", "error"), BAD_PEEK)
def test_bad_peek_raises_before_the_backend_is_called(
    q: Any, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    monkeypatch.setattr(q.backend, "peek", _no_call)
    with pytest.raises(error):
        q.peek(**kwargs)


@pytest.mark.parametrize(("kwargs", "error"), BAD_DUE_COUNTS)
def test_bad_due_counts_raises_before_the_backend_is_called(
    q: Any, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    monkeypatch.setattr(q.backend, "due_counts", _no_call)
    with pytest.raises(error):
        q.due_counts(**kwargs)


def test_the_limits_themselves_are_accepted(q: Any) -> None:
    assert q.peek(limit=10_000) == []
    assert q.due_counts("366d", 1000)[1] == [0] * 1000


def test_get_and_peek_show_when_a_lease_expires_but_never_its_token(q: Any) -> None:
    """An in-flight message is visible: when its lease ends (the lease token, which
    settles it, stays with the consumer)."""
    q.put("x", id="held")
    [held] = q.reserve(wait=0, lease=600)
    assert held.lease is not None
    assert held.lease_expires_at is not None
    got = q.get("held")
    assert got.state is State.ACTIVE
    assert got.lease is None
    assert got.lease_expires_at == held.lease_expires_at
    [peeked] = q.peek("active")
    assert peeked.lease is None
    assert peeked.lease_expires_at == held.lease_expires_at
    # Once settled, a message has no lease to show.
    q.release(held)
    assert q.get("held").lease_expires_at is None


def _position(state: str | None, message: Any) -> tuple[int, ...]:
    if state == "dead":
        return (message.seq,)
    if state == "active":
        return (message.lease_expires_at, message.seq)
    return (message.due_at, message.seq)


def _pages(q: Any, state: str | None, limit: int) -> list[str]:
    seen: list[str] = []
    after = None
    while True:
        page = q.peek(state, limit, after=after)
        seen.extend(m.id for m in page)
        if len(page) < limit:
            return seen
        after = _position(state, page[-1])


def test_peek_pages_after_a_position_in_its_order(q: Any) -> None:
    now = backend_now(q)
    for n in range(7):  # pairs share a due time: put order among them
        q.put(n, id=f"s{n}", at=at(now + 60_000 + (n // 2) * 1000))
    for n in range(5):
        q.put(n, id=f"r{n}")
    assert _pages(q, None, 3) == [m.id for m in q.peek(limit=100)]
    assert _pages(q, "scheduled", 2) == [f"s{n}" for n in range(7)]
    assert _pages(q, "ready", 2) == [f"r{n}" for n in range(5)]
    # After the position of a message that is gone, the next ones all the same.
    [_, second] = q.peek("scheduled", 2)
    q.cancel(second.id)
    assert [m.id for m in q.peek("scheduled", 2, after=_position(None, second))] == ["s2", "s3"]
    q.put("late", id="s-late", at=at(now + 600_000))
    assert _pages(q, "scheduled", 4)[-1] == "s-late"
    held = q.reserve(wait=0, lease=60, max=3) + q.reserve(wait=0, lease=30, max=2)
    assert sorted(_pages(q, "active", 2)) == sorted(m.id for m in held)
    assert _pages(q, "active", 2) == [m.id for m in q.peek("active", 100)]
    for message in held:
        q.nack(message, dead=True)
    dead = [m.id for m in q.dead(100)]
    assert len(dead) == 5
    assert _pages(q, "dead", 2) == dead
    [one, two] = q.dead(2)
    assert [m.id for m in q.dead(2, after_seq=two.seq)] == dead[2:4]
    assert [m.id for m in q.dead(100, after_seq=one.seq)] == dead[1:]
    with pytest.raises(TypeError):
        q.peek("dead", after=(1, 2))
    with pytest.raises(ValueError, match="after_seq"):
        q.dead(after_seq=-1)
