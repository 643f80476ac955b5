"""The store behind ``memory://``: one queue's records, its due and lease heaps, the
waiting of its consumers, and the process-wide registry of stores by ``(namespace,
queue)``. Every method of :class:`Store` runs with its ``lock`` held."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import uuid

from ..._waiters import LoopSleeper, resolve
from ...durable.message import Now, Record, State, apply_reserve, settle

__all__ = ["Store", "shared_store", "stores_of"]


class Store:
    """One queue's messages; every method runs with ``lock`` held."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.records: dict[str, Record] = {}
        self.due: list[tuple[int, int, str]] = []
        self.leases: list[tuple[int, str, str]] = []
        self.seq = itertools.count(1)
        self.sleepers: set[LoopSleeper] = set()
        self.thread_waiters = 0

    def wake_all(self) -> None:
        """Wake every consumer parked in :meth:`wait` or :meth:`wait_async`."""
        if self.thread_waiters:
            self.cond.notify_all()
        for sleeper in self.sleepers:
            sleeper.wake()

    # The one thing the two faces do differently, as Condition.wait does it: called with
    # the lock held, let go of it until woken (or ``seconds`` passed; None: no limit),
    # then hold it again. The waiter is registered before the lock is let go, so a
    # wake_all in between is never lost.
    def wait(self, seconds: float | None) -> None:
        """Park the calling thread (see above)."""
        self.thread_waiters += 1
        try:
            self.cond.wait(seconds)
        finally:
            self.thread_waiters -= 1

    async def wait_async(self, seconds: float | None) -> None:
        """Park the calling task on a future of its loop (see above); cancelling it
        just ends the wait (the lock is held again when the cancellation goes on)."""
        loop = asyncio.get_running_loop()
        sleeper = LoopSleeper(loop)
        self.sleepers.add(sleeper)
        timer = None if seconds is None else loop.call_later(seconds, resolve, sleeper.future)
        self.lock.release()
        try:
            await sleeper.future
        finally:
            if timer is not None:
                timer.cancel()
            self.lock.acquire()
            self.sleepers.discard(sleeper)

    def write(self, record: Record) -> None:
        self.records[record.id] = record
        if record.state is State.SCHEDULED:
            heapq.heappush(self.due, (record.due_at, record.seq, record.id))
        elif record.state is State.ACTIVE and record.lease_until is not None:
            heapq.heappush(self.leases, (record.lease_until, record.id, record.lease or ""))

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

    def claim(self, now: Now, limit: int, lease_ms: int) -> list[Record]:
        self.expire(now.floor)
        claimed: list[Record] = []
        while len(claimed) < limit:
            head = self._head_due()
            if head is None or head > now.floor:
                break
            _, _, id = heapq.heappop(self.due)
            record = apply_reserve(self.records[id], now, lease_ms, uuid.uuid4().hex)
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


_STORES: dict[tuple[str, str], Store] = {}
_STORES_LOCK = threading.Lock()


def shared_store(namespace: str, queue: str) -> Store:
    """The process-wide store of ``queue`` in ``namespace`` (made on first use)."""
    key = (namespace, queue)
    store = _STORES.get(key)
    if store is None:
        with _STORES_LOCK:
            store = _STORES.setdefault(key, Store())
    return store


def stores_of(namespace: str) -> list[tuple[str, Store]]:
    """``(queue, store)`` of every store of ``namespace`` made so far."""
    with _STORES_LOCK:
        return [(q, store) for (ns, q), store in _STORES.items() if ns == namespace]
