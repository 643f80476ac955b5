"""``Records.stats``, ``peek`` and ``dead`` do not visit every record (``memory://`` and
the replicated scheduler answer them from it, and a dashboard asks every few seconds):
stats from counts kept as records change, pages from walks of the heaps. After any
sequence of the contract's operations, at any time, they answer what visiting the records
one by one answers (``compute_stats``, ``select_peek``), and a claim still takes the
earliest due message."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from delayq import DuplicateId, LeaseLost
from delayq.backends._far import Far
from delayq.backends._records import Records
from delayq.backends._replicated._codec import decode_records, encode_record, pack, unpack
from delayq.durable.inspection import peek_order, select_peek
from delayq.durable.message import Now, PutRequest, Record, State, compute_stats, settle

IDS = [f"m{n}" for n in range(8)]
EPOCH = 1_700_000_000_000


def _encode(record: Record) -> bytes:
    """A far record's image, as the replicated scheduler writes it."""
    return pack(encode_record(record))


def _decode(images: list[bytes]) -> list[Record]:
    return decode_records([unpack(image) for image in images])


#: Each operation's arguments (``claim``: how many; ``ack``...: which held message).
STEPS = {
    "put": st.tuples(st.sampled_from(IDS), st.integers(-50, 400)),
    "replace": st.tuples(st.sampled_from(IDS), st.integers(-50, 400)),
    "advance": st.tuples(st.integers(0, 300)),
    "back": st.tuples(st.integers(1, 100)),  # a clock that went back
    "stats": st.tuples(st.integers(0, 0)),
    "claim": st.tuples(st.integers(1, 3)),
    "claim_ahead": st.tuples(st.integers(0, 200)),
    "ack": st.tuples(st.integers(0, 7)),
    "ack_many": st.tuples(st.integers(0, 7)),
    "nack": st.tuples(st.integers(0, 7), st.integers(0, 200)),
    "dead": st.tuples(st.integers(0, 7)),
    "release": st.tuples(st.integers(0, 7)),
    "unclaim": st.tuples(st.integers(0, 7)),  # a claim no caller received
    "extend": st.tuples(st.integers(0, 7), st.integers(1, 300)),
    "cancel": st.tuples(st.sampled_from(IDS)),
    "reschedule": st.tuples(st.sampled_from(IDS), st.integers(-50, 400)),
    "retry_dead": st.tuples(st.integers(0, 0)),
    "purge": st.tuples(st.sampled_from([None, *State])),
    "rewrite": st.tuples(st.sampled_from(IDS)),  # the same record again
    "drop": st.tuples(st.sampled_from(IDS)),  # a replayed delete
}


def _ops(steps: dict[str, Any], **lists: int) -> Any:
    """Lists of ``(name, *arguments)`` of the operations ``steps`` names."""
    one = st.one_of(*(args.map(lambda a, name=name: (name, *a)) for name, args in steps.items()))
    return st.lists(one, **lists)


OPS = _ops(STEPS, max_size=80)


#: Which arguments of each operation are times (ms).
TIMES = {
    "put": (1,),
    "replace": (1,),
    "advance": (0,),
    "back": (0,),
    "claim_ahead": (0,),
    "nack": (1,),
    "extend": (1,),
    "reschedule": (1,),
}


def _put(id: str, delay: int, on_conflict: Any = "ignore") -> PutRequest:
    return PutRequest(
        id=id,
        payload=b"x",
        encoding="json",
        max_attempts=2,
        delay_ms=max(0, delay),
        on_conflict=on_conflict,
    )


def _far_records(far_above: int) -> Records:
    """Records that send what waits past ``far_above`` in buckets far (the replicated
    scheduler's: a private SQLite database, its images as it writes them)."""
    far = Far(_encode, _decode)
    return Records(far, far_above=far_above)


def _every(store: Records) -> list[Record]:
    """Every stored record, in memory and far."""
    return [*store.records.values(), *(store.far or ())]


