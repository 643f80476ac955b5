"""``memory://``: the durable contract in one process, for tests and single-process apps.

Every ``memory://`` queue of one name shares one store in the process (``memory://ns``
gives a separate namespace ``ns``). A store is a dict of records plus two heaps with
lazy deletion: ``(due_at, seq, id)`` of scheduled messages and ``(lease_until, id,
token)`` of leases. Each operation holds the store's lock once and runs the pure
transitions of :mod:`delayq.durable.message`, so it is atomic.

Waiting ``reserve`` calls sleep until the earliest due time or lease expiry; puts,
nacks, releases, reschedules and ``retry_dead`` wake them at once (threads through a
condition, asyncio tasks through their loop), so nothing polls.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from .._clock import SYSTEM_CLOCK, Clock
from .._constants import INF
from .._waiters import LoopSleeper, resolve
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
    apply_retry_dead,
    can_cancel,
    compute_stats,
    matches_state,
    observe,
    resolve_due,
)
from ..errors import QueueClosed, UnsupportedURL
from ._memory_store import Store, shared_store, stores_of

__all__ = ["AsyncMemoryBackend", "MemoryBackend", "open_async_backend", "open_backend"]

#: No error of memory:// means "the backend does not answer" (see delayq.durable.registry).
OUTAGE_ERRORS: tuple[type[Exception], ...] = ()

T = TypeVar("T")


def _namespace(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme.lower() != "memory" or parts.path not in ("", "/") or parts.query:
        raise UnsupportedURL(f"a memory URL is memory:// or memory://<namespace>, not {url!r}")
    return parts.netloc


class _Core:
    """What both faces share: the namespace, the clock, and every non-waiting operation."""

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

    def _run(self, queue: str, step: Callable[[Store, Now], T]) -> T:
        store = self._store(queue)
        with store.lock:
            return step(store, self._now())

    def _wake_used(self) -> None:
        with self._used_lock:
            stores = list(self._used)
        for store in stores:
            with store.lock:
                store.wake_all()

    def _on_clock_jump(self) -> None:
        self._wake_used()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._clock.unsubscribe(self._on_clock_jump)
        self._wake_used()

    # -- the operations that never wait ------------------------------------------
    def _put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        def step(store: Store, now: Now) -> list[int]:
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

        return self._run(queue, step)

    def _ack(self, queue: str, id: str, token: str) -> None:
        def step(store: Store, now: Now) -> None:
            apply_ack(store.load(id, now.floor), token, now)
            del store.records[id]

        self._run(queue, step)

    def _ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        def step(store: Store, now: Now) -> list[str]:
            acked, lost = apply_ack_many(store.records, items, now)
            for id in acked:
                del store.records[id]
            return lost

        return self._run(queue, step)

    def _nack(
        self, queue: str, id: str, token: str, delay_ms: int, error: str | None, *, dead: bool
    ) -> State:
        def step(store: Store, now: Now) -> State:
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

        return self._run(queue, step)

    def _release(self, queue: str, id: str, token: str) -> None:
        def step(store: Store, now: Now) -> None:
            store.write(apply_release(store.load(id, now.floor), token, now))
            store.wake_all()

        self._run(queue, step)

    def _extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        def step(store: Store, now: Now) -> int:
            record = apply_extend(store.load(id, now.floor), token, now, lease_ms)
            store.write(record)
            return record.lease_until or 0

        return self._run(queue, step)

    def _cancel(self, queue: str, id: str) -> bool:
        def step(store: Store, now: Now) -> bool:
            if not can_cancel(store.load(id, now.floor), now):
                return False
            del store.records[id]
            return True

        return self._run(queue, step)

    def _reschedule(self, queue: str, id: str, delay_ms: int | None, at_ms: int | None) -> bool:
        def step(store: Store, now: Now) -> bool:
            due_at = resolve_due(delay_ms, at_ms, now)
            record = apply_reschedule(store.load(id, now.floor), now, due_at, next(store.seq))
            if record is None:
                return False
            store.write(record)
            store.wake_all()
            return True

        return self._run(queue, step)

    def _get(self, queue: str, id: str) -> Record | None:
        def step(store: Store, now: Now) -> Record | None:
            record = store.records.get(id)
            return None if record is None else observe(record, now.floor, with_lease=False)

        return self._run(queue, step)

    def _stats(self, queue: str) -> Stats:
        return self._run(queue, lambda store, now: compute_stats(store.records.values(), now.floor))

    def _dead(self, queue: str, limit: int, after_seq: int | None) -> list[Record]:
        after = -1 if after_seq is None else after_seq

        def step(store: Store, now: Now) -> list[Record]:
            store.expire(now.floor)
            dead = [r for r in store.records.values() if r.state is State.DEAD and r.seq > after]
            dead.sort(key=lambda r: r.seq)
            return dead[:limit]

        return self._run(queue, step)

    def _retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        def step(store: Store, now: Now) -> int:
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

        return self._run(queue, step)

    def _purge(self, queue: str, state: State | None) -> int:
        def step(store: Store, now: Now) -> int:
            doomed = [r.id for r in store.records.values() if matches_state(r, state, now.floor)]
            for id in doomed:
                del store.records[id]
            if state is None:
                store.due.clear()
                store.leases.clear()
            return len(doomed)

        return self._run(queue, step)

    def _queues(self) -> list[str]:
        if self._closed:
            raise QueueClosed("the queue is closed")
        mine = stores_of(self._namespace)
        return sorted(name for name, store in mine if store.records)

    def _peek(
        self, queue: str, state: State | None, limit: int, after: Position | None
    ) -> list[Record]:
        return self._run(
            queue,
            lambda store, now: select_peek(store.records.values(), state, now.floor, limit, after),
        )

    def _due_counts(self, queue: str, horizon_ms: int, buckets: int) -> tuple[int, list[int]]:
        def step(store: Store, now: Now) -> tuple[int, list[int]]:
            scheduled = (r.due_at for r in store.records.values() if r.state is State.SCHEDULED)
            return now.floor, count_due(scheduled, now.floor, horizon_ms, buckets)

        return self._run(queue, step)

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


class MemoryBackend(_Core):
    """The sync face of ``memory://`` (see :class:`~delayq.durable.backend.Backend`)."""

    def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        return self._put(queue, requests)

    def reserve(self, queue: str, *, limit: int, lease_ms: int, wait: float | None) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        store = self._store(queue)
        give_up = INF if wait is None else self._clock.monotonic() + wait
        with store.lock:
            store.thread_waiters += 1
            try:
                while True:
                    if self._closed:
                        raise QueueClosed("the queue was closed")
                    now = self._now()
                    claimed = store.claim(now, limit, lease_ms)
                    if claimed or self._clock.monotonic() >= give_up:
                        return claimed
                    store.cond.wait(self._sleep_for(store, give_up))
            finally:
                store.thread_waiters -= 1

    def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        self._ack(queue, id, token)

    def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`."""
        return self._ack_many(queue, items)

    def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`Backend.nack <delayq.durable.backend.Backend.nack>`."""
        return self._nack(queue, id, token, delay_ms, error, dead=dead)

    def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        self._release(queue, id, token)

    def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return self._extend(queue, id, token, lease_ms)

    def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return self._cancel(queue, id)

    def reschedule(self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        return self._reschedule(queue, id, delay_ms, at_ms)

    def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return self._get(queue, id)

    def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return self._stats(queue)

    def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>`."""
        return self._dead(queue, limit, after_seq)

    def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        return self._retry_dead(queue, ids)

    def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return self._purge(queue, state)

    def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        return self._queues()

    def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        return self._peek(queue, state, limit, after)

    def due_counts(self, queue: str, *, horizon_ms: int, buckets: int) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        return self._due_counts(queue, horizon_ms, buckets)

    def close(self) -> None:
        """Wake this backend's waiting reserves (they raise QueueClosed); the shared
        store and its messages stay for other queues of the process."""
        self._close()


class AsyncMemoryBackend(_Core):
    """The asyncio face of ``memory://``: the same store; only a waiting ``reserve``
    awaits, every other operation holds the store lock for microseconds."""

    async def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        return self._put(queue, requests)

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        loop = asyncio.get_running_loop()
        store = self._store(queue)
        give_up = INF if wait is None else self._clock.monotonic() + wait
        while True:
            with store.lock:
                if self._closed:
                    raise QueueClosed("the queue was closed")
                now = self._now()
                claimed = store.claim(now, limit, lease_ms)
                if claimed or self._clock.monotonic() >= give_up:
                    return claimed
                sleeper = LoopSleeper(loop)
                store.sleepers.add(sleeper)
                seconds = self._sleep_for(store, give_up)
            timer = None if seconds is None else loop.call_later(seconds, resolve, sleeper.future)
            try:
                await sleeper.future
            finally:
                if timer is not None:
                    timer.cancel()
                with store.lock:
                    store.sleepers.discard(sleeper)

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        self._ack(queue, id, token)

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`."""
        return self._ack_many(queue, items)

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
        """See :meth:`Backend.nack <delayq.durable.backend.Backend.nack>`."""
        return self._nack(queue, id, token, delay_ms, error, dead=dead)

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        self._release(queue, id, token)

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return self._extend(queue, id, token, lease_ms)

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return self._cancel(queue, id)

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        return self._reschedule(queue, id, delay_ms, at_ms)

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return self._get(queue, id)

    async def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return self._stats(queue)

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>`."""
        return self._dead(queue, limit, after_seq)

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        return self._retry_dead(queue, ids)

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return self._purge(queue, state)

    async def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        return self._queues()

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        return self._peek(queue, state, limit, after)

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        return self._due_counts(queue, horizon_ms, buckets)

    async def close(self) -> None:
        """See :meth:`MemoryBackend.close`."""
        self._close()


def open_backend(url: str, **options: Any) -> MemoryBackend:
    """Open the sync face of ``memory://`` (option: ``clock=`` a :class:`delayq.Clock`)."""
    return MemoryBackend(url, **options)


def open_async_backend(url: str, **options: Any) -> AsyncMemoryBackend:
    """Open the async face of ``memory://`` (option: ``clock=`` a :class:`delayq.Clock`)."""
    return AsyncMemoryBackend(url, **options)
