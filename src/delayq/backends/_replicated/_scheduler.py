"""The elected scheduler: the namespace's whole state in memory, rebuilt from the log,
deciding every request with the pure transitions and appending what each one changed
before it replies (docs/rabbitmq.md).

An entry of the log is a msgpack array of operations, each
``[op, queue, request_id, now_floor, last_seq, images, deletes, reply_kind, reply]``:
the records the operation wrote (whole), the ids it deleted, the queue's last sequence
number, and the reply it earned (so that a request resent after a failover is answered
from the log, not applied twice); a request id with no reply kind takes back the
request's logged reply (a held one dropped before it left). Replay is a fold with no
clock and no decision.

Checkpoints (docs/rabbitmq.md, "Checkpoints and retention") roll the live records
forward so that the log can drop its old segments: a ``checkpoint-begin`` operation
(the sequence numbers, the last now, the delivery targets and the dedup table), the
live records' images ~1000 to a ``checkpoint`` operation, one append at a time between
the requests, then ``checkpoint-end``. Once that is confirmed the scheduler publishes
a pointer ``[reign, offset, checkpoint id]``, where the next scheduler starts its
replay. A confirm carries no offset, so the pointer's is the offset of the reign's
entry (the last entry a replay reads) plus the appends since: the begin entry's own,
or lower when a deposed scheduler's late entry came in between; a replay from there
skips everything up to the begin operation.

Fast puts (docs/rabbitmq.md, "Fast put"): clients append puts to the intake
themselves; the scheduler tails it and decides each put as a request of its own (its
request id in the dedup table, so a put appended twice, or folded again by a successor,
is stored once), then logs an ``intake`` operation ``[offset, client, seq]``: the
intake is folded up to there (a new scheduler resumes after it) and that client's
messages up to ``seq``. A request that starts with an ``after`` part (its client's last
confirmed intake message) waits until that message is folded, with the client's later
requests behind it (read-your-writes).

Test only: ``DELAYQ_TEST_CHECKPOINT_STOP=<n>:<k>:<path>``, read once at import, makes
the scheduler's ``n``-th checkpoint (counted in the process) stop for good after its
``k``-th image operation is confirmed, and create the file ``path`` then (the
scheduler goes on serving requests), so that a test can kill a process whose
checkpoint is certainly half written. Never set it elsewhere.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ..._log import log_event
from ...durable.message import Now, Record, State
from ...errors import DuplicateId, LeaseLost
from .._records import Records
from ._codec import (
    decode_record,
    decode_requests,
    encode_outcome,
    encode_record,
    error_reply,
    pack,
    reserve_items,
    unpack,
)
from ._constants import (
    CHECKPOINT_BYTES,
    CHECKPOINT_CHUNK,
    CHECKPOINT_ENTRIES,
    CLIENTS_KEPT,
    DEDUP_SIZE,
    DELIVER_BACKOFF_MAX_MS,
    DELIVER_BACKOFF_MS,
    DELIVER_IN_FLIGHT,
    DELIVER_LEASE_MS,
    FIRE_AHEAD_MS,
    FULL_EVERY,
    HELD_REPLY_AHEAD_MS,
    IMAGE_OVERHEAD,
    LINGER_ENTRIES,
    LINGER_MS,
    LOCATE_TIMEOUT,
    MAX_GROUP_BYTES,
    QUIET_AFTER,
    QUIET_EVERY,
    RENEW_EVERY,
)
from ._transport import Delivery, LogEntry, LogFull, Transport

__all__ = ["Scheduler"]

#: What an operation of the log is made of, before packing.
Op = list[Any]

#: Seconds a client holds messages claimed ahead beyond their due time as this clock
#: counted it when the reply left (its timer and the two clocks' rates may differ by
#: a few microseconds over a hold of a few milliseconds).
_HOLD_MARGIN = 1e-4

#: The operations of a checkpoint (their request id field carries the entry's mark).
_BEGIN, _IMAGES, _END = "checkpoint-begin", "checkpoint", "checkpoint-end"
#: The operation that notes how far the intake is folded.
_INTAKE = "intake"
_CHECKPOINT_OPS = frozenset({_BEGIN, _IMAGES, _END})
#: Operations that see a message by its id, and those that see the whole queue: a
#: message claimed ahead whose held reply has not left is given back before them
#: (_retract), so that they find it as if it had not been claimed.
_BY_ID = frozenset({"cancel", "reschedule", "get", "put"})
_WHOLE_QUEUE = frozenset({"stats", "peek", "purge", "due_counts"})


def _fault() -> tuple[int, int, Path] | None:
    """The test-only stop of the module's docstring, from the environment."""
    value = os.environ.get("DELAYQ_TEST_CHECKPOINT_STOP", "")
    if not value:
        return None
    number, chunks, path = value.split(":", 2)
    return int(number), int(chunks), Path(path)


_FAULT = _fault()


def image_bytes(id: str, payload: bytes, headers: Any, last_error: str | None) -> int:
    """About what a record's image takes in the log (the live bytes are their sum)."""
    size = len(id) + len(payload) + IMAGE_OVERHEAD + len(last_error or "")
    for key, value in headers.items():
        size += len(key) + len(str(value)) + 2
    return size


def _record_bytes(record: Record) -> int:
    return image_bytes(record.id, record.payload, record.headers, record.last_error)


def _intake_message(body: bytes) -> tuple[str, int, int, int, list[list[Any]]]:
    """An intake message's ``client, seq, floor, ceil, puts``, each put a ``[request id,
    queue, requests]``; ValueError when ``body`` is not one."""
    message = unpack(body)
    if not isinstance(message, list) or len(message) != 5:
        raise ValueError("not an intake message")
    client, seq, floor, ceil, puts = message
    if not (
        isinstance(client, str)
        and all(isinstance(n, int) for n in (seq, floor, ceil))
        and isinstance(puts, list)
        and all(
            isinstance(put, list)
            and len(put) == 3
            and isinstance(put[0], str)
            and isinstance(put[1], str)
            for put in puts
        )
    ):
        raise ValueError("not an intake message")
    return client, seq, floor, ceil, puts


def _release_each(store: Records, records: list[Record], now: Now) -> None:
    """Give back each of ``records`` under the lease it was claimed with (one settled
    since is left as it is)."""
    for record in records:
        with contextlib.suppress(LeaseLost):
            store.release(record.id, record.lease or "", now)


