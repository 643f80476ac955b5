"""Replay of the replicated log, fed hostile content directly (no broker): late entries
of a deposed reign, requests resent after a failover, checkpoints whose begin shares
an entry with requests, a pointer below its begin, a log whose head was dropped.

The log is written here, through the codec, by :class:`Lineage`: a scheduler's view of
the namespace, whose every operation is applied to the pure model
(:class:`~delayq.backends._records.Records`, over the transitions of
``delayq.durable.message``) and logged as the scheduler logs it (the records it
wrote, whole; the ids it deleted; the reply it earned). A deposed scheduler is a copy
of the lineage that goes on writing. A real :class:`Scheduler` then takes over through
:class:`LogTransport` (the log and the pointer in memory) and is asked, by requests as
a client sends them, for every message it holds: the answers must be those of the
lineage that holds the election, never of a deposed one.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from delayq.backends._records import Records
from delayq.backends._replicated._codec import (
    decode_outcome,
    decode_requests,
    encode_outcome,
    encode_record,
    pack,
    unpack,
)
from delayq.backends._replicated._scheduler import Scheduler
from delayq.backends._replicated._transport import Delivery, LogEntry
from delayq.durable.message import Now, Record, State

#: The epoch ms every logged operation happened at; the replaying scheduler's clock
#: reads a second later (nothing falls due between: the delayed ones wait an hour).
T0 = 1_700_000_000_000
LOGGED = Now(T0, T0)
NOW = Now(T0 + 1000, T0 + 1000)
HOUR = 3_600_000
LEASE = 600_000
QUEUES = ("q", "r")


# -- the log, as schedulers write it ------------------------------------------------------


class Log:
    """The entries of a log in offset order, and its checkpoint pointer."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []
        self.next = 0
        self.pointer: bytes | None = None

    def add(self, kind: str, reign: str, ops: list[Any] | None = None) -> int:
        """Append an entry (``ops`` packed as its body); its offset."""
        body = b"" if ops is None else pack(ops)
        marks = [op[2] for op in ops or () if op[0] in ("checkpoint-begin", "checkpoint-end")]
        offset = self.next
        self.entries.append(LogEntry(offset, kind, reign, marks[0] if marks else "", body))
        self.next += 1
        return offset

    def drop_before(self, offset: int) -> None:
        """Retention dropped every entry before ``offset``."""
        self.entries = [entry for entry in self.entries if entry.offset >= offset]


