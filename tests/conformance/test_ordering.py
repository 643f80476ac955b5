"""Order (due time, then put order), never early, and waking a waiting reserve."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from delayq.durable import State

from ._helpers import in_thread, now_ms


def test_equal_due_times_come_out_in_put_order(q: Any) -> None:
    at = time.time() + 0.1
    ids = [q.put(i, at=at) for i in range(20)]
    batch = q.reserve(wait=5, max=20)
    while len(batch) < 20:
        more = q.reserve(wait=5, max=20 - len(batch))
        assert more
        batch += more
    assert [m.id for m in batch] == ids
    assert [m.payload for m in batch] == list(range(20))


def test_put_order_holds_across_seq_byte_boundaries(q: Any) -> None:
    """310 messages due at one time (a batch, then single puts): their sequence
    numbers cross 256, where a seq stored in the wrong byte order would sort 256
    before 255. The ids run backwards, so an order by id cannot pass for put order."""
    at = time.time() + 0.2
    ids = q.put_many([{"payload": i, "at": at, "id": f"z{999 - i:04d}"} for i in range(300)])
    ids += [q.put(300 + i, at=at, id=f"a{99 - i:02d}") for i in range(10)]
    got: list[str] = []
    while len(got) < 310:
        batch = q.reserve(wait=5, max=310 - len(got))
        assert batch
        got += [m.id for m in batch]
    assert got == ids
    assert q.reserve(wait=0) == []


def test_due_messages_come_out_earliest_due_first(q: Any) -> None:
    q.stats()  # connect first: a put slower than the gaps below would be due at once
    t0 = time.time()
    q.put("c", at=t0 + 0.6)
    q.put("a", at=t0 + 0.2)
    q.put("b", at=t0 + 0.4)
    time.sleep(max(0.0, t0 + 0.65 - time.time()))
    assert [m.payload for m in q.reserve(wait=0, max=10)] == ["a", "b", "c"]


def test_messages_due_now_in_put_order(q: Any) -> None:
    for i in range(10):
        q.put(i)
    assert [m.payload for m in q.reserve(wait=0, max=10)] == list(range(10))


def test_reserve_returns_at_most_max(q: Any) -> None:
    for i in range(5):
        q.put(i)
    assert len(q.reserve(wait=0, max=3)) == 3
    assert len(q.reserve(wait=0, max=10)) == 2
    assert q.reserve(wait=0, max=10) == []


def test_never_early(q: Any) -> None:
    started = time.monotonic()  # before the put: the delay starts inside the put
    q.put("x", delay=0.2)
    # Nothing yet, unless the put and this reserve took the whole 0.2 s (a loaded
    # machine): what it took must then be due all the same.
    [msg] = q.reserve(wait=0) or q.reserve(wait=5)
    assert now_ms() >= msg.due_at
    assert time.monotonic() - started >= 0.2 - 0.001  # 1 ms: wall and monotonic rates
    assert msg.state is State.ACTIVE


def test_due_at_is_epoch_ms_rounded_up(q: Any) -> None:
    at = time.time() + 3600.0004
    msg_id = q.put("x", at=at)
    assert q.get(msg_id).due_at == math.ceil(at * 1000)
    aware = datetime.now(timezone.utc) + timedelta(hours=1)
    msg_id = q.put("y", at=aware)
    assert q.get(msg_id).due_at == math.ceil(aware.timestamp() * 1000)


def test_delay_forms(q: Any) -> None:
    before = now_ms()
    ids = {
        q.put("s", delay=1.5): 1500,
        q.put("t", delay=timedelta(minutes=2)): 120_000,
        q.put("u", delay="1h30m"): 5_400_000,
        q.put("v", delay="250ms"): 250,
    }
    after = now_ms()
    for msg_id, ms in ids.items():
        due = q.get(msg_id).due_at
        assert before + ms <= due <= after + ms + 1


def test_negative_delay_and_past_at_mean_due_now(q: Any) -> None:
    before = now_ms()
    a = q.put("a", delay=-5)
    b = q.put("b", at=time.time() - 3600)
    c = q.put("c", at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    for msg_id in (a, b, c):
        msg = q.get(msg_id)
        assert msg.due_at >= before
        assert msg.state is State.READY
    assert [m.payload for m in q.reserve(wait=0, max=3)] == ["a", "b", "c"]


def test_waiting_reserve_wakes_on_put(q: Any) -> None:
    waiting = in_thread(q.reserve, wait=10)
    time.sleep(0.1)
    assert not waiting.done()
    started = time.monotonic()
    q.put("now")
    [msg] = waiting.result(5)
    assert msg.payload == "now"
    assert time.monotonic() - started < 2


def test_waiting_reserve_wakes_for_an_earlier_message(q: Any) -> None:
    q.put("late", delay=60)
    waiting = in_thread(q.reserve, wait=10)
    time.sleep(0.1)
    q.put("early", delay=0.05)
    [msg] = waiting.result(5)
    assert msg.payload == "early"


def test_waiting_reserve_sleeps_until_due(q: Any) -> None:
    # Timed from before the put: the delay counts from when the server took the put,
    # and its reply may take a while to come back on a loaded machine.
    started = time.monotonic()
    q.put("x", delay=0.3)
    [msg] = q.reserve(wait=None)
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 5
    assert msg.payload == "x"


def test_reserve_gives_up_after_wait(q: Any) -> None:
    q.put("later", delay=60)
    started = time.monotonic()
    assert q.reserve(wait=0.2) == []
    assert 0.15 <= time.monotonic() - started < 5


def test_queues_are_isolated_and_one_name_is_one_queue(make_queue: Any) -> None:
    a = make_queue(name="shared-name")
    b = make_queue(name="shared-name")
    other = make_queue()
    a.put("hello", id="same")
    other.put("other", id="same")
    assert b.get("same").payload == "hello"
    assert other.get("same").payload == "other"
    [msg] = b.reserve(wait=0)
    assert msg.payload == "hello"
    a.ack(msg)
    assert b.get("same") is None
    assert other.get("same") is not None
