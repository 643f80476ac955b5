"""The ``memory://`` backend, written once as its asyncio face: the source of the
generated sync face (:mod:`delayq.backends.memory._sync.backend`).

Each operation holds its store's lock once and runs the pure transitions of
:mod:`delayq.durable.message`. Only a waiting ``reserve`` differs between the faces: it
parks through the store's pair of waits (:class:`~delayq.backends.memory._store.Store`:
a task on a future of its loop, a thread on the store's condition).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from math import inf
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ...._clock import SYSTEM_CLOCK, Clock
from ....durable.descriptor import check_url_options
from ....durable.message import Claimed, Now, Position, PutRequest, Record, State, Stats
from ....durable.reserves import AsyncReserves
from ....errors import QueueClosed, UnsupportedURL
from .._store import Store, shared_store, stores_of

__all__ = ["MEMORY_FIRE_AHEAD_MS", "AsyncMemoryBackend", "open_async_backend"]

#: How long before its due time a waiting reserve claims a message (see "Fire ahead"
#: in delayq.durable.backend): a claim is 0.03 ms at p99; what this hides is a parked
#: task's or thread's wake-up on a loaded machine. Only on the system clock: a held
#: message waits on the real timer, which a fake clock does not drive.
MEMORY_FIRE_AHEAD_MS = 1


def _namespace(url: str) -> str:
    parts = urlsplit(url)
    check_url_options(url, dict(parse_qsl(parts.query, keep_blank_values=True)), ())
    if parts.scheme.lower() != "memory" or parts.path not in ("", "/") or parts.query:
        raise UnsupportedURL(f"a memory URL is memory:// or memory://<namespace>, not {url!r}")
    return parts.netloc


class AsyncMemoryBackend(AsyncReserves):
    """A face of ``memory://`` (see :class:`~delayq.durable.backend.AsyncBackend`): every
    operation holds the store lock for microseconds; only a waiting ``reserve`` parks."""

    def __init__(self, url: str, clock: Clock | None = None) -> None:
        if clock is None:
            clock = SYSTEM_CLOCK
        elif not isinstance(clock, Clock):
            raise TypeError(f"clock must implement delayq.Clock, not {type(clock).__name__}")
        self._namespace = _namespace(url)
        self._clock = clock
        #: See delayq.durable.backend.AsyncFiresAhead.
        self.fire_ahead_ms = MEMORY_FIRE_AHEAD_MS if clock is SYSTEM_CLOCK else 0
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

    def _sleep_for(self, store: Store, give_up: float, ahead_ms: int) -> float | None:
        """Real seconds to sleep (None: until woken); lock held."""
        until = store.next_wake(ahead_ms)
        # Wake at the due millisecond itself (plus a hair, so the floored now has
        # reached it), not a whole millisecond after now_ms.
        seconds = inf if until is None else max(until / 1000.0 - self._clock.time(), 0.0) + 5e-5
        seconds = min(seconds, give_up - self._clock.monotonic())
        if seconds == inf:
            return None
        return self._clock.wait_timeout(max(seconds, 0.0))

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.put` (``outcome`` is a hint this
        backend does not need: it always decides before it returns)."""
        store = self._store(queue)
        with store.lock:
            kept = store.put(requests, self._now())
            if len(kept) < len(requests):
                store.wake_all()
            return kept

    async def _reserve(
        self, queue: str, limit: int, lease_ms: int, wait: float | None, ahead_ms: int
    ) -> Claimed:
        store = self._store(queue)
        give_up = inf if wait is None else self._clock.monotonic() + wait
        with store.lock:
            while True:
                if self._closed:
                    raise QueueClosed("the queue was closed")
                seconds = self._clock.time()
                claimed = store.claim_soon(Now.of_seconds(seconds), limit, lease_ms, ahead_ms)
                if claimed or self._clock.monotonic() >= give_up:
                    return Claimed(claimed, math.floor(seconds * 1e6))
                # Lets go of the lock while it waits, as Condition.wait does.
                await store.wait_async(self._sleep_for(store, give_up, ahead_ms))

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack`."""
        store = self._store(queue)
        with store.lock:
            store.ack(id, token, self._now())

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack_many`."""
        store = self._store(queue)
        with store.lock:
            return store.ack_many(items, self._now())

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
            state = store.nack(id, token, self._now(), delay_ms=delay_ms, error=error, dead=dead)
            if state is State.SCHEDULED:
                store.wake_all()
            return state

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.release`."""
        store = self._store(queue)
        with store.lock:
            store.release(id, token, self._now())
            store.wake_all()

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.extend`."""
        store = self._store(queue)
        with store.lock:
            return store.extend(id, token, self._now(), lease_ms)

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.cancel`."""
        store = self._store(queue)
        with store.lock:
            return store.cancel(id, self._now())

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reschedule`."""
        store = self._store(queue)
        with store.lock:
            moved = store.reschedule(id, self._now(), delay_ms=delay_ms, at_ms=at_ms)
            if moved:
                store.wake_all()
            return moved

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.get`."""
        store = self._store(queue)
        with store.lock:
            return store.get(id, self._now())

    async def stats(self, queue: str) -> Stats:
        """See :meth:`~delayq.durable.backend.AsyncBackend.stats`."""
        store = self._store(queue)
        with store.lock:
            return store.stats(self._now())

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.dead`."""
        store = self._store(queue)
        with store.lock:
            return store.dead(limit, after_seq, self._now())

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.retry_dead`."""
        store = self._store(queue)
        with store.lock:
            revived = store.retry_dead(ids, self._now())
            if revived:
                store.wake_all()
            return revived

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.purge`."""
        store = self._store(queue)
        with store.lock:
            return store.purge(state, self._now())

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
            return store.peek(state, limit, after, self._now())

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.due_counts`."""
        store = self._store(queue)
        with store.lock:
            return store.due_counts(horizon_ms, buckets, self._now())

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