class Lineage:
    """One scheduler's state (the model) and what it logs: the first of a log, its
    ``reign`` entry appended (:meth:`take_over` makes the next)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.reign = uuid.uuid4().hex
        log.add("reign", self.reign)
        self.queues: dict[str, Records] = {}
        self.dedup: dict[str, tuple[str, bytes]] = {}
        self.requests: dict[str, tuple[str, list[Any]]] = {}  # request id -> op, args

    def take_over(self) -> Lineage:
        """A scheduler elected after this one (its ``reign`` entry appended), which
        starts from this one's state; this one may still write (deposed)."""
        successor = copy.deepcopy(self)
        successor.log = self.log
        successor.reign = uuid.uuid4().hex
        self.log.add("reign", successor.reign)
        return successor

    def store(self, queue: str) -> Records:
        return self.queues.setdefault(queue, Records())

    def op(self, name: str, queue: str, args: list[Any], now: Now = LOGGED) -> list[Any]:
        """Apply request ``name`` to the model as the scheduler does at ``now``, and
        return its operation as the log holds it (the caller appends it)."""
        store = self.store(queue)
        before = dict(store.records)
        if name == "put":
            id, delay_ms = args
            payload = f"payload of {id}".encode()
            wire = [queue, [[id, payload, "bytes", 3, {}, delay_ms, None, "ignore"]]]
            outcome: Any = store.put(decode_requests(wire[1]), now)
        elif name == "reserve":
            outcome = store.claim(now, 1, LEASE)
            wire = [queue, 1, LEASE, 0]
        elif name == "ack":
            (id,) = args
            token = store.records[id].lease or ""
            outcome = store.ack(id, token, now)
            wire = [queue, id, token]
        elif name == "cancel":
            (id,) = args
            outcome = store.cancel(id, now)
            wire = [queue, id]
        elif name == "reschedule":
            id, delay_ms = args
            outcome = store.reschedule(id, now, delay_ms=delay_ms, at_ms=None)
            wire = [queue, id, delay_ms, None]
        else:
            raise AssertionError(name)
        request_id = f"{name}-{uuid.uuid4().hex[:8]}"
        reply = pack(encode_outcome(name, outcome))
        self.requests[request_id] = (name, wire)
        return self.logged(name, queue, request_id, before, "ok", reply, now)

    def logged(
        self,
        name: str,
        queue: str,
        request_id: str,
        before: dict[str, Record],
        kind: str,
        reply: bytes,
        now: Now = LOGGED,
    ) -> list[Any]:
        """The operation that changed ``queue`` from ``before`` to what it holds, as
        the scheduler logs it: the records it wrote, the ids it deleted, its reply
        (remembered with its request id; a request id with no kind takes it back)."""
        store = self.store(queue)
        images = [encode_record(r) for id, r in store.records.items() if before.get(id) is not r]
        deletes = [id for id in before if id not in store.records]
        if kind:
            self.dedup[request_id] = (kind, reply)
        else:
            self.dedup.pop(request_id, None)
        return [name, queue, request_id, now.floor, store.last_seq, images, deletes, kind, reply]

    def write(self, *ops: list[Any]) -> int:
        """Append one entry of ``ops`` (a group commit); its offset."""
        return self.log.add("entry", self.reign, list(ops))

    def checkpoint(
        self,
        before: Sequence[list[Any]] = (),
        after: Sequence[tuple[str, str, list[Any]]] = (),
    ) -> tuple[str, int]:
        """Write a checkpoint as the scheduler does: its begin operation in one entry
        with the operations ``before`` (decided already) and the requests ``after``
        (decided once its state was taken), the live images, its end. Returns its id
        and the offset of its begin entry."""
        checkpoint = uuid.uuid4().hex[:16]
        # The begin's state is taken before the operations after it are decided.
        state = [
            checkpoint,
            T0,
            {queue: store.last_seq for queue, store in self.queues.items()},
            {},
            [[request_id, kind, reply] for request_id, (kind, reply) in self.dedup.items()],
            [None, []],
        ]
        live = {queue: list(store.records) for queue, store in self.queues.items()}
        begin = ["checkpoint-begin", "", f"begin:{checkpoint}", T0, 0, [], [], "", pack(state)]
        offset = self.write(*before, begin, *[self.op(*call) for call in after])
        chunks = 0
        for queue, ids in live.items():
            store = self.store(queue)
            images = [encode_record(store.records[id]) for id in ids if id in store.records]
            if not images:  # a queue with no live message has no images operation
                continue
            chunks += 1
            mark = f"images:{checkpoint}:{chunks}"
            self.write(["checkpoint", queue, mark, T0, store.last_seq, images, [], "", b""])
        self.write(["checkpoint-end", "", f"end:{checkpoint}", T0, 0, [], [], "", b""])
        return checkpoint, offset

    def point(self, checkpoint: str, offset: int) -> None:
        self.log.pointer = pack([self.reign, offset, checkpoint])


# -- a transport over that log ------------------------------------------------------------


