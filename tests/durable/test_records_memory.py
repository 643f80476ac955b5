"""What a scheduled message costs ``Records`` (``memory://``, and the replicated
scheduler's state: issue 41, point 1) beyond the record itself: a message due after the
earliest second that holds one has no ordering entry of its own (a tuple, 64 B a
message at a million) until that second comes, only a slot in its second's bucket."""

from __future__ import annotations

import sys
import tracemalloc

from delayq.backends._records import Records
from delayq.durable.message import Now, State, put_request

EPOCH = 1_700_000_000_000
HOUR = 3_600_000
COUNT = 20_000


def test_a_message_waiting_past_the_next_second_costs_no_ordering_entry() -> None:
    now = Now(EPOCH, EPOCH)
    # Due in an hour, over ten seconds: as put_many's batches of a steady flow arrive.
    batches = [
        [
            put_request(
                f"m{n}", b"x" * 100, "bytes", 5, {}, HOUR + n // 2000 * 1000, None, "ignore", True
            )
            for n in range(start, start + 1000)
        ]
        for start in range(0, COUNT, 1000)
    ]
    store = Records()
    tracemalloc.start()
    try:
        for batch in batches:
            store.put(batch, now)
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # What the records themselves hold that the put made (the payloads and ids are
    # the requests'), each object once: the rest is the structure that orders them.
    own: dict[int, int] = {id(store.records): sys.getsizeof(store.records)}
    for record in store.records.values():
        for obj in (record, record.due_at, record.seq):
            own[id(obj)] = sys.getsizeof(obj)
    overhead = (traced - sum(own.values())) / COUNT
    assert overhead < 32, overhead
    # And the order is whole: pages of scheduled messages, each ending inside a second,
    # and then claims, give the messages earliest first, in put order.
    paged: list[str] = []
    after = None
    while page := store.peek(State.SCHEDULED, 777, after, now):
        paged += [r.id for r in page]
        after = (page[-1].due_at, page[-1].seq)
    assert paged == [f"m{n}" for n in range(COUNT)]
    later = Now(EPOCH + 2 * HOUR, EPOCH + 2 * HOUR)
    claimed = [r.id for r in store.claim(later, COUNT, 1000)]
    assert claimed == [f"m{n}" for n in range(COUNT)]
    assert store.stats(later).active == COUNT
    assert all(r.state is State.ACTIVE for r in store.records.values())