def _run(ops: list[tuple[Any, ...]], scale: int = 1, far_above: int | None = None) -> None:
    """Run ``ops``, their times (delays, steps of the clock, leases) times ``scale``;
    with ``far_above``, on records that send the latest far past that many."""
    store = Records() if far_above is None else _far_records(far_above)
    now_ms = EPOCH
    held: list[tuple[str, str]] = []

    def now() -> Now:
        return Now(now_ms, now_ms)

    for op, *raw in ops:
        args = [arg * scale if at in TIMES.get(op, ()) else arg for at, arg in enumerate(raw)]
        try:
            if op == "put":
                store.put([_put(args[0], args[1])], now())
            elif op == "replace":
                store.put([_put(args[0], args[1], "replace")], now())
            elif op == "advance":
                now_ms += args[0]
            elif op == "back":
                now_ms -= args[0]
            elif op == "stats":
                pass
            elif op == "claim":
                expected = _plain_claim(store, now_ms, now_ms, args[0])
                claimed = store.claim(now(), args[0], 100 * scale)
                _check_claim(store, claimed, expected)
                held += [(r.id, r.lease or "") for r in claimed]
            elif op == "claim_ahead":
                expected = _plain_claim(store, now_ms, now_ms + args[0], 2, ahead=True)
                claimed = store.claim_ahead(now(), now_ms + args[0], 2, 100 * scale)
                _check_claim(store, claimed, expected)
                held += [(r.id, r.lease or "") for r in claimed]
            elif held and op == "ack":
                store.ack(*held.pop(args[0] % len(held)), now())
            elif op == "ack_many":
                store.ack_many(held[: args[0]], now())
                del held[: args[0]]
            elif held and op in ("nack", "dead"):
                id, token = held.pop(args[0] % len(held))
                delay = args[1] if op == "nack" else 0
                store.nack(id, token, now(), delay_ms=delay, error="e", dead=op == "dead")
            elif held and op == "release":
                store.release(*held.pop(args[0] % len(held)), now())
            elif held and op == "unclaim":
                store.unclaim(*held.pop(args[0] % len(held)))
            elif held and op == "extend":
                store.extend(*held[args[0] % len(held)], now(), args[1])
            elif op == "cancel":
                store.cancel(args[0], now())
            elif op == "reschedule":
                store.reschedule(args[0], now(), delay_ms=max(0, args[1]), at_ms=None)
            elif op == "retry_dead":
                store.retry_dead(None, now())
            elif op == "purge":
                store.purge(args[0], now())
            elif op == "rewrite" and (found := store.find(args[0])) is not None:
                store.write(found)
            elif op == "drop":
                store.drop(args[0])
        except (LeaseLost, DuplicateId, KeyError):
            pass
        # Asked at the time of the step, and a little later (the leases and due times
        # passed meanwhile count without any write).
        for at in (now_ms, now_ms + 150):
            expected = compute_stats(_every(store), at)
            assert store.stats(Now(at, at)) == expected, (op, args)
        _pages_match(store, now_ms)
        # The earliest due message is still the one a claim takes first.
        scheduled = [r for r in _every(store) if r.state is State.SCHEDULED]
        earliest = min((r.due_at for r in scheduled), default=None)
        assert store.next_due() == earliest


def _plain_claim(
    store: Records, now_ms: int, last: int, limit: int, *, ahead: bool = False
) -> list[str]:
    """The ids a claim takes, found by visiting every record: the scheduled ones (an
    expired lease settled) due by ``last``, by ``(due_at, seq)``, up to ``limit``; ahead,
    only when none is due at ``now_ms``, those of the earliest due time."""
    scheduled = sorted(
        (r.due_at, r.seq, r.id)
        for r in (settle(r, now_ms) for r in _every(store))
        if r.state is State.SCHEDULED
    )
    if ahead:
        if not scheduled or scheduled[0][0] <= now_ms:
            return []
        last = min(last, scheduled[0][0])
    return [id for due_at, _, id in scheduled if due_at <= last][:limit]