class LogTransport:
    """What :class:`Scheduler` needs of a broker, over a :class:`Log` in memory: the
    log and its pointer, no intake, and the replies kept for the test to read."""

    retention_bytes = 0
    namespace = "replayed"

    def __init__(self, log: Log) -> None:
        self.log = log
        self.replies: dict[str, tuple[str, bytes]] = {}
        self.on_request: Callable[[Delivery], None] | None = None

    async def append(self, kind: str, reign: str, body: bytes, mark: str = "") -> None:
        self.log.entries.append(LogEntry(self.log.next, kind, reign, mark, body))
        self.log.next += 1

    async def read_log(self, start: int | None, *, few: bool = False) -> AsyncIterator[LogEntry]:
        at = -1 if start is None else start
        while True:  # at the end, the entries appended meanwhile (a standby follows)
            for entry in [entry for entry in self.log.entries if entry.offset >= at]:
                at = entry.offset + 1
                yield entry
            await asyncio.sleep(0.001)

    async def read_pointer(self) -> bytes | None:
        return self.log.pointer

    async def point(self, body: bytes) -> None:
        self.log.pointer = body

    async def tail_intake(self, start: Any, on_put: Any, on_marker: Any, on_gap: Any) -> None:
        return None

    async def serve(self, on_request: Callable[[Delivery], None]) -> None:
        self.on_request = on_request

    async def reply(
        self, reply_to: str, request_id: str, kind: str, body: bytes, *, confirm: bool
    ) -> bool:
        if kind == "batch":
            for part_id, part_kind, part_body in unpack(body):
                self.replies[part_id] = (part_kind, part_body)
        else:
            self.replies[request_id] = (kind, body)
        return True

    async def announce(self, reign: str) -> None:
        return None

    async def renew(self) -> None:
        return None

    async def tell_nudges(self, wanted: bool) -> None:
        return None

    async def warn_full(self) -> None:
        return None

    async def mark_intake(self, body: bytes) -> None:
        return None

    async def close(self) -> None:
        return None


class Replayed:
    """A scheduler that took over ``log``, and a client's requests to it."""

    def __init__(self, log: Log) -> None:
        self.transport = LogTransport(log)
        self.scheduler = Scheduler(self.transport, lambda: None, wall=lambda: NOW.floor / 1000)

    async def ask(self, op: str, args: list[Any], request_id: str | None = None) -> tuple[str, Any]:
        """Send a request; its reply's kind and decoded outcome."""
        request_id = request_id or uuid.uuid4().hex
        assert self.transport.on_request is not None
        self.transport.on_request(Delivery(op, request_id, "client", pack(args)))
        for _ in range(1000):
            if request_id in self.transport.replies:
                break
            await asyncio.sleep(0)
        kind, body = self.transport.replies.pop(request_id)
        data = unpack(body)
        return kind, decode_outcome(op, data) if kind == "ok" else data

    async def get(self, queue: str, id: str) -> Record | None:
        kind, record = await self.ask("get", [queue, id])
        assert kind == "ok", record
        return record  # type: ignore[no-any-return]


async def replay(log: Log) -> Replayed:
    """A scheduler that took over ``log`` (its reign entry appended, the log folded)."""
    replayed = Replayed(log)
    await asyncio.wait_for(replayed.scheduler.run(), 10)
    return replayed


async def assert_holds(replayed: Replayed, lineage: Lineage, ids: set[str]) -> None:
    """The replayed scheduler answers for each of ``ids`` what ``lineage``'s model
    holds, its counts are the model's, and a new message takes the seq after the
    model's last (replay kept each queue's sequence)."""
    for queue in QUEUES:
        store = lineage.store(queue)
        for id in sorted(ids):
            assert await replayed.get(queue, id) == store.get(id, NOW), (queue, id)
        kind, stats = await replayed.ask("stats", [queue])
        assert (kind, stats) == ("ok", store.stats(NOW)), queue
    for queue in QUEUES:
        fresh = f"fresh-{uuid.uuid4().hex[:6]}"
        request = [fresh, b"x", "bytes", 3, {}, HOUR, None, "ignore"]
        kind, _ = await replayed.ask("put", [queue, [request]])
        assert kind == "ok"
        record = await replayed.get(queue, fresh)
        assert record is not None
        assert record.seq == lineage.store(queue).last_seq + 1, queue


def check_replay(log: Log, lineage: Lineage, ids: set[str], then: Any = None) -> None:
    """Replay ``log`` and check it against ``lineage`` (and ``then(replayed)``)."""

    async def main() -> None:
        replayed = await replay(log)
        try:
            if then is not None:
                await then(replayed)
            await assert_holds(replayed, lineage, ids)
        finally:
            replayed.scheduler.stop()

    asyncio.run(main())


# -- late entries of a deposed reign ------------------------------------------------------


