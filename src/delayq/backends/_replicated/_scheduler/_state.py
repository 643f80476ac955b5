"""What the elected scheduler holds: the namespace's state in memory (each queue's
:class:`~._journal.Journal`, the dedup table, the parked reserves, the delivery targets,
the intake's progress), the log's operations, and the seams between the modules that
each take one concern of it (:class:`SchedulerState`).

An entry of the log is a msgpack array of operations, each
``[op, queue, request_id, now_floor, last_seq, images, deletes, reply_kind, reply]``:
the records the operation wrote (whole), the ids it deleted, the queue's last sequence
number, and the reply it earned (so that a request resent after a failover is answered
from the log, not applied twice); a request id with no reply kind takes back the
request's logged reply (a held one dropped before it left). Replay is a fold with no
clock and no decision (_reign.py). Each request id of the dedup table keeps the time
it was decided at (the log's time: ``now_floor``, or the latest before it), so that
the table is bounded by age as well as by size (_dedup.py).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...._log import log_event
from ....durable.message import Now, Record
from .._codec import pack
from .._constants import (
    CHECKPOINT_BYTES,
    DEDUP_SIZE,
    FOLDING,
    FULL_EVERY,
    MAX_GROUP_BYTES,
    QUIET_AFTER,
    QUIET_EVERY,
)
from .._transport import Delivery, Transport
from ._journal import Journal, image_bytes

__all__ = [
    "BEGIN",
    "CHECKPOINT_OPS",
    "DEDUP",
    "END",
    "ID_BYTES",
    "IMAGES",
    "INTAKE",
    "PRUNE",
    "Op",
    "Parked",
    "Reply",
    "SchedulerState",
]

#: What an operation of the log is made of, before packing.
Op = list[Any]
#: The operations that may touch a whole queue and whose changes are logged in pieces
#: of at most PIECE_BYTES when larger (a purge or a retry of millions would outgrow
#: the broker's largest message): each piece is an entry of its own and only the last
#: carries the request id and its reply, so that a scheduler killed between two pieces
#: leaves a queue partly purged (retried), and the resent request does the rest.
PIECEWISE = frozenset({"purge", "retry_dead"})
#: The most bytes of images and ids in one piece: half an append (MAX_GROUP_BYTES).
PIECE_BYTES = MAX_GROUP_BYTES // 2


#: What an image weighs in an append beyond its payload, and a deleted id beyond its
#: characters (the estimates of :func:`entry_bytes` and :func:`pieces`).
_IMAGE_BYTES, ID_BYTES = 128, 2


def entry_bytes(entry: Op) -> int:
    """About what an operation takes in an append: its images, its deleted ids."""
    size = 64
    for image in entry[5]:
        size += len(image[1]) + _IMAGE_BYTES
    for id in entry[6]:
        size += len(id) + ID_BYTES
    return size


def pieces(images: list[Any], deletes: list[str], most: int) -> list[tuple[list[Any], list[str]]]:
    """``images`` and ``deletes`` cut into consecutive pieces of about ``most`` bytes
    each (:func:`entry_bytes`), images first; at least one piece."""
    out: list[tuple[list[Any], list[str]]] = []
    piece: tuple[list[Any], list[str]] = ([], [])
    size = 0
    for image in images:
        if size >= most:
            out.append(piece)
            piece, size = ([], []), 0
        piece[0].append(image)
        size += len(image[1]) + _IMAGE_BYTES
    for id in deletes:
        if size >= most:
            out.append(piece)
            piece, size = ([], []), 0
        piece[1].append(id)
        size += len(id) + ID_BYTES
    out.append(piece)
    return out


#: The operations of a checkpoint (their request id field carries the entry's mark):
#: its begin, the dedup table's entries in chunks after it, the live images, its end.
BEGIN, DEDUP, IMAGES, END = "checkpoint-begin", "checkpoint-dedup", "checkpoint", "checkpoint-end"
CHECKPOINT_OPS = frozenset({BEGIN, DEDUP, IMAGES, END})
#: The operation that notes how far the intake is folded.
INTAKE = "intake"
#: The operation that drops the dedup table's entries decided at or before a time
#: (_dedup.py), so that a replay, and a hot standby, hold the table the scheduler held.
PRUNE = "dedup-prune"


class Parked:
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
        self.ahead: Reply | None = None


class Reply:
    """A reply decided by the scheduler, sent once what it answers is in the log
    (_group_commit.py)."""

    __slots__ = (
        "body",
        "claimed",
        "done",
        "dropped",
        "kind",
        "queue",
        "reply_to",
        "request_id",
        "resent",
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
        #: A resend of its request was answered with it again (from the dedup table),
        #: while it was on its way: its claim is that answer's too.
        self.resent = False


class SchedulerState(abc.ABC):
    """The state every concern of the scheduler works on, its few shared steps (a
    queue's journal, now, the dedup table, a task, an operation logged with its reply),
    and the seams: what each concern's module offers the others, declared here so that
    none imports another (the :class:`~._elected.Scheduler` composes them)."""

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
        self._queues: dict[str, Journal] = {}
        self._last_now = 0
        # request id -> (reply kind, reply, decided at: the log's time, epoch ms), oldest
        # first; the reign's start (its logged time, the loop's time) that their age is
        # counted from, and whether a prune's marker is on its way (_dedup.py).
        self._dedup: collections.OrderedDict[str, tuple[str, bytes, int]] = (
            collections.OrderedDict()
        )
        self._anchor: tuple[int, float] | None = None
        self._prune_marked = False
        self._prune_timer: asyncio.TimerHandle | None = None
        #: Request id -> a reply that claimed messages, while it is on its way.
        self._claiming: dict[str, Reply] = {}
        #: Request id -> where its reply goes, of each purge whose far records' ids are
        #: being logged a page at a time (_requests.py).
        self._purges: dict[str, str] = {}
        self._parked: dict[str, dict[str, Parked]] = {}
        # queue -> (exchange, routing key): the queues whose messages the scheduler
        # itself publishes at their time (configure), and how many it has in flight
        self._targets: dict[str, tuple[str, str]] = {}
        self._delivering: dict[str, int] = {}
        # The publishes in flight (their tasks), and whether this scheduler is stepping
        # down (it publishes nothing more: _delivery.py).
        self._publishes: set[asyncio.Task[Any]] = set()
        self._stepping_down = False
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._group: list[Op] = []
        self._group_bytes = 0
        self._replies: list[Reply] = []
        self._flushing = False
        # The group holds more than intake folds (or replies wait): no linger. When the
        # group's first operation came (the loop's time), and the linger's wake-up.
        self._urgent = False
        self._group_since = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._serving = False
        self._stopped = False
        # The fold of the log (_reign.py): its task, started by a hot standby while it
        # waits or at election; whether this process was elected; the loop's time of
        # the last entry it read; the entries it folded; the pointer of the last
        # complete checkpoint it read.
        self._replaying: asyncio.Task[tuple[Any, int | None, int]] | None = None
        self._elected = False
        self._read_at = 0.0
        self._entries = 0
        # A hot standby's entry bytes folded before its last collection and since, and
        # the timer that collects once the log goes quiet (_reign.py).
        self._swept = 0
        self._unswept = 0
        self._sweeping_timer: asyncio.TimerHandle | None = None
        self._pointed: bytes | None = None
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
        # One checkpoint's pointer published at a time, in the checkpoints' order; one
        # whose successor is complete before its turn is skipped (the last complete).
        self._pointing = asyncio.Lock()
        self._completed = ""
        # The intake: the next offset to fold (None: its first), each client's last
        # folded message, the requests held until a client's message is folded
        # (client -> [(its seq, reply_to, the request's parts)]), the last ``full``.
        self._intake_next: int | None = None
        self._clients: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._held: dict[str, collections.deque[tuple[int, str, list[Any]]]] = {}
        # While any is held: the timer of the next word to their clients that the fold
        # advances, and the intake's offset at the last one (_tell_folding).
        self._folding_timer: asyncio.TimerHandle | None = None
        self._folding_from: int | None = None
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

    def stop(self) -> None:
        """Stop serving: timers, the renewal and pending replies are dropped (the
        clients resend to the next scheduler)."""
        if self._stopped:
            return
        self._stopped = True
        if self._serving:
            # The election goes with this process's connection: the next candidate
            # takes over.
            log_event(
                logging.INFO,
                "scheduler_stepped_down",
                reign=self._reign,
                namespace=self._transport.namespace,
            )
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._renewal is not None:
            self._renewal.cancel()
        if self._prune_timer is not None:
            self._prune_timer.cancel()
        if self._folding_timer is not None:
            self._folding_timer.cancel()
        for task in self._tasks:
            task.cancel()
        for store in self._queues.values():
            store.close()
        self._on_stopped()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _tell_at_work(self, reply_to: str, request_ids: list[str]) -> None:
        """Tell the client at ``reply_to`` that its requests ``request_ids`` are at work
        (the FOLDING word): it waits a request timeout more for each, from now."""
        word = self._transport.reply(reply_to, "", FOLDING, pack(request_ids), confirm=False)
        self._spawn(word)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._stopped:
            log_event(logging.WARNING, "scheduler_stopped", reign=self._reign, error=repr(exc))
            self.stop()

    def _store(self, queue: str) -> Journal:
        store = self._queues.get(queue)
        if store is None:
            store = self._queues[queue] = Journal()
        return store

    def _now(self) -> Now:
        # AMQP has no server time: the scheduler's wall clock, never behind any time
        # already in the log (a failover never makes "now" go back).
        now = Now.of_seconds(self._wall())
        floor = max(now.floor, self._last_now)
        self._last_now = floor
        return Now(floor, max(now.ceil, floor))

    def _remember(self, request_id: str, kind: str, reply: bytes, at: int | None = None) -> None:
        """Remember ``request_id``'s reply, decided at ``at`` (the log's time, epoch ms;
        None: the last time logged). A request id remembered again moves to the end."""
        dedup = self._dedup
        dedup.pop(request_id, None)
        dedup[request_id] = (kind, reply, self._last_now if at is None else at)
        if len(dedup) > DEDUP_SIZE:
            dedup.popitem(last=False)

    def _prune(self, cutoff: int) -> None:
        """Drop the dedup table's entries decided at or before ``cutoff``, oldest first
        (one remembered out of order, behind a newer one, waits its turn)."""
        dedup = self._dedup
        while dedup:
            request_id, entry = next(iter(dedup.items()))
            if entry[2] > cutoff:
                break
            del dedup[request_id]

    def _entry(
        self,
        store: Journal,
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
        # The scheduler's last time (a fast put's ``now`` may be its client's, earlier):
        # a replay remembers the request id as decided at that same time.
        floor = max(now.floor, self._last_now)
        if op in PIECEWISE and len(images) + len(deletes) > 1:
            *leading, (images, deletes) = pieces(images, deletes, PIECE_BYTES)
            for piece_images, piece_deletes in leading:
                piece = [op, queue, "", floor, store.last_seq, piece_images, piece_deletes]
                self._commit([*piece, "", b""], None)
        if request_id:
            self._remember(request_id, kind, body)
        return [op, queue, request_id, floor, store.last_seq, images, deletes, kind, body]

    def _decided(
        self,
        store: Journal,
        op: str,
        queue: str,
        request_id: str,
        *,
        now: Now,
        reply: Reply | None,
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

    # -- the seams: each is defined by the module named above it ---------------------

    # _checkpoints.py

    @abc.abstractmethod
    def _maybe_checkpoint(self) -> None:
        raise NotImplementedError

    # _dedup.py

    @abc.abstractmethod
    def _start_pruning(self) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _on_dedup_marker(self, reign: str, cutoff: int) -> None:
        raise NotImplementedError

    # _group_commit.py

    @abc.abstractmethod
    def _commit(self, entry: Op | None, reply: Reply | None, *, folded: bool = False) -> None:
        raise NotImplementedError

    # _delivery.py

    @abc.abstractmethod
    def _configure(self, queue: str, target: list[str]) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _configure_request(
        self, queue: str, target: list[str], request_id: str, reply_to: str, now: Now
    ) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _deliver_due(self, queue: str) -> bool:
        raise NotImplementedError

    # _intake.py

    @abc.abstractmethod
    def _on_intake(self, offset: int, body: bytes) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _on_marker(self, body: bytes) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _on_intake_gap(self, expected: int, found: int) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _folded(self, offset: int, client: str, seq: int) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _on_nudge(self, body: bytes) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _holding(self) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _sweep(self, client: str) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _wanted(self) -> None:
        raise NotImplementedError

    # _requests.py

    @abc.abstractmethod
    def _on_request(self, delivery: Delivery) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _take_parts(self, reply_to: str, parts: list[Any]) -> None:
        raise NotImplementedError

    # _waiting.py

    @abc.abstractmethod
    def _service(self, queue: str) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _park(self, queue: str, waiter: Parked) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _forget(self, queue: str, request_id: str) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _drop_ahead(self, store: Journal, waiter: Parked, now: Now) -> None:
        raise NotImplementedError
