"""The ``memory://`` backend, written once as its asyncio face: the source of the
generated sync face (:mod:`delayq.backends.memory._sync.backend`).

Each operation holds its store's lock once and runs the pure transitions of
:mod:`delayq.durable.message`. Only a waiting ``reserve`` differs between the faces: it
parks through the store's pair of waits (:class:`~delayq.backends.memory._store.Store`:
a task on a future of its loop, a thread on the store's condition).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ...._clock import SYSTEM_CLOCK, Clock
from ...._constants import INF
from ....durable.inspection import count_due, select_peek
from ....durable.message import (
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
    apply_retry_dead,
    can_cancel,
    compute_stats,
    matches_state,
    observe,
    resolve_due,
)
from ....errors import QueueClosed, UnsupportedURL
from .._store import Store, shared_store, stores_of

__all__ = ["AsyncMemoryBackend", "open_async_backend"]


def _namespace(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme.lower() != "memory" or parts.path not in ("", "/") or parts.query:
        raise UnsupportedURL(f"a memory URL is memory:// or memory://<namespace>, not {url!r}")
    return parts.netloc


class AsyncMemoryBackend:
    """A face of ``memory://`` (see :class:`~delayq.durable.backend.AsyncBackend`): every
    operation holds the store lock for microseconds; only a waiting ``reserve`` parks."""

    def __init__(self, url: str, clock: Clock | None = None) -> None:
        if clock is None:
            clock = SYSTEM_CLOCK
        elif not isinstance(clock, Clock):
            raise TypeError(f"clock must implement delayq.Clock, not {type(clock).__name__}")
        self._namespace = _namespace(url)
        self._clock = clock
        self._closed = False
        self._used: set[Store] = set()
        self._used_lock = threading.Lock()
        clock.subscribe(self._on_clock_jump)

    def _now(self) -> Now:
        return Now.of_seconds(self._clock.time())

    def _store(self, queue: str) -> Store:
        if self._closed:
            raise QueueClosed("the queue is closed")
        store = shared_store(self._namespace, queue)
        if store not in self._used:
            with self._used_lock:
                self._used.add(store)
        return store

    def _wake_used(self) -> None:
        with self._used_lock:
            stores = list(self._used)
        for store in stores:
            with store.lock:
                store.wake_all()

    def _on_clock_jump(self) -> None:
        self._wake_used()

    def _sleep_for(self, store: Store, give_up: float) -> float | None:
        """Real seconds to sleep (None: until woken); lock held."""
        until = store.next_event()
        # Wake at the due millisecond itself (plus a hair, so the floored now has
        # reached it), not a whole millisecond after now_ms.
        seconds = INF if until is None else max(until / 1000.0 - self._clock.time(), 0.0) + 5e-5
        seconds = min(seconds, give_up - self._clock.monotonic())
        if seconds == INF:
            return None
        return self._clock.wait_timeout(max(seconds, 0.0))

    async def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.put`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            staged: dict[str, Record | None] = {}
            kept: list[int] = []
            for position, request in enumerate(requests):
                current = (
                    staged[request.id] if request.id in staged else store.records.get(request.id)
                )
                new = apply_put(current, request, now, next(store.seq))
                if new is None:
                    kept.append(position)
                else:
                    staged[request.id] = new
            for record in staged.values():
                if record is not None:
                    store.write(record)
            if staged:
                store.wake_all()
            return kept

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reserve`."""
        store = self._store(queue)
        give_up = INF if wait is None else self._clock.monotonic() + wait
        with store.lock:
            while True:
                if self._closed:
                    raise QueueClosed("the queue was closed")
                claimed = store.claim(self._now(), limit, lease_ms)
                if claimed or self._clock.monotonic() >= give_up:
                    return claimed
                # Lets go of the lock while it waits, as Condition.wait does.
                await store.wait_async(self._sleep_for(store, give_up))

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            apply_ack(store.load(id, now.floor), token, now)
            del store.records[id]

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack_many`."""
        store = self._store(queue)
        with store.lock:
            acked, lost = apply_ack_many(store.records, items, self._now())
            for id in acked:
                del store.records[id]
            return lost

    async def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`~delayq.durable.backend.AsyncBackend.nack`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            record = apply_nack(
                store.load(id, now.floor),
                token,
                now,
                delay_ms=delay_ms,
                error=error,
                seq=next(store.seq),
                dead=dead,
            )
            store.write(record)
            if record.state is State.SCHEDULED:
                store.wake_all()
            return record.state

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.release`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            store.write(apply_release(store.load(id, now.floor), token, now))
            store.wake_all()

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.extend`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            record = apply_extend(store.load(id, now.floor), token, now, lease_ms)
            store.write(record)
            return record.lease_until or 0

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.cancel`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            if not can_cancel(store.load(id, now.floor), now):
                return False
            del store.records[id]
            return True

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reschedule`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            due_at = resolve_due(delay_ms, at_ms, now)
            record = apply_reschedule(store.load(id, now.floor), now, due_at, next(store.seq))
            if record is None:
                return False
            store.write(record)
            store.wake_all()
            return True

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.get`."""
        store = self._store(queue)
        with store.lock:
            record = store.records.get(id)
            if record is None:
                return None
            return observe(record, self._now().floor, with_lease=False)

    async def stats(self, queue: str) -> Stats:
        """See :meth:`~delayq.durable.backend.AsyncBackend.stats`."""
        store = self._store(queue)
        with store.lock:
            return compute_stats(store.records.values(), self._now().floor)

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.dead`."""
        after = -1 if after_seq is None else after_seq
        store = self._store(queue)
        with store.lock:
            store.expire(self._now().floor)
            dead = [r for r in store.records.values() if r.state is State.DEAD and r.seq > after]
            dead.sort(key=lambda r: r.seq)
            return dead[:limit]

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.retry_dead`."""
        store = self._store(queue)
        with store.lock:
            now = self._now()
            store.expire(now.floor)
            if ids is None:  # every dead message, in the order they died (as dead() lists)
                dead = [r for r in store.records.values() if r.state is State.DEAD]
                chosen = [r.id for r in sorted(dead, key=lambda r: r.seq)]
            else:
                chosen = list(dict.fromkeys(ids))
            revived = 0
            for id in chosen:
                record = apply_retry_dead(store.records.get(id), now, next(store.seq))
                if record is not None:
                    store.write(record)
                    revived += 1
            if revived:
                store.wake_all()
            return revived

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.purge`."""
        store = self._store(queue)
        with store.lock:
            floor = self._now().floor
            doomed = [r.id for r in store.records.values() if matches_state(r, state, floor)]
            for id in doomed:
                del store.records[id]
            if state is None:
                store.due.clear()
                store.leases.clear()
            return len(doomed)

    async def queues(self) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.queues`."""
        if self._closed:
            raise QueueClosed("the queue is closed")
        mine = stores_of(self._namespace)
        return sorted(name for name, store in mine if store.records)

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.peek`."""
        store = self._store(queue)
        with store.lock:
            return select_peek(store.records.values(), state, self._now().floor, limit, after)

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.due_counts`."""
        store = self._store(queue)
        with store.lock:
            floor = self._now().floor
            scheduled = (r.due_at for r in store.records.values() if r.state is State.SCHEDULED)
            return floor, count_due(scheduled, floor, horizon_ms, buckets)

    async def close(self) -> None:
        """Wake this backend's waiting reserves (they raise QueueClosed); the shared
        store and its messages stay for other queues of the process."""
        if self._closed:
            return
        self._closed = True
        self._clock.unsubscribe(self._on_clock_jump)
        self._wake_used()


def open_async_backend(url: str, **options: Any) -> AsyncMemoryBackend:
    """Open this face of ``memory://`` (option: ``clock=`` a :class:`delayq.Clock`)."""
    return AsyncMemoryBackend(url, **options)