def test_a_deposed_reigns_late_entries_are_not_folded() -> None:
    """A write of the old scheduler that reached the log after its successor's reign
    entry was never seen by the successor, which went on from the state before it:
    replay skips it, however late it comes (after a second election too)."""
    log = Log()
    first = Lineage(log)
    first.write(first.op("put", "q", ["a", 0]), first.op("put", "q", ["b", HOUR]))
    first.write(first.op("put", "r", ["c", 0]))
    second = first.take_over()
    # What the deposed one decided and logged too late: the successor never saw it.
    first.write(
        first.op("cancel", "q", ["a"]),
        first.op("put", "q", ["ghost", 0]),
        first.op("reschedule", "q", ["b", 0]),
    )
    first.write(first.op("reserve", "r", []))
    second.write(second.op("put", "q", ["d", 0]), second.op("reserve", "q", []))
    third = second.take_over()
    first.write(first.op("put", "r", ["ghost2", 0]))  # deposed twice
    second.write(second.op("cancel", "q", ["d"]))  # and the middle one, late
    third.write(third.op("put", "r", ["e", HOUR]))
    assert "ghost" in first.store("q").records
    assert "d" in third.store("q").records
    check_replay(log, third, {"a", "b", "c", "d", "e", "ghost", "ghost2"})


def test_a_late_request_of_a_deposed_reign_is_not_answered_from_the_log() -> None:
    """Its request id is not in the successor's dedup table: the client's resend is
    decided afresh (and applied once)."""
    log = Log()
    first = Lineage(log)
    first.write(first.op("put", "q", ["a", 0]))
    second = first.take_over()
    late = first.op("put", "q", ["late", HOUR])
    first.write(late)

    async def resend(replayed: Replayed) -> None:
        name, args = first.requests[late[2]]
        assert await replayed.ask(name, args, late[2]) == ("ok", [])
        second.op(name, "q", ["late", HOUR], NOW)  # the model applies it now, once
        assert await replayed.ask(name, args, late[2]) == ("ok", [])

    check_replay(log, second, {"a", "late"}, resend)


# -- resends answered from the dedup table ------------------------------------------------


def test_a_resent_request_is_answered_from_the_log_and_not_applied_again() -> None:
    """After a failover a client resends what got no reply, with the same request id:
    the new scheduler answers with the reply the log holds (a put resent with other
    arguments stores nothing; a reserve hands the same lease, charging no attempt)."""
    log = Log()
    first = Lineage(log)
    put = first.op("put", "q", ["a", 0])
    first.write(put, first.op("put", "q", ["b", 0]))
    reserve = first.op("reserve", "q", [])
    first.write(reserve)
    second = first.take_over()
    second.write(second.op("put", "r", ["c", 0]))

    async def resend(replayed: Replayed) -> None:
        other = ["q", [["z", b"other", "bytes", 3, {}, 0, None, "ignore"]]]
        assert await replayed.ask("put", other, put[2]) == ("ok", [])
        kind, claimed = await replayed.ask("reserve", ["q", 1, LEASE, 0], reserve[2])
        assert kind == "ok"
        assert [encode_record(r) for r in claimed] == unpack(reserve[8])
        assert claimed[0].attempts == 1

    check_replay(log, second, {"a", "b", "c", "z"}, resend)


def test_a_held_reply_taken_back_is_not_an_answer_after_replay() -> None:
    """A reserve that claimed a message ahead of its time logs a ``held`` reply; when
    something falls due first that reply is dropped before it leaves, the message
    given back, and the request id logged with no reply kind. A scheduler that replays
    it must serve the resent reserve afresh, not hand it the message from the log
    (given back, and perhaps claimed by another since)."""
    log = Log()
    first = Lineage(log)
    first.write(first.op("put", "q", ["soon", 5]))
    store = first.store("q")
    request_id = "reserve-held"
    before = dict(store.records)
    ahead = store.claim_ahead(LOGGED, T0 + 10, 1, LEASE)
    held = pack([T0 + 5, encode_outcome("reserve", ahead)])
    first.write(first.logged("reserve", "q", request_id, before, "held", held))
    before = dict(store.records)
    store.release("soon", ahead[0].lease or "", LOGGED)
    first.write(first.logged("release", "q", request_id, before, "", b""))
    second = first.take_over()

    async def resend(replayed: Replayed) -> None:
        kind, claimed = await replayed.ask("reserve", ["q", 1, LEASE, 0], request_id)
        assert kind == "ok", "answered with the held reply the log took back"
        assert [r.id for r in claimed] == ["soon"]
        assert claimed[0].lease != ahead[0].lease
        # The model: claimed afresh, by this scheduler's clock.
        second.store("q").claim(NOW, 1, LEASE)
        mine = second.store("q").records["soon"]
        second.store("q").records["soon"] = dataclasses.replace(mine, lease=claimed[0].lease)

    check_replay(log, second, {"soon"}, resend)


