"""One queue's records held in process memory, and every operation of the contract on
them: what ``memory://`` runs under its lock, and what the elected scheduler of a
replicated backend (``delayq.backends._replicated``) runs on its state.

A :class:`Records` is a dict of records plus heaps with lazy deletion: ``(due_at, seq,
id)`` of scheduled messages and ``(lease_until, id, token)`` of leases. A scheduled
message due after the earliest second that holds one waits instead in its second's
bucket (``later``: the record itself, or a list of them, under ``due_at >> 10``, ~1 s),
with no heap entry of its own (a tuple: 64 B a message at a million scheduled) until its
bucket is the earliest, when the bucket's records go to the heap. Every change goes
through :meth:`Records.write` and :meth:`Records.delete`, so that a subclass sees each
one (the replicated scheduler logs them). Nothing here locks, waits or reads a clock:
the caller passes its :class:`~delayq.durable.message.Now`.

:meth:`Records.stats` does not visit every record (at a million, that held the
scheduler 3.7 s a call, and a dashboard asks every few seconds): the stored states are
counted as records are written and deleted, and the scheduled messages are split at a
time, ``ripe_at``, that only moves forward: those due by then sit in a heap of their own
(``ripe``, counted), the later ones in ``due`` and the buckets. A stats call moves
``ripe_at`` up to its now, each message crossing once; the leases that expired but were
not yet settled are counted from the leases heap's part below now. Claims take the ripe
ones first: every ripe message is due before every one still in ``due``, and every one
in ``due`` before every one in a bucket.

Nor do :meth:`Records.peek` and :meth:`Records.dead`: a page is read by walking a heap
from its smallest entry (``ripe`` for ready, ``due`` for scheduled, the leases for
active, ``graves``, ``(seq, id)`` of the dead, for dead; the buckets after ``due``,
each sorted when the walk reaches it), merged with the expired leases not yet settled.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from .._fork import new_ids
from ..durable.inspection import bucket_width, count_due, select_peek
from ..durable.message import (
    Now,
    Position,
    PutRequest,
    Record,
    State,
    Stats,
    apply_ack,
    apply_ack_many,
    apply_extend,
    apply_nack,
    apply_put,
    apply_release,
    apply_reschedule,
    apply_reserve,
    apply_retry_dead,
    apply_unclaim,
    can_cancel,
    compute_stats,
    lag_of,
    matches_state,
    observe,
    resolve_due,
    settle,
)
from ._far import Far

__all__ = ["Records"]

_Entry = TypeVar("_Entry", bound=int | tuple[Any, ...])

#: The stored states, read once: an enum member read through its class costs a Python
#: call's worth of instructions, and :meth:`Records.write` reads them on every change.
_SCHEDULED, _ACTIVE, _DEAD = State.SCHEDULED, State.ACTIVE, State.DEAD
#: ``ripe_at`` before any stats call: no scheduled message is ripe.
_NEVER = -(1 << 62)
#: A bucket of ``later`` holds the scheduled messages due in 2**_SECOND ms (~1 s).
_SECOND = 10
#: ``far_from`` while nothing is far: no due time reaches it.
_FOREVER = 1 << 62
#: With a :class:`~._far.Far`: the messages waiting in buckets past which the latest
#: buckets go to it (down to half that), and a 200th of it is brought back at a time,
#: once fewer than a quarter wait or none is left here.
FAR_ABOVE = 50_000


class Records:
    """One queue's messages and the contract's operations on them (no lock held here:
    the caller serializes them)."""

    def __init__(
        self, far: Far | None = None, far_above: int | None = None, far_take: int | None = None
    ) -> None:
        self.records: dict[str, Record] = {}
        #: The scheduled messages at or after ``(far_from, far_seq)`` in ``(due_at, seq)``
        #: order are in ``far`` (not in ``records``): every one of them is claimed after
        #: every scheduled message here (a due time shared by many may be split).
        self.far = far
        self.far_from = _FOREVER
        self.far_seq = 0
        self._far_above = FAR_ABOVE if far_above is None else far_above
        self._far_take = max(self._far_above // 200, 1) if far_take is None else far_take
        self._sending = False  # moving records far, down to half of far_above
        #: The ids brought back from ``far`` while a walk of every record is under way
        #: (a checkpoint's: :meth:`watch`), None when none is.
        self.surfaced: set[str] | None = None
        #: Scheduled messages due after ``ripe_at``, and those due at or before it.
        self.due: list[tuple[int, int, str]] = []
        self.ripe: list[tuple[int, int, str]] = []
        self.ripe_at = _NEVER
        #: Scheduled messages due at or after ``opened_to`` (those before it are in the
        #: heaps): bucket number (``due_at >> _SECOND``) -> the record, or a list of the
        #: records written into it; the bucket numbers as a heap; the records listed
        #: (some may be stale: written again or deleted since).
        self.later: dict[int, Record | list[Record]] = {}
        self.buckets: list[int] = []
        self.opened_to = _NEVER
        self._waiting = 0
        self.leases: list[tuple[int, str, str]] = []
        #: ``(seq, id)`` of dead messages (the order ``dead()`` lists them in).
        self.graves: list[tuple[int, str]] = []
        self.last_seq = 0
        #: Stored records that are active, dead, and scheduled due by ``ripe_at`` (the
        #: rest of ``records`` is scheduled: a record is stored in no other state).
        self._active = self._dead = self._ripe_count = 0

    def next_seq(self) -> int:
        self.last_seq += 1
        return self.last_seq

    def write(self, record: Record, fresh: bool = False) -> Record | None:
        """Store ``record`` in place of the record of its id; the one it replaced.
        ``fresh``: the caller knows that ``far`` holds none of its id."""
        records = self.records
        old = records.get(record.id)
        if old is None and not fresh and self.far is not None and self.far.count:
            old = self.far.pop(record.id)
        # A scheduled record not yet ripe (a claim's, unless stats ran) counts nowhere.
        if old is not None and (old.state is not _SCHEDULED or old.due_at <= self.ripe_at):
            self._uncount(old)
        if (
            record.state is _SCHEDULED
            and record.due_at >= self.far_from
            and (record.due_at > self.far_from or record.seq >= self.far_seq)
        ):
            if old is not None:
                records.pop(record.id, None)
            self.far.add(record)  # type: ignore[union-attr]
            return old
        self._place(record)
        return old

    def _place(self, record: Record) -> None:
        """Hold ``record``, not far, in memory (counted)."""
        self.records[record.id] = record
        state = record.state
        if state is _SCHEDULED:
            due_at = record.due_at
            if due_at >= self.opened_to:  # in its second's bucket (inline: once a put)
                bucket = due_at >> _SECOND
                later = self.later
                held = later.get(bucket)
                if held is None:
                    later[bucket] = record
                    heapq.heappush(self.buckets, bucket)
                elif isinstance(held, list):
                    held.append(record)
                else:
                    later[bucket] = [held, record]
                self._waiting += 1
            elif due_at <= self.ripe_at:
                self._ripe_count += 1
                heapq.heappush(self.ripe, (due_at, record.seq, record.id))
            else:
                heapq.heappush(self.due, (due_at, record.seq, record.id))
        elif state is _ACTIVE:
            self._active += 1
            if record.lease_until is not None:
                heapq.heappush(self.leases, (record.lease_until, record.id, record.lease or ""))
        elif state is _DEAD:
            self._dead += 1
            heapq.heappush(self.graves, (record.seq, record.id))

    def _open(self) -> bool:
        """Move the earliest bucket's live records to ``due``, or when no bucket is
        left, the earliest of ``far`` here (False: nothing left to move)."""
        if not self.buckets:
            if self.far is None or not self.far.count:
                return False
            self._bring_back()
            return True
        bucket = heapq.heappop(self.buckets)
        waiting = _listed(self.later.pop(bucket))
        self._waiting -= len(waiting)
        self.opened_to = (bucket + 1) << _SECOND
        records, due = self.records, self.due
        entries = [(r.due_at, r.seq, r.id) for r in waiting if records.get(r.id) is r]
        if due:
            for entry in entries:
                heapq.heappush(due, entry)
        else:
            heapq.heapify(entries)
            self.due = entries
        return True

    def _uncount(self, record: Record) -> None:
        state = record.state
        if state is _SCHEDULED:
            if record.due_at <= self.ripe_at:
                self._ripe_count -= 1
        elif state is _ACTIVE:
            self._active -= 1
        elif state is _DEAD:
            self._dead -= 1

    def delete(self, id: str) -> Record:
        """Remove the stored record of ``id`` (a KeyError when there is none)."""
        old = self.records.pop(id, None)
        if old is None:
            old = None if self.far is None else self.far.pop(id)
            if old is None:
                raise KeyError(id)
            return old  # scheduled, not ripe: counted nowhere
        if old.state is _ACTIVE:  # an ack's, inline: counted as active only
            self._active -= 1
        else:
            self._uncount(old)
        return old

    def drop(self, id: str) -> Record | None:
        """Remove the record of ``id`` if there is one, as :meth:`delete` but unseen by
        a subclass (the replicated scheduler's replay of a logged delete)."""
        old = self.records.pop(id, None)
        if old is not None:
            self._uncount(old)
        elif self.far is not None and self.far.count:
            old = self.far.pop(id)
        return old

    def find(self, id: str) -> Record | None:
        """The stored record of ``id``, as stored (None: none)."""
        record = self.records.get(id)
        if record is None and self.far is not None and self.far.count:
            record = self.far.get(id)
        return record

    def __len__(self) -> int:
        """How many records are stored."""
        return len(self.records) + (0 if self.far is None else self.far.count)

    def _everything(self) -> Iterator[Record]:
        yield from self.records.values()
        if self.far is not None and self.far.count:
            yield from self.far

    def watch(self) -> None:
        """Note the ids :meth:`_bring_back` moves from ``far`` from now on, until
        :meth:`unwatch` (a walk of every record: memory's ids taken first, then
        ``far``'s by id, misses only those)."""
        self.surfaced = set()

    def unwatch(self) -> set[str]:
        surfaced, self.surfaced = self.surfaced or set(), None
        return surfaced

    def _send_far(self) -> None:
        """Move the latest waiting records to ``far``, a step at a time (the loop a
        scheduler serves from is held a few milliseconds, not for a whole backlog):
        ``far_take`` records, or as many as ``far_above`` is exceeded by, from the
        latest bucket down; the last bucket reached is split in ``(due_at, seq)`` order
        when only part of it is needed, and the earliest is never moved whole. The far
        boundary becomes the first record moved (a whole bucket's: its start; every
        bucket starts after ``opened_to``)."""
        far, later, records = self.far, self.later, self.records
        assert far is not None
        goal = max(self._far_take, self._waiting - self._far_above)
        buckets = sorted(later)
        moved = 0
        whole: int | None = None  # the earliest bucket moved whole
        while buckets and moved < goal and self._waiting > self._far_above // 2:
            bucket = buckets.pop()
            held = _listed(later[bucket])
            live = [r for r in held if records.get(r.id) is r]
            at = len(live) - (goal - moved)  # how many of it stay
            if not buckets and live:
                at = max(at, 1)
            if at > 0:
                live.sort(key=_due_order)
                later[bucket] = live[:at]
                self._waiting -= len(held) - len(live[:at])
                going = live[at:]
                start = (going[0].due_at, going[0].seq) if going else None
            else:
                del later[bucket]
                self._waiting -= len(held)
                whole = bucket
                going = live
                start = (bucket << _SECOND, 0)
            for record in going:
                del records[record.id]
                far.add(record)
            moved += len(going)
            if going and start is not None and start < (self.far_from, self.far_seq):
                self.far_from, self.far_seq = start
            if at > 0:
                break
        if whole is not None:
            self.buckets = [bucket for bucket in self.buckets if bucket < whole]
            heapq.heapify(self.buckets)
        if self._waiting <= self._far_above // 2:
            self._sending = False

    def _bring_back(self) -> None:
        """Move the earliest ``far_take`` records of ``far`` here."""
        far = self.far
        assert far is not None
        taken, left = far.take(self._far_take)
        self.far_from, self.far_seq = (_FOREVER, 0) if left is None else left
        place = self._place
        for record in taken:
            place(record)
        if self.surfaced is not None:
            self.surfaced.update(record.id for record in taken)

    def load(self, id: str, now_ms: int) -> Record | None:
        """The record with a lease expiry already applied (and written back)."""
        record = self.records.get(id)
        if record is None:
            return self.find(id)  # far, if anywhere: scheduled, nothing to settle
        settled = settle(record, now_ms)
        if settled is not record:
            self.write(settled)
        return settled

    def expire(self, now_ms: int) -> None:
        leases = self.leases
        while leases and leases[0][0] <= now_ms:
            _, id, _ = heapq.heappop(leases)
            self.load(id, now_ms)

    def _head_due(self) -> int | None:
        """The earliest due time of a scheduled message; the heap whose head it is
        (``ripe`` when that is not empty then, else ``due``) has it at its top."""
        records = self.records
        while True:
            heap = self.ripe or self.due
            if not heap:
                if self._open():
                    continue
                return None
            entry = heap[0]
            if _live(records, entry) is not None:
                return entry[0]
            heapq.heappop(heap)
        return None

    def _head_lease(self) -> int | None:
        leases, records = self.leases, self.records
        while leases:
            until, id, token = leases[0]
            record = records.get(id)
            if record is not None and record.lease == token and record.lease_until == until:
                return until
            heapq.heappop(leases)
        return None

    def next_event(self) -> int | None:
        """Epoch ms of the next due time or lease expiry (None: nothing pending)."""
        events = [t for t in (self._head_due(), self._head_lease()) if t is not None]
        return min(events) if events else None

    def next_wake(self, ahead_ms: int) -> int | None:
        """:meth:`next_event` for a consumer that fires ahead by ``ahead_ms``: the next
        due time less ``ahead_ms``, or the next lease expiry (None: nothing pending)."""
        head, lease = self._head_due(), self._head_lease()
        events = [t for t in (None if head is None else head - ahead_ms, lease) if t is not None]
        return min(events) if events else None

    def claim_soon(self, now: Now, limit: int, lease_ms: int, ahead_ms: int) -> list[Record]:
        """:meth:`claim`; when nothing is due, :meth:`claim_ahead` of what falls due
        within ``ahead_ms`` of ``now.floor`` (a reserve that fires ahead)."""
        claimed = self.claim(now, limit, lease_ms)
        if claimed or ahead_ms <= 0:
            return claimed
        return self.claim_ahead(now, now.floor + ahead_ms, limit, lease_ms)

    def next_due(self) -> int | None:
        """Epoch ms of the earliest due time of a scheduled message (None: none)."""
        return self._head_due()

    def claim_ahead(self, now: Now, horizon: int, limit: int, lease_ms: int) -> list[Record]:
        """Claim, before their time, the messages due at the earliest due time when that
        is after ``now`` and at most ``horizon`` (epoch ms): up to ``limit`` of them,
        each leased from its due time (``due_at + lease_ms``), so that a caller given
        it at its due time holds it for ``lease_ms``. For a caller that hands them on
        no earlier than their due time (the replicated scheduler's firing path); none
        when something is due already (:meth:`claim` takes those)."""
        self.expire(now.floor)
        head = self._head_due()
        if head is None or head <= now.floor or head > horizon:
            return []
        return self._take(limit, lease_ms, head, None)

    def claim(self, now: Now, limit: int, lease_ms: int) -> list[Record]:
        self.expire(now.floor)
        return self._take(limit, lease_ms, now.floor, now)

    def _take(self, limit: int, lease_ms: int, last: int, at: Now | None) -> list[Record]:
        """Claim up to ``limit`` scheduled records due at or before ``last``, earliest
        first, each leased from ``at`` (None: from its own due time, ``last``: a claim
        ahead takes one due time). One walk of the heads (a stale entry dropped where
        it is met, as :meth:`_head_due` drops it) collects them, then one draw of
        their lease tokens (:func:`~delayq._fork.new_ids`) and one write each."""
        records = self.records
        taken: list[Record] = []
        while len(taken) < limit:
            heap = self.ripe or self.due
            if not heap:
                if self._open():
                    continue
                break
            due_at, seq, id = heap[0]
            if due_at > last:  # every entry of this heap, and of those after it, is later
                break
            heapq.heappop(heap)
            record = records.get(id)
            if (
                record is not None
                and record.state is _SCHEDULED
                and record.seq == seq
                and record.due_at == due_at
                # A record written twice unchanged has two equal entries, popped one
                # after the other: it is taken once.
                and not (taken and taken[-1] is record)
            ):
                taken.append(record)
        claimed: list[Record] = []
        if taken:
            since = Now(last, last) if at is None else at
            write = self.write
            for record, token in zip(taken, new_ids(len(taken)), strict=True):
                active = apply_reserve(record, since, lease_ms, token)
                write(active)
                claimed.append(active)
        self.compact()
        return claimed

    def compact(self) -> None:
        """Rebuild the heaps and buckets whose stale entries (a bucket's: the record
        itself, payload and all) outnumber twice the records they may stand for: after
        a claim, a put, a cancel, a reschedule or a purge, and after each logged entry
        a hot standby folds (it never claims)."""
        live = len(self.records)
        if len(self.due) + len(self.ripe) + self._waiting > 2 * live + 1024:
            scheduled = [r for r in self.records.values() if r.state is _SCHEDULED]
            ripe_at, opened_to = self.ripe_at, self.opened_to
            self.ripe = [(r.due_at, r.seq, r.id) for r in scheduled if r.due_at <= ripe_at]
            self.due = [
                (r.due_at, r.seq, r.id) for r in scheduled if ripe_at < r.due_at < opened_to
            ]
            heapq.heapify(self.ripe)
            heapq.heapify(self.due)
            later: dict[int, Record | list[Record]] = {}
            waiting = [r for r in scheduled if r.due_at >= opened_to]
            for record in waiting:
                listed = later.setdefault(record.due_at >> _SECOND, [])
                assert isinstance(listed, list)
                listed.append(record)
            self.later, self.buckets, self._waiting = later, list(later), len(waiting)
            heapq.heapify(self.buckets)
        if len(self.leases) > 2 * live + 1024:
            self.leases = [
                (r.lease_until, r.id, r.lease or "")
                for r in self.records.values()
                if r.state is _ACTIVE and r.lease_until is not None
            ]
            heapq.heapify(self.leases)
        if len(self.graves) > 2 * self._dead + 1024:
            self.graves = [(r.seq, r.id) for r in self.records.values() if r.state is _DEAD]
            heapq.heapify(self.graves)
        if self.far is not None:
            if self._sending or self._waiting > self._far_above:
                self._sending = True
                self._send_far()
            elif self.far.count and self._waiting < self._far_above // 4:
                self._bring_back()

    # -- the contract's operations: each returns its outcome; a raise changed nothing --

    def put(self, requests: Sequence[PutRequest], now: Now) -> list[int]:
        """The positions of the requests that kept a stored message."""
        staged: dict[str, Record | None] = {}
        kept: list[int] = []
        # Each due time once: a put_many's records due at one time share its int (32 B
        # a record at a million scheduled).
        dues: dict[int, int] = {}
        records = self.records
        # The far records of these ids, looked up at once (a generated id is new).
        far: dict[str, Record] = {}
        if self.far is not None and self.far.count:
            far = self.far.get_many(
                [r.id for r in requests if not r.generated_id and r.id not in records]
            )
        for position, request in enumerate(requests):
            id = request.id
            current = staged[id] if id in staged else records.get(id) or far.get(id)
            due = resolve_due(request.delay_ms, request.at_ms, now)
            due = dues.setdefault(due, due)
            self.last_seq += 1  # next_seq, inline: a call a message
            new = apply_put(current, request, now, self.last_seq, due_at=due)
            if new is None:
                kept.append(position)
            else:
                staged[request.id] = new
        write = self.write
        for record in staged.values():
            if record is not None:
                # Fresh: nothing of its id is stored, in memory or far.
                write(record, record.id not in far)
        self.compact()
        return kept

    def ack(self, id: str, token: str, now: Now) -> None:
        apply_ack(self.load(id, now.floor), token, now)
        self.delete(id)

    def ack_many(self, items: Sequence[tuple[str, str]], now: Now) -> list[str]:
        acked, lost = apply_ack_many(self.records, items, now)
        for id in acked:
            self.delete(id)
        return lost

    def nack(
        self, id: str, token: str, now: Now, *, delay_ms: int, error: str | None, dead: bool
    ) -> State:
        record = apply_nack(
            self.load(id, now.floor),
            token,
            now,
            delay_ms=delay_ms,
            error=error,
            seq=self.next_seq(),
            dead=dead,
        )
        self.write(record)
        return record.state

    def release(self, id: str, token: str, now: Now) -> None:
        self.write(apply_release(self.load(id, now.floor), token, now))

    def unclaim(self, id: str, token: str) -> bool:
        """Undo the claim of ``id`` under ``token``, which no caller received
        (:func:`~delayq.durable.message.apply_unclaim`); False when the record no longer
        carries that lease."""
        record = apply_unclaim(self.records.get(id), token)
        if record is None:
            return False
        self.write(record)
        return True

    def extend(self, id: str, token: str, now: Now, lease_ms: int) -> int:
        record = apply_extend(self.load(id, now.floor), token, now, lease_ms)
        self.write(record)
        return record.lease_until or 0

    def cancel(self, id: str, now: Now) -> bool:
        if not can_cancel(self.load(id, now.floor), now):
            return False
        self.delete(id)
        self.compact()
        return True

    def reschedule(self, id: str, now: Now, *, delay_ms: int | None, at_ms: int | None) -> bool:
        due_at = resolve_due(delay_ms, at_ms, now)
        record = apply_reschedule(self.load(id, now.floor), now, due_at, self.next_seq())
        if record is None:
            return False
        self.write(record)
        self.compact()
        return True

    def get(self, id: str, now: Now) -> Record | None:
        record = self.find(id)
        return None if record is None else observe(record, now.floor, with_lease=False)

    def stats(self, now: Now) -> Stats:
        now_ms = now.floor
        if now_ms < self.ripe_at:  # a clock that went back: count them one by one
            return compute_stats(self._everything(), now_ms)
        self._ripen(now_ms)
        ready, active, dead = self._ripe_count, self._active, self._dead
        scheduled = len(self) - active - dead - ready
        head = self._head_due()
        oldest_ready = head if head is not None and head <= now_ms else None
        next_due = head
        for record in self._expired(now_ms):  # leases over, not yet settled
            active -= 1
            if record.state is _DEAD:
                dead += 1
                continue
            ready += 1  # due at its lease's expiry, which is past
            if oldest_ready is None or record.due_at < oldest_ready:
                oldest_ready = record.due_at
            if next_due is None or record.due_at < next_due:
                next_due = record.due_at
        return Stats(
            scheduled=scheduled,
            ready=ready,
            active=active,
            dead=dead,
            next_due_at=next_due,
            lag=lag_of(oldest_ready, now_ms),
        )

    def _ripen(self, now_ms: int) -> None:
        """Move ``ripe_at`` up to ``now_ms``: the scheduled messages due by then go from
        ``due`` (their buckets opened) to ``ripe``, each counted once (a record written
        twice unchanged has two entries, popped together)."""
        self._surface(now_ms)
        while self.buckets and self.buckets[0] << _SECOND <= now_ms:
            self._open()
        self.opened_to = max(self.opened_to, now_ms + 1)
        due, records = self.due, self.records
        crossed: set[str] = set()
        while due and due[0][0] <= now_ms:
            entry = heapq.heappop(due)
            id = entry[2]
            if id not in crossed and _live(records, entry) is not None:
                crossed.add(id)
                heapq.heappush(self.ripe, entry)
        self._ripe_count += len(crossed)
        self.ripe_at = now_ms

    def _surface(self, now_ms: int) -> None:
        """Bring back from ``far`` every record due by ``now_ms``."""
        while self.far is not None and self.far.count and self.far_from <= now_ms:
            self._bring_back()

    def _expired(self, now_ms: int) -> list[Record]:
        """The records whose lease has expired by ``now_ms`` but which are still stored
        as active, as :func:`settle` makes them (nothing is written): the part of the
        leases heap at or below ``now_ms``, found by walking only that part."""
        leases, records = self.leases, self.records
        found: dict[str, Record] = {}
        stack = [0] if leases else []
        while stack:
            at = stack.pop()
            until, id, token = leases[at]
            if until > now_ms:
                continue  # the rest of this branch is later still
            record = records.get(id)
            if record is not None and record.lease == token and record.lease_until == until:
                found[id] = settle(record, now_ms)
            stack.extend(child for child in (2 * at + 1, 2 * at + 2) if child < len(leases))
        return list(found.values())

    def dead(self, limit: int, after_seq: int | None, now: Now) -> list[Record]:
        after = -1 if after_seq is None else after_seq
        self.expire(now.floor)
        dead: list[Record] = []
        for record in self._walk_graves(after):
            if len(dead) == limit:
                break
            dead.append(record)
        return dead

    def retry_dead(self, ids: Sequence[str] | None, now: Now) -> int:
        self.expire(now.floor)
        if ids is None:  # every dead message, in the order they died (as dead() lists)
            dead = [r for r in self.records.values() if r.state is _DEAD]
            chosen = [r.id for r in sorted(dead, key=lambda r: r.seq)]
        else:
            chosen = list(dict.fromkeys(ids))
        revived = 0
        for id in chosen:
            record = apply_retry_dead(self.records.get(id), now, self.next_seq())
            if record is not None:
                self.write(record)
                revived += 1
        return revived

    def purge(self, state: State | None, now: Now, through: int | None = None) -> int:
        """Remove the records in ``state`` (None: every one), those of a sequence number
        up to ``through`` only when given (a purge resumed: what it had not taken);
        how many."""
        self._surface(now.floor)
        doomed = [
            r.id
            for r in self.records.values()
            if matches_state(r, state, now.floor) and (through is None or r.seq <= through)
        ]
        for id in doomed:
            self.delete(id)
        purged = len(doomed)
        if self.far is not None and self.far.count and state in (None, _SCHEDULED):
            purged += self._purge_far(through)  # each far one is scheduled, not due
        if state is None and through is None:
            self.due.clear()
            self.ripe.clear()
            self.later.clear()
            self.buckets.clear()
            self._waiting = 0
            self.leases.clear()
            self.graves.clear()
        self.compact()
        return purged

    def _purge_far(self, through: int | None) -> int:
        """Take out every far record (up to ``through``: those newer stay); how many."""
        far = self.far
        assert far is not None
        kept = far.take_newer(through) if through is not None and through < self.last_seq else []
        purged = far.count
        self._set_aside(far)
        self.far_from, self.far_seq = _FOREVER, 0
        for record in kept:
            Records.write(self, record, True)  # unchanged: back in memory
        if self.surfaced is not None:  # a walk of every record would miss them
            self.surfaced.update(record.id for record in kept)
        return purged

    def _set_aside(self, far: Far) -> None:
        """Let go of ``far``'s records (a purge took them all): dropped with its
        database here; a subclass that logs each deletion keeps them to log."""
        far.close()

    def peek(
        self, state: State | None, limit: int, after: Position | None, now: Now
    ) -> list[Record]:
        """:func:`~delayq.durable.inspection.select_peek` of the records, found by
        walking the heaps from their smallest entry rather than visiting every record:
        its cost follows the page and what lies before ``after``, not the queue."""
        now_ms = now.floor
        if now_ms < self.ripe_at or limit <= 0:  # a clock that went back
            return select_peek(self._everything(), state, now_ms, limit, after)
        self._ripen(now_ms)  # ripe: due by now (ready); due: later (scheduled)
        if state is _ACTIVE:
            found = self._peek_active(now_ms, limit, after)
        elif state is _DEAD:
            found = self._peek_dead(now_ms, limit, after)
        else:
            found = []
            if state is not _SCHEDULED:
                found = self._peek_waiting(
                    _ascending(self.ripe), now_ms, limit, after, expired=True
                )
            if state is not State.READY and len(found) < limit:
                found += self._peek_waiting(
                    self._scheduled(after), now_ms, limit - len(found), after
                )
                if self.far is not None and len(found) < limit:  # each later than these
                    found += self.far.after(after, limit - len(found))
        return [observe(record, now_ms, with_lease=False) for record in found]

    def _scheduled(self, after: Position | None) -> Iterator[tuple[int, int, str]]:
        """``(due_at, seq, id)`` of the scheduled records not yet ripe, ascending (some
        stale): ``due``'s, then each bucket's sorted, those wholly before ``after``
        skipped."""
        yield from _ascending(self.due)
        records = self.records
        for bucket in _ascending(self.buckets):
            if after is not None and (bucket + 1) << _SECOND <= after[0]:
                continue
            waiting = _listed(self.later[bucket])
            yield from sorted((r.due_at, r.seq, r.id) for r in waiting if records.get(r.id) is r)

    def _peek_waiting(
        self,
        entries: Iterator[tuple[int, int, str]],
        now_ms: int,
        limit: int,
        after: Position | None,
        *,
        expired: bool = False,
    ) -> list[Record]:
        """The first ``limit`` scheduled records of ``entries`` (ascending) by ``(due_at,
        seq)`` after ``after``; with ``expired``, merged with the leases over by ``now_ms``
        but not yet settled (ready again, due at their lease's expiry)."""
        records = self.records
        extra: list[tuple[int, int, Record]] = []
        if expired:
            extra = [
                (r.due_at, r.seq, r)
                for r in self._expired(now_ms)
                if r.state is _SCHEDULED and (after is None or (r.due_at, r.seq) > after)
            ]
            extra.sort(key=lambda item: item[:2])
        found: list[tuple[int, int, Record]] = []
        seen: set[str] = set()
        for due_at, seq, id in entries:
            if len(found) >= limit:
                break
            if after is not None and (due_at, seq) <= after:
                continue
            record = _live(records, (due_at, seq, id))
            if record is None or id in seen:
                continue
            seen.add(id)
            found.append((due_at, seq, record))
        merged = sorted(found + extra, key=lambda item: item[:2])
        return [record for _, _, record in merged[:limit]]

    def _peek_active(self, now_ms: int, limit: int, after: Position | None) -> list[Record]:
        """Active records by ``(lease_until, seq)``: the leases heap is ordered by
        ``(lease_until, id)``, so the walk goes on to the end of the last lease time it
        took, and those are put in ``seq`` order."""
        records = self.records
        found: list[Record] = []
        seen: set[str] = set()
        for until, id, token in _ascending(self.leases):
            if len(found) >= limit and until > found[-1].lease_until:  # type: ignore[operator]
                break
            if until <= now_ms:
                continue  # expired: ready or dead, not active
            record = records.get(id)
            if record is None or record.lease != token or record.lease_until != until:
                continue
            if id in seen or (after is not None and (until, record.seq) <= after):
                continue
            seen.add(id)
            found.append(record)
        found.sort(key=lambda r: (r.lease_until or 0, r.seq))
        return found[:limit]

    def _peek_dead(self, now_ms: int, limit: int, after: Position | None) -> list[Record]:
        """Dead records by ``seq``: the stored ones merged with the leases over by
        ``now_ms`` that settle dead."""
        after_seq = -1 if after is None else after[0]
        extra = [r for r in self._expired(now_ms) if r.state is _DEAD and r.seq > after_seq]
        found: list[Record] = []
        for record in self._walk_graves(after_seq):
            if len(found) >= limit:
                break
            found.append(record)
        return sorted(found + extra, key=lambda r: r.seq)[:limit]

    def _walk_graves(self, after_seq: int) -> Iterator[Record]:
        """The stored dead records by ``seq``, those after ``after_seq``."""
        records = self.records
        seen: set[str] = set()
        for seq, id in _ascending(self.graves):
            if seq <= after_seq:
                continue
            record = records.get(id)
            if record is None or record.state is not _DEAD or record.seq != seq or id in seen:
                continue
            seen.add(id)
            yield record

    def due_counts(self, horizon_ms: int, buckets: int, now: Now) -> tuple[int, list[int]]:
        scheduled = (r.due_at for r in self.records.values() if r.state is _SCHEDULED)
        counts = count_due(scheduled, now.floor, horizon_ms, buckets)
        if self.far is not None and self.far.count:  # counted by SQLite, nothing read
            width = bucket_width(horizon_ms, buckets)
            for index, count in self.far.due_counts(now.floor, width, buckets):
                counts[index] += count
        return now.floor, counts


def _live(records: dict[str, Record], entry: tuple[int, int, str]) -> Record | None:
    """The scheduled record a due heap's ``entry`` stands for; None when the entry is
    stale (the record went, changed state, or was written again since). A claim's walk
    (``Records._take``) keeps this test inline: a call there costs every message."""
    due_at, seq, id = entry
    record = records.get(id)
    if (
        record is None
        or record.state is not _SCHEDULED
        or record.seq != seq
        or record.due_at != due_at
    ):
        return None
    return record


def _due_order(record: Record) -> tuple[int, int]:
    return record.due_at, record.seq


def _listed(held: Record | list[Record]) -> list[Record]:
    """The records a bucket of ``later`` holds."""
    return held if isinstance(held, list) else [held]


def _ascending(heap: list[_Entry]) -> Iterator[_Entry]:
    """The entries of ``heap`` from the smallest up, without changing it: a walk of its
    tree that holds the children of what it has yielded (each step costs the log of
    how far it went, not of the heap)."""
    if not heap:
        return
    frontier: list[tuple[_Entry, int]] = [(heap[0], 0)]
    size = len(heap)
    while frontier:
        entry, at = heapq.heappop(frontier)
        yield entry
        child = 2 * at + 1
        if child < size:
            heapq.heappush(frontier, (heap[child], child))
            if child + 1 < size:
                heapq.heappush(frontier, (heap[child + 1], child + 1))
