"""One queue's records held in process memory, and every operation of the contract on
them: what ``memory://`` runs under its lock, and what the elected scheduler of a
replicated backend (``delayq.backends._replicated``) runs on its state.

A :class:`Records` is a dict of records plus two heaps with lazy deletion: ``(due_at,
seq, id)`` of scheduled messages and ``(lease_until, id, token)`` of leases. Every
change goes through :meth:`Records.write` and :meth:`Records.delete`, so that a
subclass sees each one (the replicated scheduler logs them). Nothing here locks, waits
or reads a clock: the caller passes its :class:`~delayq.durable.message.Now`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .._fork import new_id
from ..durable.inspection import count_due, select_peek
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
    matches_state,
    observe,
    resolve_due,
    settle,
)

__all__ = ["Records"]


class Records:
    """One queue's messages and the contract's operations on them (no lock held here:
    the caller serializes them)."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.due: list[tuple[int, int, str]] = []
        self.leases: list[tuple[int, str, str]] = []
        self.last_seq = 0

    def next_seq(self) -> int:
        self.last_seq += 1
        return self.last_seq

    def write(self, record: Record) -> None:
        self.records[record.id] = record
        if record.state is State.SCHEDULED:
            heapq.heappush(self.due, (record.due_at, record.seq, record.id))
        elif record.state is State.ACTIVE and record.lease_until is not None:
            heapq.heappush(self.leases, (record.lease_until, record.id, record.lease or ""))

    def delete(self, id: str) -> None:
        del self.records[id]

    def load(self, id: str, now_ms: int) -> Record | None:
        """The record with a lease expiry already applied (and written back)."""
        record = self.records.get(id)
        if record is not None:
            settled = settle(record, now_ms)
            if settled is not record:
                self.write(settled)
            record = settled
        return record

    def expire(self, now_ms: int) -> None:
        leases = self.leases
        while leases and leases[0][0] <= now_ms:
            _, id, _ = heapq.heappop(leases)
            self.load(id, now_ms)

    def _head_due(self) -> int | None:
        due, records = self.due, self.records
        while due:
            due_at, seq, id = due[0]
            record = records.get(id)
            if (
                record is not None
                and record.state is State.SCHEDULED
                and record.seq == seq
                and record.due_at == due_at
            ):
                return due_at
            heapq.heappop(due)
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
        first, each leased from ``at`` (None: from its own due time)."""
        claimed: list[Record] = []
        while len(claimed) < limit:
            head = self._head_due()
            if head is None or head > last:
                break
            _, _, id = heapq.heappop(self.due)
            since = Now(head, head) if at is None else at
            record = apply_reserve(self.records[id], since, lease_ms, new_id())
            self.write(record)
            claimed.append(record)
        self._compact()
        return claimed

    def _compact(self) -> None:
        live = len(self.records)
        if len(self.due) > 2 * live + 1024:
            self.due = [
                (r.due_at, r.seq, r.id) for r in self.records.values() if r.state is State.SCHEDULED
            ]
            heapq.heapify(self.due)
        if len(self.leases) > 2 * live + 1024:
            self.leases = [
                (r.lease_until, r.id, r.lease or "")
                for r in self.records.values()
                if r.state is State.ACTIVE and r.lease_until is not None
            ]
            heapq.heapify(self.leases)

    # -- the contract's operations: each returns its outcome; a raise changed nothing --

    def put(self, requests: Sequence[PutRequest], now: Now) -> list[int]:
        """The positions of the requests that kept a stored message."""
        staged: dict[str, Record | None] = {}
        kept: list[int] = []
        for position, request in enumerate(requests):
            current = staged[request.id] if request.id in staged else self.records.get(request.id)
            new = apply_put(current, request, now, self.next_seq())
            if new is None:
                kept.append(position)
            else:
                staged[request.id] = new
        for record in staged.values():
            if record is not None:
                self.write(record)
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
        return True

    def reschedule(self, id: str, now: Now, *, delay_ms: int | None, at_ms: int | None) -> bool:
        due_at = resolve_due(delay_ms, at_ms, now)
        record = apply_reschedule(self.load(id, now.floor), now, due_at, self.next_seq())
        if record is None:
            return False
        self.write(record)
        return True

    def get(self, id: str, now: Now) -> Record | None:
        record = self.records.get(id)
        return None if record is None else observe(record, now.floor, with_lease=False)

    def stats(self, now: Now) -> Stats:
        return compute_stats(self.records.values(), now.floor)

    def dead(self, limit: int, after_seq: int | None, now: Now) -> list[Record]:
        after = -1 if after_seq is None else after_seq
        self.expire(now.floor)
        dead = [r for r in self.records.values() if r.state is State.DEAD and r.seq > after]
        dead.sort(key=lambda r: r.seq)
        return dead[:limit]

    def retry_dead(self, ids: Sequence[str] | None, now: Now) -> int:
        self.expire(now.floor)
        if ids is None:  # every dead message, in the order they died (as dead() lists)
            dead = [r for r in self.records.values() if r.state is State.DEAD]
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

    def purge(self, state: State | None, now: Now) -> int:
        doomed = [r.id for r in self.records.values() if matches_state(r, state, now.floor)]
        for id in doomed:
            self.delete(id)
        if state is None:
            self.due.clear()
            self.leases.clear()
        return len(doomed)

    def peek(
        self, state: State | None, limit: int, after: Position | None, now: Now
    ) -> list[Record]:
        return select_peek(self.records.values(), state, now.floor, limit, after)

    def due_counts(self, horizon_ms: int, buckets: int, now: Now) -> tuple[int, list[int]]:
        scheduled = (r.due_at for r in self.records.values() if r.state is State.SCHEDULED)
        return now.floor, count_due(scheduled, now.floor, horizon_ms, buckets)