# -- a resend of a parked reserve ----------------------------------------------------------


class Answers(LogTransport):
    """:class:`LogTransport` that keeps every reply (a batch's parts each), in order:
    ``(reply_to, request_id, kind, body)``."""

    def __init__(self, log: Log) -> None:
        super().__init__(log)
        self.sent: list[tuple[str, str, str, bytes]] = []

    async def reply(
        self, reply_to: str, request_id: str, kind: str, body: bytes, *, confirm: bool
    ) -> bool:
        parts = unpack(body) if kind == "batch" else [(request_id, kind, body)]
        self.sent.extend((reply_to, *part) for part in parts)
        return await super().reply(reply_to, request_id, kind, body, confirm=confirm)


def test_a_resend_of_a_parked_reserve_joins_it() -> None:
    """A reserve parks (nothing due); its client resends it (after an election, or on a
    new connection) once two messages are due, before the scheduler's timer served it.
    The resend joins the parked reserve: one answer for the request id, with the first
    message, sent where the resend came from; the other message is not claimed."""
    clock = [NOW.floor / 1000]

    async def main() -> None:
        transport = Answers(Log())
        scheduler = Scheduler(transport, lambda: None, wall=lambda: clock[0])
        await asyncio.wait_for(scheduler.run(), 10)
        try:
            assert transport.on_request is not None
            for id in ("a", "b"):
                request = [id, b"x", "bytes", 3, {}, HOUR, None, "ignore"]
                transport.on_request(Delivery("put", id, "client", pack(["q", [request]])))
            wait = 0.5
            reserve = pack(["q", 1, LEASE, wait])
            transport.on_request(Delivery("reserve", "r", "old", reserve))
            await asyncio.sleep(0.05)
            assert [sent[1] for sent in transport.sent] == ["a", "b"]  # parked
            clock[0] += HOUR / 1000 + 1  # both due; the timer is armed an hour out
            transport.on_request(Delivery("reserve", "r", "new", reserve))
            await asyncio.sleep(wait + 0.3)  # past the wait of the parked one
            answers = [sent for sent in transport.sent if sent[1] == "r"]
            assert len(answers) == 1, "the request was answered twice"
            [(reply_to, _, kind, body)] = answers
            assert (reply_to, kind) == ("new", "ok")
            [got] = decode_outcome("reserve", unpack(body))
            assert got.id == "a"
            for id in ("a", "b"):
                transport.on_request(Delivery("get", f"get-{id}", "client", pack(["q", id])))
            await asyncio.sleep(0.05)
            a, b = (
                decode_outcome("get", unpack(transport.replies[f"get-{id}"][1]))
                for id in ("a", "b")
            )
            assert (a.state, a.attempts, a.lease_until) == (State.ACTIVE, 1, got.lease_until)
            assert (b.state, b.attempts) == (State.READY, 0)  # not claimed
        finally:
            scheduler.stop()

    asyncio.run(main())


# -- the time of the log -------------------------------------------------------------------


def test_a_scheduler_whose_clock_is_behind_the_log_goes_on_from_the_logs_last_time() -> None:
    """A failover to a host whose clock is an hour behind: the new scheduler's now never
    goes back past a time the log holds, so a message that was due then is due now
    (not an hour later, when its own clock catches up)."""
    log = Log()
    first = Lineage(log)
    later = Now(T0 + HOUR, T0 + HOUR)
    first.write(first.op("put", "q", ["a", 0], now=later))

    async def main() -> None:
        replayed = await replay(log)  # its clock reads NOW, an hour before ``later``
        try:
            kind, claimed = await replayed.ask("reserve", ["q", 1, LEASE, 0])
        finally:
            replayed.scheduler.stop()
        assert kind == "ok", claimed
        assert [record.id for record in claimed] == ["a"]

    asyncio.run(main())


