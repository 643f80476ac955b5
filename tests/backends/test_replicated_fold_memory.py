"""A hot standby keeps nothing of the messages it saw come and go (issue 41, point 1):
it folds every logged entry but never claims, so the stale entries its puts, claims
and acks leave (a due bucket's holds the record, payload and all) are dropped as it
folds, not kept until it is elected. No broker: the scheduler's :class:`Journal` fed
logged entries through the codec."""

from __future__ import annotations

import tracemalloc

from delayq.backends._replicated._codec import decode_requests, encode_requests, pack, unpack
from delayq.backends._replicated._scheduler._journal import Journal
from delayq.durable.message import Now, put_request

T0 = 1_700_000_000_000
COUNT = 20_000


def test_a_hot_standby_holds_nothing_of_the_messages_acked() -> None:
    elected = Journal()
    entries: list[bytes] = []

    def logged(now: Now) -> None:
        images, deletes = elected.take_changes()
        entries.append(pack(["op", "q", "r", now.floor, elected.last_seq, images, deletes]))

    now = Now(T0, T0)
    for start in range(0, COUNT, 1000):
        batch = [
            put_request(f"m{n}", b"x" * 100, "bytes", 5, {}, 1000, None, "ignore", True)
            for n in range(start, start + 1000)
        ]
        elected.put(decode_requests(unpack(pack(encode_requests(batch)))), now)
        logged(now)
    now = Now(T0 + 2000, T0 + 2000)
    while claimed := elected.claim(now, 1000, 30_000):
        logged(now)
        elected.ack_many([(r.id, r.lease or "") for r in claimed], now)
        logged(now)
    assert not elected.records

    tracemalloc.start()
    try:
        standby = Journal()
        for body in entries:
            entry = unpack(body)
            standby.restore(entry[5], entry[6], entry[4])
        del entry
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert not standby.records
    # What is left is the records dict's table, which keeps the size it grew to (~33 B
    # a message at the peak), and at most a thousand stale entries: a message kept
    # whole (~350 B), or its heap entry and id (~150 B), would be far above this.
    assert held / COUNT < 64, held / COUNT
