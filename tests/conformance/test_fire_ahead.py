"""Fire ahead, on every backend: a waiting reserve may claim a message up to the
backend's ``fire_ahead_ms`` before its due time and hold it until then (the contract's
"Fire ahead", :mod:`delayq.durable.backend`). What a user may see of it is bounded:

* never early: the message reaches the caller at or after its due time;
* the window: until ``fire_ahead_ms`` before its due time a message is scheduled to
  every other operation (``cancel`` True and it is never delivered, ``reschedule``
  moves it, ``get`` shows it scheduled), even with a reserve parked for it;
* a holder that dies holding it: an expired lease, counted from the due time;
* a message put while another is held is free for any reserve at once.

Every backend under test runs on this machine, so ``time.time()`` is the clock the store
reads; each check measures against it after the call, so a loaded machine can make a
check inconclusive (then tried again), never wrong.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayq.durable import Queue
from delayq.durable.message import State
from delayq.durable.registry import descriptor

#: How long before the edge of the window the window test sends its calls, one try
#: after the other while the machine is too slow to finish them before the edge.
MARGINS = (0.005, 0.01, 0.02, 0.04, 0.08)


def _window_ms(q: Any) -> int:
    """How long before its due time a message may be in flight on ``q``'s backend."""
    return int(getattr(q.backend, "fire_ahead_ms", 0))


def _parked(q: Any, out: list[Any], *, wait: float, max: int = 1) -> threading.Thread:
    """A thread parked in ``q.reserve(wait=...)`` (taking what it gets into ``out``)."""

    def run() -> None:
        msgs = q.reserve(wait=wait, max=max)
        out.append((time.time(), msgs))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _sleep_until(epoch: float) -> None:
    left = epoch - time.time()
    if left > 0:
        time.sleep(left)


def test_a_parked_reserve_hands_over_at_the_due_time_never_before(q: Any) -> None:
    early = []
    for delay in (0.005, 0.012, 0.03, 0.051):
        got: list[Any] = []
        parked = _parked(q, got, wait=2.0)
        time.sleep(0.02)  # parked first: the claim fires ahead rather than after a wake
        q.put("x", delay=delay)
        parked.join(5)
        [(handed, [msg])] = got
        if handed * 1000 < msg.due_at:
            early.append(f"due {msg.due_at}, handed over at {handed * 1000:.3f}")
        q.ack(msg)
    assert early == []


def test_within_the_window_only_is_a_message_in_flight(q: Any) -> None:
    """cancel, reschedule and get sent just before the window see the messages
    scheduled, though a reserve is parked for them; none of them is delivered."""
    window = _window_ms(q) / 1000
    for margin in MARGINS:
        due = time.time() + 0.3
        ids = [q.put(name, at=due) for name in ("cancelled", "moved", "looked at")]
        got: list[Any] = []
        parked = _parked(q, got, wait=0.6, max=3)
        edge = math.floor(due * 1000) / 1000 - window  # the due time: whole ms, not before
        _sleep_until(edge - margin)
        cancelled = q.cancel(ids[0])
        moved = q.reschedule(ids[1], delay=3600)
        seen = q.get(ids[2])
        if time.time() >= edge:  # the machine was too slow to tell: try again
            parked.join(5)
            q.purge()
            continue
        assert cancelled is True
        assert moved is True
        assert seen is not None
        assert seen.state is State.SCHEDULED
        parked.join(5)
        [(_, msgs)] = got
        assert [msg.id for msg in msgs] == [ids[2]]
        assert q.get(ids[0]) is None
        moved_msg = q.get(ids[1])
        assert moved_msg is not None
        assert moved_msg.state is State.SCHEDULED
        return
    pytest.skip(f"the machine was too slow {len(MARGINS)} times to call before the window")


@pytest.fixture
def holder(backend_url: str, q: Any) -> Callable[[int], Any]:
    """``holder(lease_ms)``: what a reserve that fires ahead claims of ``q``'s queue
    (``reserve_ahead`` of a second backend object), then that object closes without
    acking, releasing or holding: a holder that died with the answer in hand."""
    if descriptor(backend_url).replicated:
        pytest.skip("the scheduler fires ahead and holds: tests/backends/test_amqp.py")
    other = Queue(backend_url, name=q.name)

    def claim(lease_ms: int) -> Any:
        try:
            return other.backend.reserve_ahead(q.name, limit=1, lease_ms=lease_ms, wait=2.0)
        finally:
            other.close()

    return claim


def test_a_holder_that_dies_leaves_an_expired_lease_from_the_due_time(
    q: Any, holder: Callable[[int], Any]
) -> None:
    msg_id = q.put("x", delay=0.05)
    claimed = holder(300)
    [record] = claimed.records
    assert record.id == msg_id
    # Leased from the due time when claimed ahead (from the claim when it came late).
    claimed_ms = claimed.now_us // 1000
    assert record.due_at + 300 <= record.lease_until <= max(record.due_at, claimed_ms + 1) + 300
    assert q.cancel(msg_id) is False
    [msg] = q.reserve(wait=2.0)
    assert time.time() * 1000 >= record.lease_until
    assert msg.id == msg_id
    assert msg.attempts == 2
    assert msg.last_error == "lease expired"
    q.ack(msg)


def test_a_message_put_while_another_is_held_is_free_at_once(
    q: Any, holder: Callable[[int], Any]
) -> None:
    held_id = q.put("held", delay=0.05)
    claimed = holder(30_000)
    assert [record.id for record in claimed.records] == [held_id]
    now_id = q.put("now")
    put_done = time.time()
    [msg] = q.reserve(wait=0)
    assert msg.id == now_id
    assert msg.due_at <= put_done * 1000  # due at once: not behind the held one
    q.ack(msg)