# -- checkpoints ----------------------------------------------------------------------------


def test_replay_from_a_checkpoint_whose_begin_shares_its_entry() -> None:
    """The pointer names the begin entry (the log's head before it dropped): the
    operations logged before the begin in that entry are in the begin's state, those
    after it are not and are folded; the dedup table and the sequence numbers come
    from the begin (queue ``r`` has no message left, so no image carries its last
    seq); a late entry of a deposed reign among the images is skipped."""
    log = Log()
    first = Lineage(log)
    old = first.op("put", "q", ["old", 0])
    first.write(old, first.op("put", "r", ["gone", 0]), first.op("put", "q", ["k", HOUR]))
    first.write(first.op("cancel", "r", ["gone"]))
    deposed = first
    second = first.take_over()
    deposed.write(deposed.op("put", "q", ["ghost-before", 0]))
    before = second.op("put", "q", ["x", 0])
    checkpoint, offset = second.checkpoint(
        before=[before], after=[("put", "q", ["y", 0]), ("reschedule", "q", ["k", 0])]
    )
    deposed.write(deposed.op("put", "q", ["ghost-after", 0]))
    second.write(second.op("cancel", "q", ["old"]))
    second.point(checkpoint, offset)
    log.drop_before(offset)

    async def resend(replayed: Replayed) -> None:
        # Logged only before the checkpoint (dropped): answered from the begin's table.
        name, args = first.requests[old[2]]
        assert await replayed.ask(name, args, old[2]) == ("ok", [])

    ids = {"old", "gone", "k", "x", "y", "ghost-before", "ghost-after"}
    check_replay(log, second, ids, resend)


def test_a_pointer_below_its_begin_skips_what_lies_between() -> None:
    """A deposed scheduler's late entry came between the reign entry and the begin:
    the pointer (the reign's offset plus its appends) names that late entry, and
    replay folds nothing before the begin operation."""
    log = Log()
    first = Lineage(log)
    first.write(first.op("put", "q", ["a", 0]))
    second = first.take_over()
    late = first.write(first.op("put", "q", ["ghost", 0]), first.op("cancel", "q", ["a"]))
    checkpoint, _ = second.checkpoint(after=[("put", "q", ["b", 0])])
    second.point(checkpoint, late)
    log.drop_before(late)
    check_replay(log, second, {"a", "b", "ghost"})


def test_without_a_pointer_the_last_complete_checkpoint_is_found() -> None:
    """The log dropped its head and no pointer was published: replay starts at the
    last checkpoint whose end is in the log, not at one a new reign cut short."""
    log = Log()
    first = Lineage(log)
    first.write(first.op("put", "q", ["a", 0]), first.op("put", "r", ["b", HOUR]))
    _, offset = first.checkpoint(after=[("cancel", "q", ["a"])])
    first.write(first.op("put", "q", ["c", 0]))
    # A checkpoint cut by the next election: its begin and images, no end.
    cut = uuid.uuid4().hex[:16]
    state = pack([cut, T0, {"q": 99}, {}, [], [None, []]])
    first.write(["checkpoint-begin", "", f"begin:{cut}", T0, 0, [], [], "", state])
    second = first.take_over()
    second.write(second.op("put", "r", ["d", 0]))
    log.drop_before(offset)
    assert log.pointer is None
    check_replay(log, second, {"a", "b", "c", "d"})


# -- generated logs -------------------------------------------------------------------------

IDS = tuple(f"m{n}" for n in range(6))


def _request(data: st.DataObject, lineage: Lineage) -> tuple[str, str, list[Any]]:
    """A request ``lineage``'s state can take (none that raises)."""
    queue = data.draw(st.sampled_from(QUEUES))
    store = lineage.store(queue)
    active = sorted(id for id, r in store.records.items() if r.lease)
    choices = ["put", "put", "cancel", "reschedule", "reserve"] + ["ack"] * bool(active)
    name = data.draw(st.sampled_from(choices))
    if name == "ack":
        return name, queue, [data.draw(st.sampled_from(active))]
    if name == "reserve":
        return name, queue, []
    id = data.draw(st.sampled_from(IDS))
    if name == "cancel":
        return name, queue, [id]
    return name, queue, [id, data.draw(st.sampled_from((0, HOUR)))]