def _check_claim(store: Records, claimed: list[Record], expected: list[str]) -> None:
    """A claim took the messages visiting every record finds, in order, each stored as
    claimed under a lease token of its own."""
    assert [r.id for r in claimed] == expected
    assert len({r.lease for r in claimed}) == len(claimed)
    for record in claimed:
        assert record.lease is not None
        assert store.records[record.id] is record
        assert record.state is State.ACTIVE


def _pages_match(store: Records, now_ms: int) -> None:
    """Every state's pages, from the start and after a position in the middle, equal
    what visiting every record gives; and so do ``dead()``'s."""
    for state in (None, *State):
        for at in (now_ms, now_ms + 150):
            every = select_peek(_every(store), state, at, 1000)
            middle = peek_order(state)(every[len(every) // 2]) if every else None
            for after in (None, middle):
                for limit in (1, 3, 1000):
                    expected = select_peek(_every(store), state, at, limit, after)
                    assert store.peek(state, limit, after, Now(at, at)) == expected, (
                        state,
                        at,
                        limit,
                        after,
                    )
    for after_seq in (None, 2):
        for limit in (1, 1000):
            got = store.dead(limit, after_seq, Now(now_ms, now_ms))  # settles expiries
            dead = [
                r
                for r in _every(store)
                if r.state is State.DEAD and r.seq > (-1 if after_seq is None else after_seq)
            ]
            assert got == sorted(dead, key=lambda r: r.seq)[:limit]


@settings(max_examples=400, deadline=None)
@given(ops=OPS)
def test_stats_answer_what_counting_every_record_answers(ops: list[tuple[Any, ...]]) -> None:
    _run(ops)


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
def test_stats_answer_what_counting_every_record_answers_over_seconds(
    ops: list[tuple[Any, ...]],
) -> None:
    """The same over seconds: messages due in several seconds' buckets, which a claim,
    a stats call or a page reaches one after the other."""
    _run(ops, scale=10)


#: The operations around a claim, several messages at a time (each claim of ``_run``
#: is checked against visiting every record, ``_plain_claim``).
CLAIMS = _ops(
    {
        **{name: STEPS[name] for name in ("put", "advance", "stats", "claim_ahead", "rewrite")},
        **{name: STEPS[name] for name in ("ack_many", "nack", "unclaim")},
        "claim": st.tuples(st.integers(1, 8)),
    },
    min_size=4,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=CLAIMS)
@example(ops=[("put", "m0", 0), ("put", "m1", 0), ("rewrite", "m0"), ("claim", 3)])
def test_a_claim_takes_what_visiting_every_record_finds(ops: list[tuple[Any, ...]]) -> None:
    """Each claim takes the messages due, earliest first, each once (a record written
    twice unchanged has two heap entries), each under a lease token of its own."""
    _run(ops, scale=3)


def test_a_large_queue_answers_stats_and_pages_without_visiting_every_record() -> None:
    """The stall it guards against: stats, or a page of peek, over 200,000 scheduled
    messages took as long as visiting them all (on amqp://, the scheduler answered no
    one meanwhile). Measured against the same calls over 2,000 in the same run."""

    def seconds_for(count: int) -> float:
        store = Records()
        now = Now(EPOCH, EPOCH)
        store.put([_put(f"id{n}", 1000 + n % 5000) for n in range(count)], now)
        store.stats(now)  # the first call ripens what is due: nothing here
        started = time.perf_counter()
        for _ in range(20):
            store.stats(now)
            page = store.peek(None, 50, None, now)
            store.peek(State.SCHEDULED, 50, (page[-1].due_at, page[-1].seq), now)
            store.dead(50, None, now)
        return time.perf_counter() - started

    small, large = seconds_for(2_000), seconds_for(200_000)
    # Visiting every record makes it 100x; kept counts leave it about the same.
    assert large < 10 * small + 0.05, (small, large)


@pytest.mark.parametrize("count", [1, 50])
def test_a_claim_after_stats_takes_the_earliest_ripe_message_first(count: int) -> None:
    store = Records()
    store.put([_put(f"late{n}", 100 + n) for n in range(count)], Now(EPOCH, EPOCH))
    store.put([_put("soon", 10)], Now(EPOCH, EPOCH))
    stats = store.stats(Now(EPOCH + 60, EPOCH + 60))  # "soon" is ripe, the rest not
    assert (stats.ready, stats.scheduled) == (1, count)
    store.put([_put("now", 0)], Now(EPOCH + 60, EPOCH + 60))  # ripe at once
    claimed = store.claim(Now(EPOCH + 500, EPOCH + 500), count + 2, 1000)
    assert [r.id for r in claimed] == ["soon", "now", *(f"late{n}" for n in range(count))]


def test_active_messages_with_one_lease_time_are_paged_by_their_sequence() -> None:
    store = Records()
    now = Now(EPOCH, EPOCH)
    for id in ("m2", "m1", "m0"):  # sequence order is the ids' reverse
        store.put([_put(id, 0)], now)
    store.claim(now, 3, 1000)  # one lease time for the three
    first = store.peek(State.ACTIVE, 1, None, now)
    assert [r.id for r in first] == ["m2"]
    rest = store.peek(State.ACTIVE, 5, (first[0].lease_until or 0, first[0].seq), now)
    assert [r.id for r in rest] == ["m1", "m0"]


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
@example(ops=[("put", "m0", 100), ("put", "m1", 250), ("put", "m2", 400), ("cancel", "m2")])
def test_with_the_latest_sent_far_they_answer_the_same(ops: list[tuple[Any, ...]]) -> None:
    """The same with records that send the latest buckets far past two messages
    waiting (over seconds: several buckets), and bring them back as claims, stats and
    pages reach them: cancels, reschedules and puts find the far ones by id."""
    _run(ops, scale=10, far_above=1)


@settings(max_examples=300, deadline=None)
@given(ops=CLAIMS)
def test_a_claim_takes_what_visiting_every_record_finds_with_far(
    ops: list[tuple[Any, ...]],
) -> None:
    _run(ops, scale=10, far_above=1)


class _Noted(Records):
    """Records that note the ids written or deleted (as the replicated scheduler logs
    them), not those moved between memory and far."""

    def __init__(self) -> None:
        super().__init__(
            Far(_encode, _decode),
            far_above=2,
        )
        self.changed: set[str] = set()

    def write(self, record: Record, fresh: bool = False) -> Record | None:
        self.changed.add(record.id)
        return super().write(record, fresh)

    def delete(self, id: str) -> Record:
        self.changed.add(id)
        return super().delete(id)


WALKED = _ops(
    {name: STEPS[name] for name in ("put", "advance", "claim", "cancel", "reschedule", "ack")}
    | {"walk": st.tuples(st.integers(1, 3))},
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=WALKED)
def test_a_walk_of_every_record_meets_each_one_left_unchanged(
    ops: list[tuple[Any, ...]],
) -> None:
    """A checkpoint's walk (_checkpoints.py): the ids in memory at its begin, looked up
    wherever they are when their turn comes, then far's by id a page at a time, then
    those brought back from far since the begin. Whatever moves between memory and far
    meanwhile, it meets every record live at its begin and neither written nor deleted
    since (those are logged by their own operations)."""
    store = _Noted()
    now_ms = EPOCH
    for n in range(12):  # several seconds' buckets: most far
        store.put([_put(f"s{n}", 700 * n)], Now(now_ms, now_ms))
    begin = {r.id for r in _every(store)}
    ids = list(store.records)
    store.watch()
    store.changed.clear()
    seen: set[str] = set()
    phase, after = 0, ""
    held: list[tuple[str, str]] = []

    def walk(steps: int) -> None:
        nonlocal phase, after, ids
        for _ in range(steps):
            if phase == 0:
                chunk, ids = ids[:2], ids[2:]
                seen.update(id for id in chunk if store.find(id) is not None)
                phase += not ids
            elif phase == 1:
                assert store.far is not None
                page = store.far.by_id(after, 2)
                seen.update(r.id for r in page)
                if page:
                    after = page[-1].id
                else:
                    phase = 2
                    ids = sorted(store.unwatch())
            elif ids:
                chunk, ids = ids[:2], ids[2:]
                seen.update(id for id in chunk if store.find(id) is not None)

    for op, *args in [*ops, ("walk", 1000)]:
        now = Now(now_ms, now_ms)
        try:
            if op == "walk":
                walk(args[0])
            elif op == "put":
                store.put([_put(args[0], args[1] * 20)], now)
            elif op == "advance":
                now_ms += args[0] * 20
            elif op == "claim":
                held += [(r.id, r.lease or "") for r in store.claim(now, args[0], 100_000)]
            elif op == "cancel":
                store.cancel(f"s{args[0][1:]}", now)
            elif op == "reschedule":
                store.reschedule(f"s{args[0][1:]}", now, delay_ms=args[1] * 20, at_ms=None)
            elif held and op == "ack":
                store.ack(*held.pop(args[0] % len(held)), now)
        except (LeaseLost, DuplicateId):
            pass
    live = {r.id for r in _every(store)}
    assert (begin & live) - store.changed <= seen


def _seen(found: Any) -> Any:
    """An answer with its lease tokens left out (each store draws its own)."""
    if isinstance(found, Record):
        return (found.id, found.payload, found.due_at, found.seq, found.attempts,
                found.state, found.lease_until, found.last_error)  # fmt: skip
    if isinstance(found, list):
        return [_seen(item) for item in found]
    return found


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
@example(ops=[("put", "m0", 100), ("put", "m1", 250), ("put", "m2", 400), ("put", "m2", 0)])
def test_records_with_far_answer_what_records_in_memory_answer(
    ops: list[tuple[Any, ...]],
) -> None:
    """The same operations on records that keep everything in memory and on records
    that send all but the earliest bucket far: every answer the same (puts that find an id
    far, cancels and reschedules of far messages, claims, stats, pages, gets, the counts
    of what falls due)."""
    plain, far = Records(), _far_records(1)
    now_ms = EPOCH
    held: list[str] = []
    for op, *raw in ops:
        args = [arg * 10 if at in TIMES.get(op, ()) else arg for at, arg in enumerate(raw)]
        now = Now(now_ms, now_ms)
        answers = []
        for store in (plain, far):
            try:
                if op in ("put", "replace"):
                    conflict = "ignore" if op == "put" else "replace"
                    answer: Any = store.put([_put(args[0], args[1], conflict)], now)
                elif op == "claim":
                    answer = store.claim(now, args[0], 1000)
                elif op == "cancel":
                    answer = store.cancel(args[0], now)
                elif op == "reschedule":
                    answer = store.reschedule(args[0], now, delay_ms=max(0, args[1]), at_ms=None)
                elif op == "purge":
                    answer = store.purge(args[0], now)
                elif held and op == "ack":
                    id = held[args[0] % len(held)]
                    record = store.find(id)
                    answer = store.ack(id, (record and record.lease) or "", now)
                else:
                    answer = None
            except (LeaseLost, DuplicateId) as exc:
                answer = type(exc)
            answers.append(_seen(answer))
        assert answers[0] == answers[1], (op, args)
        if op == "claim" and isinstance(answers[0], list):
            held += [item[0] for item in answers[0]]
        if op == "advance":
            now_ms += args[0]
        at = Now(now_ms, now_ms)
        assert plain.stats(at) == far.stats(at)
        assert _seen(plain.peek(None, 1000, None, at)) == _seen(far.peek(None, 1000, None, at))
        for id in IDS:
            assert _seen(plain.get(id, at)) == _seen(far.get(id, at))
        for horizon, buckets in ((4000, 4), (997, 7)):  # what the dashboard's chart asks
            assert plain.due_counts(horizon, buckets, at) == far.due_counts(horizon, buckets, at)
