"""What a scheduled message costs ``Records`` (``memory://``, and the replicated
scheduler's state: issue 41, point 1) beyond the record itself: a message due after the
earliest second that holds one has no ordering entry of its own (a tuple, 64 B a
message at a million) until that second comes, only a slot in its second's bucket."""

from __future__ import annotations

import sys
import tracemalloc

from delayq.backends._far import Far
from delayq.backends._records import Records
from delayq.backends._replicated._codec import decode_records, encode_record, pack, unpack
from delayq.durable.message import Now, Record, State, put_request

EPOCH = 1_700_000_000_000


def _encode(record: Record) -> bytes:
    """A far record's image, as the replicated scheduler writes it."""
    return pack(encode_record(record))


def _decode(images: list[bytes]) -> list[Record]:
    return decode_records([unpack(image) for image in images])


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


def _far_store() -> Records:
    """Records that send what waits past 1,000 far, as the replicated scheduler's do."""
    return Records(
        Far(_encode, _decode),
        far_above=1000,
        far_take=500,
    )


def _traced_growth(store: Records, start: int, stop: int, payload: bytes) -> int:
    """The Python memory ``store`` grows by while it takes messages ``start`` to
    ``stop`` (due 10 ms apart from an hour on), their put requests let go of."""
    now = Now(EPOCH, EPOCH)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for at in range(start, stop, 500):
            batch = [
                put_request(
                    f"m{n:06d}", payload, "bytes", 5, {}, HOUR + 10 * n, None, "ignore", True
                )
                for n in range(at, min(at + 500, stop))
            ]
            store.put(batch, now)
            del batch
        assert store.far is not None
        store.far.flush()  # the writes waiting for their batch: a bounded few
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_with_far_a_backlog_past_the_first_thousand_costs_no_memory_of_its_own() -> None:
    """Issue 41, point 1: past the records kept in memory, a scheduled message costs
    the Python heap nothing, whatever its payload (what SQLite's page cache holds is
    bounded by its size, not the backlog); and the store is whole: stats count every
    message, claims take each at its time, earliest first."""
    payload = b"x" * 4000  # forty times a 100-byte payload: held, it would show
    store = _far_store()
    _traced_growth(store, 0, 5_000, payload)
    # (What memory holds moves between 500 and 1,000 records meanwhile: over 40,000
    # messages, under 7 B a message of them.)
    grown = _traced_growth(store, 5_000, 45_000, payload)
    assert grown / 40_000 < 16, grown / 40_000
    assert store.far is not None
    assert store.far.count > 40_000
    assert len(store.records) < 2_000
    later = Now(EPOCH + 2 * HOUR, EPOCH + 2 * HOUR)
    assert store.stats(Now(EPOCH, EPOCH)).scheduled == 45_000
    claimed = [r.id for r in store.claim(later, 45_000, 1000)]
    assert claimed == [f"m{n:06d}" for n in range(45_000)]
    assert store.far.count == 0


def test_with_far_a_backlog_due_at_one_time_goes_far_too() -> None:
    """Reminders at 09:45 tomorrow: 20,000 messages due at the same millisecond are
    split between memory and far by their sequence, and claimed in put order."""
    store = _far_store()
    now = Now(EPOCH, EPOCH)
    for at in range(0, 20_000, 500):
        store.put(
            [
                put_request(f"r{n:05d}", b"x", "bytes", 5, {}, None, EPOCH + HOUR, "ignore", True)
                for n in range(at, at + 500)
            ],
            now,
        )
    assert store.far is not None
    assert store.far.count > 18_000
    assert store.stats(now).scheduled == 20_000
    page = store.peek(State.SCHEDULED, 20_000, None, now)
    assert [r.id for r in page] == [f"r{n:05d}" for n in range(20_000)]
    later = Now(EPOCH + 2 * HOUR, EPOCH + 2 * HOUR)
    claimed = [r.id for r in store.claim(later, 20_000, 1000)]
    assert claimed == [f"r{n:05d}" for n in range(20_000)]