def _ops(data: st.DataObject, lineage: Lineage) -> list[list[Any]]:
    return [lineage.op(*_request(data, lineage)) for _ in range(data.draw(st.integers(1, 3)))]


GENERATED = settings(
    max_examples=60,
    deadline=None,
    # A failure is shown as found: shrinking a log through a scheduler takes minutes.
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@GENERATED
@given(st.data())
def test_replay_of_a_generated_log_is_the_elected_lineages_state(data: st.DataObject) -> None:
    """Random logs: requests, elections whose deposed schedulers go on writing late
    entries, checkpoints (requests decided around their begin) with their pointers,
    the head dropped up to the last pointer. Replay holds what the last elected
    lineage holds, and answers its requests' resends from the log."""
    log = Log()
    current = generate(data, log, None)
    check_replay(log, current, set(IDS), resends(data, current))


@GENERATED
@given(st.data())
def test_a_standby_that_followed_a_generated_log_holds_the_elected_lineages_state(
    data: st.DataObject,
) -> None:
    """The same logs, but the scheduler is a hot standby: its replay starts before its
    election, at a drawn point of the log's writing, and follows the log as it is
    written (every entry folded as it comes, before the next is written); elected, it
    folds the tail up to its reign entry and holds what a replay of the whole log
    holds."""

    async def main() -> None:
        log = Log()
        replayed = Replayed(log)
        events = data.draw(st.integers(1, 12))
        standing = data.draw(st.integers(0, events))

        async def step(done: int) -> None:
            if done == standing:
                replayed.scheduler.stand_by()
            for _ in range(5):  # the follower folds what was written
                await asyncio.sleep(0.002)

        current = await agenerate(data, log, events, step)
        assert replayed.scheduler.elected is False
        await asyncio.wait_for(replayed.scheduler.run(), 10)
        try:
            await resends(data, current)(replayed)
            await assert_holds(replayed, current, set(IDS))
        finally:
            replayed.scheduler.stop()

    asyncio.run(main())


def generate(data: st.DataObject, log: Log, events: int | None) -> Lineage:
    """Write a random log (``events`` steps, None: drawn); the lineage elected last."""

    async def nothing(done: int) -> None:
        return None

    return asyncio.run(agenerate(data, log, events, nothing))


async def agenerate(
    data: st.DataObject,
    log: Log,
    events: int | None,
    step: Callable[[int], Any],
) -> Lineage:
    """:func:`generate`, awaiting ``step(n)`` before the n-th step and after the last."""
    current = Lineage(log)
    deposed: list[Lineage] = []
    often = st.sampled_from((True, True, True, False))
    count = data.draw(st.integers(1, 12)) if events is None else events
    for done in range(count):
        await step(done)
        event = data.draw(st.sampled_from(("op", "op", "late", "elect", "checkpoint")))
        if event == "elect":
            successor = current.take_over()
            deposed.append(current)
            current = successor
        elif event == "late" and deposed:
            writer = data.draw(st.sampled_from(deposed))
            writer.write(*_ops(data, writer))
        elif event == "checkpoint":
            # One request decided after the begin (each is drawn from the state before it).
            after = [_request(data, current)] if data.draw(often) else []
            checkpoint, offset = current.checkpoint(after=after)
            if data.draw(often):
                current.point(checkpoint, offset)
        else:
            current.write(*_ops(data, current))
    await step(count)
    if log.pointer is not None and data.draw(often):
        log.drop_before(unpack(log.pointer)[1])
    return current


def resends(data: st.DataObject, current: Lineage) -> Callable[[Replayed], Any]:
    """A few of ``current``'s requests, drawn, resent: answered from the log."""
    resent = data.draw(st.lists(st.sampled_from(sorted(current.requests) or [""]), max_size=3))

    async def resend(replayed: Replayed) -> None:
        for request_id in resent:
            if not request_id or request_id not in current.dedup:
                continue
            name, args = current.requests[request_id]
            kind, reply = await replayed.ask(name, args, request_id)
            assert (kind, reply) == (
                "ok",
                decode_outcome(name, unpack(current.dedup[request_id][1])),
            )

    return resend
