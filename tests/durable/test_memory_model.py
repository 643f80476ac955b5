"""Random operations on memory:// with a FakeClock, checked against a tiny model."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import FakeClock, LeaseLost
from delayq.durable import Message, Queue, State

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 3000)),
        st.tuples(st.just("advance"), st.integers(0, 2000)),
        st.tuples(st.just("reserve"), st.integers(1, 4)),
        st.tuples(st.just("ack"), st.integers(0, 50)),
        st.tuples(st.just("ack_many"), st.integers(0, 6)),
        st.tuples(st.just("nack"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_memory_backend_never_early_never_doubled(ops: list[tuple[str, int]]) -> None:
    clock = FakeClock()
    q = Queue(f"memory://model-{uuid.uuid4().hex}", name="m", clock=clock, max_payload=None)
    alive: set[str] = set()
    held: dict[str, Message] = {}
    ids: list[str] = []
    try:
        for op, arg in ops:
            now = int(clock.time() * 1000)
            if op == "put":
                msg_id = q.put(len(ids), delay=arg / 1000, max_attempts=2)
                ids.append(msg_id)
                alive.add(msg_id)
            elif op == "advance":
                clock.advance(arg / 1000)
            elif op == "reserve":
                for msg in q.reserve(wait=0, max=arg, lease=1.5):
                    assert msg.due_at <= now
                    assert msg.id in alive
                    current = held.get(msg.id)
                    # a second holder only after the first one's lease expired
                    assert current is None or current.lease_expires_at <= now
                    held[msg.id] = msg
            elif held and op in ("ack", "nack"):
                msg = list(held.values())[arg % len(held)]
                valid = msg.lease_expires_at > now
                try:
                    if op == "ack":
                        q.ack(msg)
                        alive.discard(msg.id)
                    else:
                        q.nack(msg, delay=0.5)
                    assert valid
                except LeaseLost:
                    assert not valid
                del held[msg.id]
            elif op == "ack_many":
                batch = list(held.values())[:arg]
                # a lease held until now is acked; one expired, even if not yet re-reserved,
                # is reported lost, in batch order, and changes nothing
                expected = [m.id for m in batch if m.lease_expires_at <= now]
                assert q.ack_many(batch) == expected
                for msg in batch:
                    if msg.id not in expected:
                        alive.discard(msg.id)
                    del held[msg.id]
            elif ids and op == "cancel":
                msg_id = ids[arg % len(ids)]
                seen = q.get(msg_id)
                in_flight = seen is not None and seen.state is State.ACTIVE
                assert q.cancel(msg_id) is (seen is not None and not in_flight)
                if seen is not None and not in_flight:
                    alive.discard(msg_id)
            assert q.stats().total == len(alive)
    finally:
        q.purge()
        q.close()
