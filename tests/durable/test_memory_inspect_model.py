"""memory://'s peek() and due_counts() against a tiny model, with a FakeClock."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import FakeClock
from delayq.durable import Message, Queue

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(-500, 5000)),
        st.tuples(st.just("advance"), st.integers(0, 2000)),
        st.tuples(st.just("reserve"), st.integers(1, 3)),
        st.tuples(st.just("ack"), st.integers(0, 50)),
    ),
    max_size=50,
)


@dataclass
class Model:
    """One message as the model sees it: where it waits, or until when it is held."""

    id: str
    due: int
    seq: int
    lease_until: int | None = None


def settled(model: Model, now: int) -> Model:
    if model.lease_until is not None and model.lease_until <= now:
        return Model(model.id, model.lease_until, model.seq)  # attempts never run out here
    return model


@settings(max_examples=150, deadline=None)
@given(ops=OPS, horizon=st.integers(1, 8000), buckets=st.integers(1, 12), limit=st.integers(1, 8))
def test_peek_and_due_counts_match_the_model(
    ops: list[tuple[str, int]], horizon: int, buckets: int, limit: int
) -> None:
    clock = FakeClock()
    q = Queue(f"memory://inspect-{uuid.uuid4().hex}", name="m", clock=clock)
    messages: dict[str, Model] = {}
    held: dict[str, Message] = {}
    seq = 0
    try:
        for op, arg in ops:
            if op == "put":
                seq += 1
                id = q.put(seq, delay=arg / 1000, max_attempts=1000)
                messages[id] = Model(id, q.get(id).due_at, seq)
            elif op == "advance":
                clock.advance(arg / 1000)
            elif op == "reserve":
                for msg in q.reserve(wait=0, max=arg, lease=1.5):
                    assert msg.lease_expires_at is not None
                    model = settled(messages[msg.id], int(clock.time() * 1000))
                    messages[msg.id] = Model(msg.id, model.due, model.seq, msg.lease_expires_at)
                    held[msg.id] = msg
            elif op == "ack":
                now = int(clock.time() * 1000)
                live = [m for m in held.values() if (m.lease_expires_at or 0) > now]
                if live:
                    chosen = live[arg % len(live)]
                    q.ack(chosen)
                    del messages[chosen.id], held[chosen.id]
        now = int(clock.time() * 1000)
        view = [settled(m, now) for m in messages.values()]
        waiting = sorted((m for m in view if m.lease_until is None), key=lambda m: (m.due, m.seq))
        active = sorted(
            (m for m in view if m.lease_until is not None), key=lambda m: (m.lease_until, m.seq)
        )
        assert [m.id for m in q.peek(limit=limit)] == [m.id for m in waiting][:limit]
        ready = [m.id for m in waiting if m.due <= now]
        assert [m.id for m in q.peek("ready", limit)] == ready[:limit]
        scheduled = [m.id for m in waiting if m.due > now]
        assert [m.id for m in q.peek("scheduled", limit)] == scheduled[:limit]
        assert [m.id for m in q.peek("active", limit)] == [m.id for m in active][:limit]
        assert all(m.lease is None for m in q.peek("active", limit))
        width = -(-horizon // buckets)
        expected = [0] * buckets
        for m in waiting:
            if m.due > now and (m.due - now) // width < buckets:
                expected[(m.due - now) // width] += 1
        assert q.due_counts(horizon / 1000, buckets) == (now, expected)
    finally:
        q.purge()
        q.close()