class _Journal(Records):
    """One queue's records that note every change, for the log, and the bytes their
    images take."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: dict[str, Record | None] = {}
        self.size = 0

    def _put(self, record: Record) -> None:
        old = self.records.get(record.id)
        if old is not None:
            self.size -= _record_bytes(old)
        self.size += _record_bytes(record)
        Records.write(self, record)

    def write(self, record: Record) -> None:
        self._put(record)
        self.changed[record.id] = record

    def delete(self, id: str) -> None:
        self.size -= _record_bytes(self.records[id])
        super().delete(id)
        self.changed[id] = None

    def restore(self, images: list[Any], deletes: list[str], last_seq: int) -> None:
        """Apply a logged operation (replay: nothing is noted)."""
        for image in images:
            self._put(decode_record(image))
        for id in deletes:
            old = self.records.pop(id, None)
            if old is not None:
                self.size -= _record_bytes(old)
        self.last_seq = max(self.last_seq, last_seq)

    def take_changes(self) -> tuple[list[Any], list[str]]:
        images = [encode_record(r) for r in self.changed.values() if r is not None]
        deletes = [id for id, r in self.changed.items() if r is None]
        self.changed.clear()
        return images, deletes


class _Parked:
    """A reserve waiting at the scheduler for something to fall due."""

    __slots__ = ("ahead", "deadline", "lease_ms", "limit", "reply_to", "request_id")

    def __init__(
        self, request_id: str, reply_to: str, limit: int, lease_ms: int, deadline: float | None
    ) -> None:
        self.request_id = request_id
        self.reply_to = reply_to
        self.limit = limit
        self.lease_ms = lease_ms
        self.deadline = deadline  # the loop's time, None: no limit
        # Messages claimed for it ahead of their due time, whose reply has not left yet
        # (it stays parked until then: something due meanwhile takes their place).
        self.ahead: _Reply | None = None


class _Reply:
    __slots__ = (
        "body",
        "claimed",
        "done",
        "dropped",
        "kind",
        "queue",
        "reply_to",
        "request_id",
        "send_at",
    )

    def __init__(
        self,
        reply_to: str,
        request_id: str,
        kind: str,
        body: bytes,
        *,
        queue: str = "",
        claimed: list[Record] | None = None,
        done: asyncio.Future[None] | None = None,
    ) -> None:
        self.reply_to = reply_to
        self.request_id = request_id
        self.kind = kind
        self.body = body
        self.queue = queue
        self.claimed = claimed
        self.done = done  # not sent: resolved once what was decided before it is logged
        self.send_at: float | None = None  # held: not sent before this time of the loop
        self.dropped = False  # held, and given up before it left (not sent)


class _Gone(Exception):
    """The log no longer holds where a replay was to start."""


class Scheduler:
    """Elected once :meth:`run` is called: replays the log, then serves requests until
    :meth:`stop` (or an append fails: it then stops and calls ``on_stopped``)."""

    def __init__(
        self,
        transport: Transport,
        on_stopped: Callable[[], None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._transport = transport
        self._on_stopped = on_stopped
        self._wall = wall
        self._reign = uuid.uuid4().hex
        self._queues: dict[str, _Journal] = {}
        self._last_now = 0
        self._dedup: collections.OrderedDict[str, tuple[str, bytes]] = collections.OrderedDict()
        self._parked: dict[str, dict[str, _Parked]] = {}
        # queue -> (exchange, routing key): the queues whose messages the scheduler
        # itself publishes at their time (configure), and how many it has in flight
        self._targets: dict[str, tuple[str, str]] = {}
        self._delivering: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._group: list[Op] = []
        self._group_bytes = 0
        self._replies: list[_Reply] = []
        self._flushing = False
        # The group holds more than intake folds (or replies wait): no linger. When the
        # group's first operation came (the loop's time), and the linger's wake-up.
        self._urgent = False
        self._group_since = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._serving = False
        self._stopped = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewal: asyncio.TimerHandle | None = None
        retention = transport.retention_bytes
        # Live image bytes a put may not push past (0: no limit), and the log's growth
        # that starts a checkpoint when the live images are smaller.
        self._max_live = retention // 4
        self._checkpoint_bytes = min(retention // 16, CHECKPOINT_BYTES) or CHECKPOINT_BYTES
        self._grown_bytes = 0
        self._grown_entries = 0
        self._checkpointing = False
        self._checkpoints = 0
        # The offset of this reign's entry, and the appends since: the k-th append is
        # at an offset of at least their sum (only a deposed scheduler's late entry can
        # come between), which is where a pointer sends a replay to look for its begin.
        self._reign_offset = 0
        self._appended = 0
        # Checkpoint id -> how many appends of this reign its begin entry came after
        # (its offset is at least the reign entry's, _reign_offset, plus that).
        self._begins: dict[str, int] = {}
        # One checkpoint's pointer published at a time, in the checkpoints' order.
        self._pointing = asyncio.Lock()
        # The intake: the next offset to fold (None: its first), each client's last
        # folded message, the requests held until a client's message is folded
        # (client -> [(its seq, reply_to, the request's parts)]), the last ``full``.
        self._intake_next: int | None = None
        self._clients: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._held: dict[str, collections.deque[tuple[int, str, list[Any]]]] = {}
        self._full_told = -FULL_EVERY
        # Nudges (_weigh_nudge): when a reserve last parked, when clients were last
        # told ``quiet`` (the loop's times), and whether they were told ``nudge`` since.
        self._waited = -QUIET_AFTER
        self._quiet_told = -QUIET_EVERY
        self._nudged = True
        # Intake offsets its retention dropped before this reign folded them.
        self._intake_lost = 0
        # Clients waiting for a sweep of the intake (_sweep), and those of the one on
        # its way (None: none is).
        self._unknown: set[str] = set()
        self._sweeping: set[str] | None = None

    # -- election, replay, stop --------------------------------------------------------

    async def run(self) -> None:
        """Take over: mark the reign in the log, fold the log up to that mark (from the
        last checkpoint), then take requests and tell the clients."""
        started = time.monotonic()
        await self._transport.append("reign", self._reign, b"")
        log, start, entries = await self._replay()
        await log.aclose()  # type: ignore[attr-defined]
        # The puts confirmed by the intake before this election are folded before any
        # request is served (a put that returned is seen by every request after it).
        await self._transport.tail_intake(
            self._intake_next, self._on_intake, self._on_marker, self._on_intake_gap
        )
        await self._transport.serve(self._on_request)
        self._serving = True
        await self._transport.announce(self._reign)
        self._schedule_renewal()
        for queue in list(self._queues):
            self._service(queue)
        for queue in list(self._targets):
            self._service(queue)
        log_event(
            logging.INFO,
            "scheduler_elected",
            reign=self._reign,
            start=start,
            entries=entries,
            intake_lost=self._intake_lost,
            seconds=round(time.monotonic() - started, 3),
        )
        self._maybe_checkpoint()

    async def _replay(self) -> tuple[AsyncIterator[LogEntry], int | None, int]:
        """Fold the log up to this reign's mark, from the last checkpoint's pointer
        (none: from the log's first entry). Returns the reader, left at the mark (the
        scheduler goes on tailing its own log), where the fold began (None: the first
        entry) and how many entries it folded."""
        transport = self._transport
        pointer = await transport.read_pointer()
        if pointer is not None:
            reign, offset, checkpoint = unpack(pointer)
            log = transport.read_log(offset)
            try:
                entries = await self._fold_log(log, offset, reign, checkpoint)
                # Again, after the marker read_pointer left: the next reader finds it.
                await transport.point(pointer)
                return log, offset, entries
            except _Gone as gone:
                await log.aclose()  # type: ignore[attr-defined]
                self._gone(offset, gone, "the log no longer holds what the last pointer names")
        log = transport.read_log(None)
        if pointer is None:
            try:
                return log, None, await self._fold_log(log, 0, "", "")
            except _Gone as gone:  # the log's head was dropped: it does not start at 0
                await log.aclose()  # type: ignore[attr-defined]
                self._gone(None, gone, "no pointer was found and the log dropped its head")
        found = await self._find_checkpoint(transport.read_log(None))
        if found is None:
            raise RuntimeError(
                "the log dropped its first entries (retention) and holds no complete "
                "checkpoint: the state cannot be rebuilt without losing messages, so this "
                "scheduler does not take over"
            )
        reign, offset, checkpoint = found
        log = transport.read_log(offset)
        entries = await self._fold_log(log, offset, reign, checkpoint)
        await transport.point(pack([reign, offset, checkpoint]))
        return log, offset, entries

    def _gone(self, pointer: int | None, gone: _Gone, what: str) -> None:
        log_event(
            logging.WARNING,
            "checkpoint_gone",
            reign=self._reign,
            pointer=pointer,
            first=gone.args[0],
            why=f"{what} (its retention): looking for the latest complete checkpoint "
            f"the log still holds",
        )

    async def _fold_log(
        self, log: AsyncIterator[LogEntry], start: int, reign: str, checkpoint: str
    ) -> int:
        """Fold ``log`` (read from ``start``, where ``checkpoint`` of ``reign`` began;
        "": the log's first entry) up to this reign's mark; :class:`_Gone` when the log
        no longer begins at ``start``."""
        current = reign
        entries = 0
        first = True
        waiting = bool(checkpoint)  # ops before the checkpoint's begin are skipped
        async for entry in log:
            if first and entry.offset != start:
                raise _Gone(entry.offset)
            first = False
            if entry.kind == "reign":
                current = entry.reign
                if entry.reign == self._reign:
                    if waiting:  # the pointer's checkpoint is not there: look for one
                        raise _Gone(start)
                    self._reign_offset = entry.offset
                    return entries
                continue
            if entry.reign != current:  # written by a deposed scheduler after its successor
                continue
            entries += 1
            self._grown_bytes += len(entry.body)  # rolled images too: a new reign
            self._grown_entries += 1  # checkpoints soon after a long replay
            for op in unpack(entry.body):
                if waiting:
                    if op[0] == _BEGIN and op[2] == f"begin:{checkpoint}":
                        waiting = False
                        self._restart(unpack(op[8]))
                    continue
                self._fold(op)
        raise ConnectionError("the log ended before this scheduler's reign entry")

    async def _find_checkpoint(self, log: AsyncIterator[LogEntry]) -> tuple[str, int, str] | None:
        """``(reign, offset of begin, id)`` of the last complete checkpoint in ``log``
        (read from its first entry up to this reign's mark), None if there is none."""
        found: tuple[str, int, str] | None = None
        begun: tuple[str, int, str] | None = None
        try:
            async for entry in log:
                if entry.kind == "reign":
                    begun = None  # a checkpoint cut by a new reign is incomplete
                    if entry.reign == self._reign:
                        return found
                    continue
                what, _, checkpoint = entry.mark.partition(":")
                if what == "begin":
                    begun = (entry.reign, entry.offset, checkpoint)
                elif what == "end" and begun is not None and begun[2] == checkpoint:
                    found, begun = begun, None
        finally:
            await log.aclose()  # type: ignore[attr-defined]
        return found

    def _restart(self, begin: list[Any]) -> None:
        """The state a checkpoint's begin operation carries (replay starts there)."""
        _, last_now, seqs, targets, dedup = begin[:5]
        if len(begin) > 5:  # the intake's state (a log written before fast puts has none)
            self._intake_next, clients = begin[5]
            for client, seq in clients:
                self._clients[client] = seq
        self._last_now = max(self._last_now, last_now)
        for queue, last_seq in seqs.items():
            store = self._store(queue)
            store.last_seq = max(store.last_seq, last_seq)
        for queue, target in targets.items():
            self._configure(queue, target)
        for request_id, kind, reply in dedup:
            self._remember(request_id, kind, reply)

    def _fold(self, op: Op) -> None:
        name, queue, request_id, floor, last_seq, images, deletes, kind, reply = op
        if name in (_BEGIN, _END):
            return  # a checkpoint's bounds matter only where a replay starts
        if name == _INTAKE:
            self._folded(*unpack(reply))
            self._last_now = max(self._last_now, floor)
            return
        if name == "configure":
            self._configure(queue, unpack(reply))
        self._store(queue).restore(images, deletes, last_seq)
        self._last_now = max(self._last_now, floor)
        if request_id and name != _IMAGES:
            if kind:
                self._remember(request_id, kind, reply)
            else:  # a held reply dropped before it left (_drop_ahead): not an answer
                self._dedup.pop(request_id, None)

    def stop(self) -> None:
        """Stop serving: timers, the renewal and pending replies are dropped (the
        clients resend to the next scheduler)."""
        if self._stopped:
            return
        self._stopped = True
        if self._serving:
            # The election goes with this process's connection: the next candidate
            # takes over.
            log_event(logging.INFO, "scheduler_stepped_down", reign=self._reign)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._renewal is not None:
            self._renewal.cancel()
        for task in self._tasks:
            task.cancel()
        self._on_stopped()

    def _schedule_renewal(self) -> None:
        loop = asyncio.get_running_loop()
        self._renewal = loop.call_later(RENEW_EVERY, lambda: self._spawn(self._renew()))

    async def _renew(self) -> None:
        await self._transport.renew()
        self._schedule_renewal()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._stopped:
            log_event(logging.WARNING, "scheduler_stopped", reign=self._reign, error=repr(exc))
            self.stop()

    # -- state -----------------------------------------------------------------------

    def _store(self, queue: str) -> _Journal:
        store = self._queues.get(queue)
        if store is None:
            store = self._queues[queue] = _Journal()
        return store

    def _now(self) -> Now:
        # AMQP has no server time: the scheduler's wall clock, never behind any time
        # already in the log (a failover never makes "now" go back).
        now = Now.of_seconds(self._wall())
        floor = max(now.floor, self._last_now)
        self._last_now = floor
        return Now(floor, max(now.ceil, floor))

    def _remember(self, request_id: str, kind: str, reply: bytes) -> None:
        self._dedup[request_id] = (kind, reply)
        if len(self._dedup) > DEDUP_SIZE:
            self._dedup.popitem(last=False)

    # -- requests ----------------------------------------------------------------------

    def _on_request(self, delivery: Delivery) -> None:
        if self._stopped:
            return
        try:
            self._take_request(delivery)
        except Exception as exc:
            # Bytes no client of delayq sends (anyone who may publish to the namespace
            # can send them): said, and the scheduler goes on serving.
            log_event(
                logging.ERROR,
                "request_bad",
                reign=self._reign,
                op=delivery.op,
                request_id=delivery.request_id,
                error=repr(exc),
            )

    def _take_request(self, delivery: Delivery) -> None:
        op, request_id, reply_to = delivery.op, delivery.request_id, delivery.reply_to
        if op == "batch":
            # Requests of one client coalesced (its outbox): each is taken as if it had
            # come alone, in order; their replies leave together (_send).
            self._take_parts(reply_to, unpack(delivery.body))
            return
        if op == "puts":  # a copy of an intake message (append_intake's nudge)
            self._on_nudge(delivery.body)
            return
        known = self._dedup.get(request_id)
        if known is not None:
            if known[0] == "held":
                waiter = self._parked.get(unpack(delivery.body)[0], {}).get(request_id)
                if waiter is not None:
                    # Still parked, its held reply not sent yet: it goes where the
                    # resend came from, once (what it holds may yet change).
                    waiter.reply_to = reply_to
                    return
            self._commit(None, _Reply(reply_to, request_id, known[0], known[1]))
            return
        args = unpack(delivery.body)
        if op == "forget":
            self._forget(args[0], args[1])
            return
        if op == "sync":  # a client waited behind its fast puts (the ``after`` part)
            self._commit(None, _Reply(reply_to, request_id, "ok", pack(None)))
            return
        if op == "queues":
            names = sorted(name for name, store in self._queues.items() if store.records)
            self._commit(None, _Reply(reply_to, request_id, "ok", pack(names)))
            return
        queue = args[0]
        store = self._store(queue)
        now = self._now()
        if op == "configure":
            self._configure_request(queue, args[1], request_id, reply_to, now)
            return
        retracted = self._retract(store, queue, op, args, now)
        try:
            if op == "put" and self._max_live:
                self._weigh(queue, args[1])
            outcome = self._apply(store, op, args[1:], now)
        except (DuplicateId, LeaseLost, LogFull) as exc:
            kind, body = error_reply(exc)
            self._decided(
                store, op, queue, "", now=now, reply=_Reply(reply_to, request_id, kind, pack(body))
            )
            if retracted:
                self._service(queue)
            return
        except Exception:
            # Arguments no client sends: what was changed before they failed (a
            # retraction, say) is logged all the same, so the state stays the log's.
            self._decided(store, op, queue, "", now=now, reply=None)
            if retracted:
                self._service(queue)
            raise
        if op == "reserve" and not outcome:
            limit, lease_ms, wait = args[1:4]
            if wait is None or wait > 0:
                deadline = None if wait is None else asyncio.get_running_loop().time() + wait
                self._park(queue, _Parked(request_id, reply_to, limit, lease_ms, deadline))
                self._decided(store, op, queue, "", now=now, reply=None)
                if store.records:
                    self._service(queue)  # something due soon is claimed ahead for it
                return
        reply = _Reply(
            reply_to,
            request_id,
            "ok",
            pack(encode_outcome(op, outcome)),
            queue=queue,
            claimed=outcome if op == "reserve" else None,
        )
        self._decided(store, op, queue, request_id, now=now, reply=reply)
        if retracted or (store.records and (self._parked.get(queue) or queue in self._targets)):
            self._service(queue)

    def _take_parts(self, reply_to: str, parts: list[Any]) -> None:
        """Take a batch's requests in order; from an ``after`` part on, they wait until
        its client's intake message is folded, behind that client's earlier waiting
        requests."""
        for at, (op, request_id, body) in enumerate(parts):
            if op == "after":
                client, seq = unpack(body)
                held = self._held.get(client)
                if held or self._clients.get(client, 0) < seq:
                    if held is None:
                        held = self._held[client] = collections.deque()
                    held.append((seq, reply_to, parts[at + 1 :]))
                    if client not in self._clients:
                        self._sweep(client)
                    return
                continue
            self._on_request(Delivery(op, request_id, reply_to, body))

    def _sweep(self, client: str) -> None:
        """A request of a client this scheduler does not know waits behind its intake
        message (not folded yet, or folded so long ago that the client was forgotten,
        CLIENTS_KEPT): a marker appended to the intake after the request came lands
        after that message, so once the marker is read the request is released."""
        self._unknown.add(client)
        if self._sweeping is None:
            self._sweeping, self._unknown = self._unknown, set()
            body = pack([self._reign, sorted(self._sweeping)])
            self._spawn(self._transport.mark_intake(body))

    def _on_marker(self, body: bytes) -> None:
        """A sweep's marker was read: release its clients' held requests."""
        try:
            reign, clients = unpack(body)
        except Exception:  # not a sweep's (a new scheduler's end marker)
            return
        if self._stopped or reign != self._reign or clients != sorted(self._sweeping or ()):
            return
        if self._sweeping is None:
            return
        swept, self._sweeping = self._sweeping, None
        for client in swept:
            held = self._held.get(client)
            if held:
                self._clients[client] = max(self._clients.get(client, 0), held[-1][0])
                self._release(client)
        if self._unknown:
            self._sweep(self._unknown.pop())

    def _release(self, client: str) -> None:
        """Take the held requests of ``client`` whose intake message is folded."""
        held = self._held.get(client)
        while held and held[0][0] <= self._clients.get(client, 0):
            _, reply_to, parts = held.popleft()
            self._take_parts(reply_to, parts)
        if held is not None and not held:
            del self._held[client]

    def _folded(self, offset: int, client: str, seq: int) -> None:
        """The intake is folded up to ``offset``, ``client``'s messages up to ``seq``."""
        self._intake_next = offset + 1
        self._clients[client] = max(seq, self._clients.pop(client, 0))
        if len(self._clients) > CLIENTS_KEPT:
            self._clients.popitem(last=False)

    def _on_intake_gap(self, expected: int, found: int) -> None:
        """The intake's retention dropped its messages from offset ``expected`` before
        they were folded (no scheduler ran for that long): the puts they held are lost.
        Said loudly; the fold goes on from ``found``."""
        self._intake_lost += found - expected
        log_event(
            logging.ERROR,
            "intake_lost",
            reign=self._reign,
            expected=expected,
            found=found,
            offsets=found - expected,
            intake_lost=self._intake_lost,
            why="the intake's retention dropped fast puts no scheduler had folded "
            "(each offset at most one intake message, of one put or more): they are lost",
        )

    def _on_intake(self, offset: int, body: bytes) -> None:
        """Fold an intake message: each put as if it had come as a request (dedup by its
        id), then the ``intake`` operation; then the requests its client's waited."""
        if self._stopped:
            return
        try:
            client, seq, floor, ceil, puts = _intake_message(body)
        except Exception as exc:  # bytes no client of delayq appends: said and skipped
            log_event(
                logging.ERROR, "intake_bad", reign=self._reign, offset=offset, error=repr(exc)
            )
            return
        self._fold_puts(puts, floor, ceil)
        self._folded(offset, client, seq)
        note = pack([offset, client, seq])
        self._commit([_INTAKE, "", "", self._last_now, 0, [], [], "", note], None, folded=True)
        self._release(client)

    def _on_nudge(self, body: bytes) -> None:
        """A copy of an intake message that puts something due within FIRE_AHEAD_MS,
        routed here by the publish that appended it: it comes before the intake's tail
        brings the message, by up to a few ms. Its puts are folded now, once every
        earlier message of that client is folded (their order kept), and logged as
        the intake's would be; the intake's copy then finds them in the dedup table
        and only notes its ``intake`` operation (the log stays replay's only input).
        A copy that is no intake message raises (said as ``request_bad``)."""
        client, seq, floor, ceil, puts = _intake_message(body)
        self._weigh_nudge()
        if self._clients.get(client, 0) != seq - 1:
            return  # an earlier message is not folded yet, or this one already is
        self._fold_puts(puts, floor, ceil)

    def _weigh_nudge(self) -> None:
        """A nudge came: when no reserve has waited for QUIET_AFTER s and no queue is
        delivered to an exchange, it helped no one (the intake's tail brings its puts
        a few ms later), so the clients are told ``quiet`` (at most every QUIET_EVERY
        s), and copy no puts to the scheduler until a reserve parks (_wanted)."""
        now = asyncio.get_running_loop().time()
        if (
            self._targets
            or now - self._waited < QUIET_AFTER
            or now - self._quiet_told < QUIET_EVERY
            or any(self._parked.values())
        ):
            return
        self._quiet_told = now
        self._nudged = False
        self._spawn(self._transport.tell_nudges(False))

    def _wanted(self) -> None:
        """A reserve parks or a queue is delivered to an exchange: nudges help again."""
        self._waited = asyncio.get_running_loop().time()
        if not self._nudged:
            self._nudged = True
            self._spawn(self._transport.tell_nudges(True))

    def _fold_puts(self, puts: list[Any], floor: int, ceil: int) -> None:
        """Decide the puts of an intake message (sent at ``floor``/``ceil`` by its
        client's clock), each once (its request id in the dedup table)."""
        for request_id, queue, requests in puts:
            if request_id in self._dedup:
                continue  # appended twice, nudged, or folded by a scheduler before
            store = self._store(queue)
            now = self._now()
            if floor < now.floor:
                # Decided as of its call (its delay counts from there, as the plain
                # put's from its arrival), never later than now: the client's clock.
                now = Now(floor, ceil)
            try:
                if self._max_live:
                    self._weigh_fast(queue, requests)
                kept = store.put(decode_requests(requests), now)
            except Exception as exc:  # not a put a client could send: dropped, and said
                store.take_changes()
                log_event(
                    logging.ERROR,
                    "fast_put_dropped",
                    reign=self._reign,
                    queue=queue,
                    request_id=request_id,
                    error=repr(exc),
                )
                continue
            reply = pack(encode_outcome("put", kept))
            entry = self._entry(
                store, "put", queue, request_id, now=now, kind="ok", body=reply, always=True
            )
            self._commit(entry, None, folded=True)
            if self._parked.get(queue) or queue in self._targets:
                self._service(queue)

    def _weigh_fast(self, queue: str, requests: list[list[Any]]) -> None:
        """A fast put cannot be refused (its client has its confirm): past the limit it
        is taken and logged, and the clients are told (at most every FULL_EVERY s) to
        put through the scheduler, which refuses with LogFull, until one is taken."""
        why = self._overweight(requests)
        if not why:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._full_told >= FULL_EVERY:
            self._full_told = loop.time()
            why = f"a fast put was taken past the limit (its client had its confirm): {why}"
            log_event(logging.WARNING, "put_over_limit", reign=self._reign, queue=queue, why=why)
            self._spawn(self._transport.warn_full())

    def _retract(self, store: _Journal, queue: str, op: str, args: list[Any], now: Now) -> bool:
        """Before ``op``: give back the messages claimed ahead for a parked reserve whose
        held reply has not left yet (_drop_ahead: due time and place kept, no attempt
        charged, logged with ``op``) when ``op`` sees them (by id: cancel, reschedule,
        get, a put that replaces; or the whole queue: stats, peek, purge, due counts),
        so that it finds them as if they had not been claimed. The reserve stays parked
        and may claim ahead again (_service, after ``op``). True when it gave any back."""
        parked = self._parked.get(queue)
        if not parked or (op not in _BY_ID and op not in _WHOLE_QUEUE):
            return False
        ids: set[str] | None = None
        if op == "put":
            ids = {request[0] for request in args[1] if request[7] == "replace"}
        elif op in _BY_ID:
            ids = {args[1]}
        retracted = False
        for waiter in parked.values():
            claimed = waiter.ahead.claimed if waiter.ahead is not None else None
            if claimed and (ids is None or any(record.id in ids for record in claimed)):
                self._drop_ahead(store, waiter, now)
                retracted = True
        return retracted

    def _live_bytes(self) -> int:
        return sum(store.size for store in self._queues.values())

    def _overweight(self, requests: list[list[Any]]) -> str:
        """Why a put of ``requests`` would take the live images past their limit ("":
        it would not)."""
        live = self._live_bytes()
        added = sum(image_bytes(r[0] or "", r[1], r[4] or {}, None) for r in requests)
        if live + added <= self._max_live:
            return ""
        return (
            f"the live messages' images would take {live + added} bytes, more than a "
            f"quarter of the log's retention ({self._max_live} bytes): ack, cancel or "
            f"purge messages, or raise retention_bytes"
        )

    def _weigh(self, queue: str, requests: list[list[Any]]) -> None:
        """LogFull when a put of ``requests`` (encoded) would make the live images
        outgrow a quarter of the log's retention: retention keeps two checkpoints'
        worth of log, so it never drops the last image of a live message."""
        why = self._overweight(requests)
        if not why:
            return
        log_event(logging.WARNING, "put_refused", reign=self._reign, queue=queue, why=why)
        raise LogFull(f"put refused: {why}")

    def _apply(self, store: _Journal, op: str, args: list[Any], now: Now) -> Any:
        if op == "put":
            return store.put(decode_requests(args[0]), now)
        if op == "reserve":
            return store.claim(now, args[0], args[1])
        if op == "ack":
            return store.ack(args[0], args[1], now)
        if op == "ack_many":
            return store.ack_many([(id, token) for id, token in args[0]], now)
        if op == "nack":
            id, token, delay_ms, error, dead = args
            return store.nack(id, token, now, delay_ms=delay_ms, error=error, dead=dead)
        if op == "release":
            return store.release(args[0], args[1], now)
        if op == "extend":
            return store.extend(args[0], args[1], now, args[2])
        if op == "cancel":
            return store.cancel(args[0], now)
        if op == "reschedule":
            return store.reschedule(args[0], now, delay_ms=args[1], at_ms=args[2])
        if op == "get":
            return store.get(args[0], now)
        if op == "stats":
            return store.stats(now)
        if op == "dead":
            return store.dead(args[0], args[1], now)
        if op == "retry_dead":
            return store.retry_dead(args[0], now)
        if op == "purge":
            return store.purge(None if args[0] is None else State(args[0]), now)
        if op == "peek":
            state, limit, after = args
            position = None if after is None else tuple(after)
            return store.peek(None if state is None else State(state), limit, position, now)
        if op == "due_counts":
            return store.due_counts(args[0], args[1], now)
        raise ValueError(f"unknown operation {op!r}")

    def _decided(
        self,
        store: _Journal,
        op: str,
        queue: str,
        request_id: str,
        *,
        now: Now,
        reply: _Reply | None,
    ) -> None:
        """Log what ``op`` changed (nothing: no entry), then send ``reply`` once it is
        in the log. A request id is logged only with a write, with its reply."""
        if reply is None:
            entry = self._entry(store, op, queue, "", now=now, kind="", body=b"")
        else:
            entry = self._entry(
                store, op, queue, request_id, now=now, kind=reply.kind, body=reply.body
            )
        self._commit(entry, reply)

    def _entry(
        self,
        store: _Journal,
        op: str,
        queue: str,
        request_id: str,
        *,
        now: Now,
        kind: str,
        body: bytes,
        always: bool = False,
    ) -> Op | None:
        """The log entry of what ``op`` changed in ``store`` (None when nothing, unless
        ``always``), its request id remembered with its reply (``kind``, ``body``)."""
        images, deletes = store.take_changes()
        if not (images or deletes or always):
            return None
        if request_id:
            self._remember(request_id, kind, body)
        return [op, queue, request_id, now.floor, store.last_seq, images, deletes, kind, body]

    # -- group commit ----------------------------------------------------------------

    def _commit(self, entry: Op | None, reply: _Reply | None, *, folded: bool = False) -> None:
        """Add ``entry`` to the group and ``reply`` to what is sent once it is logged;
        ``folded``: an operation folded from the intake, which may linger (LINGER_MS)."""
        if entry is not None:
            if not self._group:
                self._group_since = asyncio.get_running_loop().time()
            self._group.append(entry)
            size = sum(len(image[1]) + 128 for image in entry[5]) + 64
            self._group_bytes += size
            if entry[0] not in _CHECKPOINT_OPS:  # a checkpoint's own bytes do not count
                self._grown_bytes += size
        if reply is not None:
            # Sent by the flush task, once the callback that decided it (a batch of
            # requests: all of them) is over, so that replies to one client leave as one.
            self._replies.append(reply)
        if reply is not None or (entry is not None and not folded):
            self._urgent = True
        if self._wake is not None and (
            self._urgent
            or len(self._group) >= LINGER_ENTRIES
            or self._group_bytes >= MAX_GROUP_BYTES
        ):
            self._end_linger()
        if not self._flushing and (self._group or self._replies):
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        try:
            while self._group or self._replies:
                if not self._urgent:
                    await self._linger()
                group, replies = self._take_group()
                if group:
                    body = pack(group)
                    mark = next((op[2] for op in group if op[0] in (_BEGIN, _END)), "")
                    self._appended += 1
                    if mark.startswith("begin:"):
                        self._begins[mark[6:]] = self._appended
                    await self._transport.append("entry", self._reign, body, mark)
                    if any(op[0] not in _CHECKPOINT_OPS for op in group):
                        self._grown_entries += 1
                self._send(replies)
                if replies:
                    # One turn of the loop: the replies' tasks put their publishes on
                    # the wire before the next append's.
                    await asyncio.sleep(0)
                self._maybe_checkpoint()
        finally:
            self._flushing = False

    async def _linger(self) -> None:
        """Wait until the group's first operation is LINGER_MS old, or it holds
        LINGER_ENTRIES operations, or something that may not wait joins it (_commit):
        only intake folds are in it, durable in the intake already (a scheduler that
        dies meanwhile leaves their ``intake`` operation unlogged, so its successor
        folds them again), so puts that come one at a time share an append."""
        loop = asyncio.get_running_loop()
        rest = self._group_since + LINGER_MS / 1000.0 - loop.time()
        if rest <= 0 or len(self._group) >= LINGER_ENTRIES:
            return
        self._wake = loop.create_future()
        timer = loop.call_later(rest, self._end_linger)
        try:
            await self._wake
        finally:
            timer.cancel()
            self._wake = None

    def _end_linger(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _take_group(self) -> tuple[list[Op], list[_Reply]]:
        """Everything decided so far, up to MAX_GROUP_BYTES of entries (one larger
        operation goes alone), with the replies that were decided before the rest."""
        if self._group_bytes <= MAX_GROUP_BYTES:
            group, replies = self._group, self._replies
            self._group, self._replies, self._group_bytes = [], [], 0
            self._urgent = False
            return group, replies
        # Too much for one entry: the first half of the operations, and the replies
        # queued before the first operation left behind stay with what follows.
        half = max(1, len(self._group) // 2)
        group, self._group = self._group[:half], self._group[half:]
        self._group_bytes = sum(
            sum(len(image[1]) + 128 for image in entry[5]) + 64 for entry in self._group
        )
        # Replies keep their order; those of operations still pending wait for them.
        logged = {entry[2] for entry in self._group if entry[2]}
        cut = next(
            (i for i, reply in enumerate(self._replies) if reply.request_id in logged),
            len(self._replies),
        )
        replies, self._replies = self._replies[:cut], self._replies[cut:]
        return group, replies

    def _on_wire(self, kind: str, body: bytes) -> bytes:
        """A reply's body as it leaves: a ``held`` one (messages claimed before their
        due time) says how long its client must still hold them, counted from now by
        this clock, rather than when (the client's clock may differ): it arrives after
        it left, so the client hands them on no earlier than their due time by this
        clock. A hair more, for the client's timer and clock rates."""
        if kind != "held":
            return body
        until, outcome = unpack(body)
        return pack([max(until / 1000.0 - self._wall(), 0.0) + _HOLD_MARGIN, outcome])

    def _send(self, replies: list[_Reply]) -> None:
        """Send ``replies`` (their operations are in the log). Only a reply that carries
        claimed messages waits for the broker's word (did its client get it?); the
        others are sent and left, those to one client as one ``batch`` message (in
        order, up to MAX_GROUP_BYTES each). Each claimed one is published by a task of
        its own, the plain ones by one task started after them: the claimed ones (the
        firing path's last hop) wait for no other reply's publish, and the flush's next
        append for none of them (a client matches replies by request id)."""
        plain: dict[str, list[_Reply]] = {}
        for reply in replies:
            if reply.done is not None:
                if not reply.done.done():
                    reply.done.set_result(None)
            elif reply.claimed:
                self._spawn(self._reply(reply))
            else:
                plain.setdefault(reply.reply_to, []).append(reply)
        if plain:
            self._spawn(self._send_plain(plain))

    async def _send_plain(self, plain: dict[str, list[_Reply]]) -> None:
        for reply_to, group in plain.items():
            left = group
            while left:
                size = len(left[0].body)
                cut = 1
                while cut < len(left) and size + len(left[cut].body) <= MAX_GROUP_BYTES:
                    size += len(left[cut].body)
                    cut += 1
                part, left = left[:cut], left[cut:]
                if len(part) == 1:
                    one = part[0]
                    body = self._on_wire(one.kind, one.body)
                    await self._transport.reply(
                        reply_to, one.request_id, one.kind, body, confirm=False
                    )
                else:
                    body = pack(
                        [[r.request_id, r.kind, self._on_wire(r.kind, r.body)] for r in part]
                    )
                    await self._transport.reply(reply_to, "", "batch", body, confirm=False)

    async def _reply(self, reply: _Reply) -> None:
        if reply.send_at is not None:
            # Claimed ahead: sent a little before the due time, its waiter parked until
            # then (something due meanwhile drops it, _service).
            rest = reply.send_at - asyncio.get_running_loop().time()
            if rest > 0 and not reply.dropped:
                await asyncio.sleep(rest)
            if reply.dropped:
                return
            parked = self._parked.get(reply.queue) or {}
            waiter = parked.get(reply.request_id)
            if waiter is not None and waiter.ahead is reply:
                del parked[reply.request_id]
                reply.reply_to = waiter.reply_to  # resent from a new connection meanwhile
        body = self._on_wire(reply.kind, reply.body)
        delivered = await self._transport.reply(
            reply.reply_to, reply.request_id, reply.kind, body, confirm=True
        )
        if not delivered and reply.claimed:
            # Its client is gone: give back what was claimed for it at once, rather than
            # letting it wait out a lease nobody holds.
            self._give_back(reply.queue, reply.claimed)

    def _give_back(self, queue: str, claimed: list[Record]) -> None:
        if self._stopped:
            return
        store = self._store(queue)
        now = self._now()
        for record in claimed:
            try:
                store.release(record.id, record.lease or "", now)
            except LeaseLost:
                continue
        self._decided(store, "release", queue, "", now=now, reply=None)
        self._service(queue)

    # -- checkpoints -------------------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        if self._checkpointing or self._stopped or not self._serving:
            return
        if self._grown_entries >= CHECKPOINT_ENTRIES or self._grown_bytes >= max(
            self._live_bytes(), self._checkpoint_bytes
        ):
            self._checkpointing = True
            self._spawn(self._checkpoint())

    async def _logged(self, op: Op) -> None:
        """Append ``op`` with the requests (group commit) and return once it is in the
        log."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._commit(op, _Reply("", op[2], "", b"", done=done))
        await done

    async def _checkpoint(self) -> None:
        """Roll every live record forward (the module's docstring), one operation of
        images per append, so that requests keep being answered meanwhile."""
        self._checkpoints += 1
        number = self._checkpoints
        checkpoint = uuid.uuid4().hex[:16]
        started = time.monotonic()
        begin = [
            checkpoint,
            self._last_now,
            {queue: store.last_seq for queue, store in self._queues.items()},
            {queue: list(target) for queue, target in self._targets.items()},
            [[request_id, kind, reply] for request_id, (kind, reply) in self._dedup.items()],
            [self._intake_next, list(self._clients.items())],
        ]
        live = [(queue, list(store.records)) for queue, store in self._queues.items()]
        self._grown_bytes = self._grown_entries = 0
        floor = self._now().floor
        await self._logged([_BEGIN, "", f"begin:{checkpoint}", floor, 0, [], [], "", pack(begin)])
        chunks = images = 0
        for queue, ids in live:
            for at in range(0, len(ids), CHECKPOINT_CHUNK):
                store = self._store(queue)
                chunk = [store.records.get(id) for id in ids[at : at + CHECKPOINT_CHUNK]]
                encoded = [encode_record(r) for r in chunk if r is not None]
                if not encoded:
                    continue  # every one of them changed meanwhile, and was logged then
                chunks += 1
                images += len(encoded)
                mark = f"images:{checkpoint}:{chunks}"
                floor = self._now().floor
                await self._logged(
                    [_IMAGES, queue, mark, floor, store.last_seq, encoded, [], "", b""]
                )
                if _FAULT is not None and _FAULT[:2] == (number, chunks):
                    _FAULT[2].touch()
                    await asyncio.get_running_loop().create_future()  # forever (tests)
        floor = self._now().floor
        await self._logged([_END, "", f"end:{checkpoint}", floor, 0, [], [], "", b""])
        # Complete in the log: the next checkpoint may start while this one's pointer
        # is found (up to LOCATE_TIMEOUT). The log must never outgrow its retention
        # with no complete checkpoint in it, and a backlog of fast puts folds that
        # fast (tests/backends/test_amqp_checkpoint.py).
        async with self._pointing:
            self._checkpointing = False
            self._maybe_checkpoint()
            offset = await self._locate(self._begins.pop(checkpoint), f"begin:{checkpoint}")
            await self._transport.point(pack([self._reign, offset, checkpoint]))
        log_event(
            logging.INFO,
            "checkpoint_written",
            reign=self._reign,
            images=images,
            operations=chunks,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _locate(self, appended: int, mark: str) -> int:
        """The offset of this reign's entry marked ``mark``, its ``appended``-th append
        of the reign: at or after the reign entry's offset plus ``appended`` (a
        stream's offsets have gaps: a segment opens with an entry of the broker's
        own), read from there; the predictions that follow start from what it finds.
        That lower bound itself when it cannot be read in time (still a valid
        pointer)."""
        lower = self._reign_offset + appended
        log = self._transport.read_log(lower, few=True)

        async def find() -> int:
            async for entry in log:
                if entry.kind == "reign" and entry.reign != self._reign:
                    break
                if entry.reign == self._reign and entry.mark == mark:
                    return entry.offset
            return lower

        try:
            found = await asyncio.wait_for(find(), LOCATE_TIMEOUT)
        except (asyncio.TimeoutError, ConnectionError):
            found = lower
        finally:
            await log.aclose()  # type: ignore[attr-defined]
        # Whatever was found for a later append meanwhile: the gaps only add up.
        self._reign_offset = max(self._reign_offset, found - appended)
        return found

    # -- waiting reserves and timers ---------------------------------------------------

    def _park(self, queue: str, waiter: _Parked) -> None:
        parked = self._parked.setdefault(queue, {})
        known = parked.get(waiter.request_id)
        if known is not None:
            # A resend of a parked reserve waits once, but is answered where it came
            # from: its client resends on a new connection when it gave up the old one,
            # whose inbox may take the answer while no one reads it any more.
            known.reply_to = waiter.reply_to
            return
        parked[waiter.request_id] = waiter
        self._wanted()
        self._arm(queue)

    def _forget(self, queue: str, request_id: str) -> None:
        """A reserve its caller gave up: dropped if parked (what was claimed ahead for
        it goes back); if it was answered, what it claimed goes back too, so that the
        client's next request finds those messages as if never claimed (the late
        answer's own releases then find them released)."""
        parked = self._parked.get(queue)
        waiter = None if parked is None else parked.pop(request_id, None)
        if waiter is not None:
            if waiter.ahead is not None:
                store = self._store(queue)
                now = self._now()
                self._drop_ahead(store, waiter, now)
                self._decided(store, "release", queue, "", now=now, reply=None)
                self._service(queue)
            return
        known = self._dedup.get(request_id)
        if known is None or known[0] not in ("ok", "held"):
            return
        items = reserve_items(*known)
        if not isinstance(items, list) or not items:
            return
        store = self._store(queue)
        now = self._now()
        _release_each(store, [decode_record(item) for item in items], now)
        self._decided(store, "release", queue, "", now=now, reply=None)
        self._service(queue)

    def _drop_ahead(self, store: _Journal, waiter: _Parked, now: Now) -> None:
        """Give back what was claimed ahead for ``waiter`` (its reply not sent: it is
        dropped), keeping each message's due time and place; the caller logs it."""
        reply, waiter.ahead = waiter.ahead, None
        if reply is None:
            return
        reply.dropped = True
        _release_each(store, reply.claimed or [], now)
        # Nor is it the request's answer any more: a resend (here, or to the next
        # scheduler, which replays this entry) is served afresh, never with messages
        # given back (and perhaps cancelled since) from the dedup table.
        self._dedup.pop(reply.request_id, None)
        forgotten = ["release", reply.queue, reply.request_id, now.floor, store.last_seq]
        self._commit([*forgotten, [], [], "", b""], None)

    def _service(self, queue: str) -> None:
        """Serve the parked reserves of ``queue`` in arrival order with what is due, answer
        those whose wait is over, and arm the timer for the next event."""
        if self._stopped or not self._serving:
            return
        if queue in self._targets:
            if self._deliver_due(queue):
                self._arm(queue)
            return
        parked = self._parked.get(queue)
        if not parked:
            return
        store = self._store(queue)
        loop = asyncio.get_running_loop()
        for request_id, waiter in list(parked.items()):
            now = self._now()
            if waiter.ahead is not None:
                event = store.next_event()
                if event is None or event > now.floor:
                    continue  # its held reply leaves in time
                # Something fell due before the messages claimed ahead for it: those
                # go back (their due time unchanged), it takes what is due now.
                self._drop_ahead(store, waiter, now)
            claimed = store.claim(now, waiter.limit, waiter.lease_ms)
            if not claimed:
                ahead = self._claim_ahead(
                    queue, now, (waiter.limit, waiter.lease_ms, waiter.deadline)
                )
                if ahead:
                    reply = self._claimed(
                        waiter.reply_to, request_id, queue, ahead, ahead[0].due_at
                    )
                    reply.send_at = loop.time() + max(
                        (ahead[0].due_at - HELD_REPLY_AHEAD_MS) / 1000.0 - self._wall(), 0.0
                    )
                    waiter.ahead = reply
                    self._decided(store, "reserve", queue, request_id, now=now, reply=reply)
                    continue
            if claimed:
                del parked[request_id]
                reply = self._claimed(waiter.reply_to, request_id, queue, claimed, 0)
                self._decided(store, "reserve", queue, request_id, now=now, reply=reply)
            elif waiter.deadline is not None and waiter.deadline <= loop.time():
                del parked[request_id]
                self._decided(
                    store,
                    "reserve",
                    queue,
                    "",
                    now=now,
                    reply=_Reply(waiter.reply_to, request_id, "ok", pack([])),
                )
            else:
                self._decided(store, "reserve", queue, "", now=now, reply=None)
        self._arm(queue)

    def _deadline_ms(self, deadline: float) -> int:
        """A waiter's deadline (the loop's time) as epoch ms by this clock, floored."""
        loop = asyncio.get_running_loop()
        return math.floor(self._wall() * 1000.0 + (deadline - loop.time()) * 1000.0)

    def _claim_ahead(
        self, queue: str, now: Now, waiter: tuple[int, int, float | None]
    ) -> list[Record]:
        """For a reserve that waits and finds nothing due: the messages due next, when
        that is within FIRE_AHEAD_MS and before the reserve's wait ends, claimed now
        (leased from their due time); their reply tells the client to hold them until
        then. Never for a queue delivered to a user's exchange (published at its time)."""
        if not FIRE_AHEAD_MS or queue in self._targets:
            return []
        limit, lease_ms, deadline = waiter
        horizon = now.floor + FIRE_AHEAD_MS
        if deadline is not None:
            horizon = min(horizon, self._deadline_ms(deadline))
        return self._store(queue).claim_ahead(now, horizon, limit, lease_ms)

    def _claimed(
        self, reply_to: str, request_id: str, queue: str, claimed: list[Record], hold_until: int
    ) -> _Reply:
        """The reply that hands ``claimed`` to a reserve: ``held`` until ``hold_until``
        (epoch ms; 0: due already, a plain ``ok``)."""
        outcome = encode_outcome("reserve", claimed)
        kind, body = ("held", pack([hold_until, outcome])) if hold_until else ("ok", pack(outcome))
        return _Reply(reply_to, request_id, kind, body, queue=queue, claimed=claimed)

    def _arm(self, queue: str) -> None:
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()
        parked = self._parked.get(queue) or {}
        if (not parked and queue not in self._targets) or self._stopped:
            return
        loop = asyncio.get_running_loop()
        at: float | None = None
        store = self._store(queue)
        event = store.next_event()
        if event is not None:
            due = store.next_due()
            if (
                due is not None
                and FIRE_AHEAD_MS
                and queue not in self._targets
                and any(
                    w.ahead is None and (w.deadline is None or self._deadline_ms(w.deadline) > due)
                    for w in parked.values()
                )
            ):
                # A waiter can take it ahead of its time (_claim_ahead).
                event = min(event, due - FIRE_AHEAD_MS)
            # The loop's time of that millisecond, plus a hair so that the floored now
            # has reached it (the service checks, and re-arms when it has not).
            at = loop.time() + max(event / 1000.0 - self._wall(), 0.0) + 5e-5
        for waiter in parked.values():
            if (
                waiter.ahead is None
                and waiter.deadline is not None
                and (at is None or waiter.deadline < at)
            ):
                at = waiter.deadline
        if at is not None:
            self._timers[queue] = loop.call_at(at, self._service, queue)

    # -- delivering to a user's exchange -------------------------------------------------

    def _configure(self, queue: str, target: list[str]) -> None:
        exchange, routing_key = target
        self._targets[queue] = (exchange, routing_key or queue)

    def _configure_request(
        self, queue: str, target: list[str], request_id: str, reply_to: str, now: Now
    ) -> None:
        """Deliver ``queue``'s messages to ``target`` from now on (logged when it
        changes what was configured)."""
        exchange, routing_key = target
        wanted = (exchange, routing_key or queue)
        reply = _Reply(reply_to, request_id, "ok", pack(None))
        if self._targets.get(queue) == wanted:
            self._commit(None, reply)
            return
        self._configure(queue, target)
        self._wanted()
        store = self._store(queue)
        body = pack(target)
        entry = ["configure", queue, "", now.floor, store.last_seq, [], [], "ok", body]
        self._commit(entry, reply)
        self._service(queue)

    def _deliver_due(self, queue: str) -> bool:
        """Claim what is due (logged, as a reserve is) and publish it to the queue's
        target in (due_at, seq) order; the outcome of each publish settles it. False
        when DELIVER_IN_FLIGHT publishes are out: the next outcome serves the queue."""
        in_flight = self._delivering.get(queue, 0)
        room = DELIVER_IN_FLIGHT - in_flight
        if room <= 0:
            return False
        store = self._store(queue)
        now = self._now()
        claimed = store.claim(now, room, DELIVER_LEASE_MS)
        self._decided(store, "reserve", queue, "", now=now, reply=None)
        self._delivering[queue] = in_flight + len(claimed)
        exchange, routing_key = self._targets[queue]
        for record in claimed:
            self._spawn(self._deliver_one(queue, exchange, routing_key, record))
        return len(claimed) < room

    async def _deliver_one(
        self, queue: str, exchange: str, routing_key: str, record: Record
    ) -> None:
        try:
            problem = await self._transport.deliver(exchange, routing_key, queue, record)
        finally:
            self._delivering[queue] = self._delivering.get(queue, 1) - 1
        if self._stopped:
            return
        store = self._store(queue)
        now = self._now()
        try:
            if problem is None:
                store.ack(record.id, record.lease or "", now)
            else:
                delay_ms = min(
                    DELIVER_BACKOFF_MS * 2 ** max(record.attempts - 1, 0), DELIVER_BACKOFF_MAX_MS
                )
                store.nack(
                    record.id, record.lease or "", now, delay_ms=delay_ms, error=problem, dead=False
                )
        except LeaseLost:
            pass  # its lease ran out meanwhile: settled as any expired lease
        self._decided(store, "fired" if problem is None else "nack", queue, "", now=now, reply=None)
        self._service(queue)
