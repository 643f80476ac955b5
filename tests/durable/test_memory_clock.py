"""memory:// on a FakeClock: timing without sleeping."""

from __future__ import annotations

import threading
import time
import uuid

from delayq import FakeClock
from delayq.durable import Queue, State


def _queue(clock: FakeClock) -> Queue:
    return Queue(f"memory://fake-{uuid.uuid4().hex}", name="q", clock=clock)


def test_due_time_and_lease_expiry_follow_the_fake_clock() -> None:
    clock = FakeClock()
    with _queue(clock) as q:
        msg_id = q.put("x", delay=10)
        assert q.get(msg_id).due_at == int(clock.time() * 1000) + 10_000
        assert q.reserve(wait=0) == []
        clock.advance(10)
        [msg] = q.reserve(wait=0, lease=5)
        assert msg.lease_expires_at == int(clock.time() * 1000) + 5000
        clock.advance(4.999)
        assert q.get(msg_id).state is State.ACTIVE
        clock.advance(0.001)
        assert q.get(msg_id).state is State.READY
        assert q.stats().lag == 0.0
        clock.advance(2)
        assert q.stats().lag == 2.0


def test_waiting_reserve_wakes_when_the_fake_clock_advances() -> None:
    clock = FakeClock()
    with _queue(clock) as q:
        q.put("x", delay=60)
        got: list[object] = []
        thread = threading.Thread(target=lambda: got.extend(q.reserve(wait=None)))
        thread.start()
        time.sleep(0.05)
        assert not got
        clock.advance(30)
        time.sleep(0.05)
        assert not got
        clock.advance(30)
        thread.join(5)
        assert len(got) == 1
