"""The store behind ``memory://``: one queue's records and the contract's operations on
them (:class:`~delayq.backends._records.Records`), the waiting of its consumers, and the
process-wide registry of stores by ``(namespace, queue)``. Every method of
:class:`Store` runs with its ``lock`` held."""

from __future__ import annotations

import asyncio
import threading

from ..._timer import call_later_precisely
from ..._waiters import LoopSleeper, resolve
from .._records import Records

__all__ = ["Store", "shared_store", "stores_of"]


class Store(Records):
    """One queue's messages; every method runs with ``lock`` held."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
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
        timer = (
            None
            if seconds is None
            else call_later_precisely(loop, seconds, resolve, sleeper.future)
        )
        self.lock.release()
        try:
            await sleeper.future
        finally:
            if timer is not None:
                timer.cancel()
            self.lock.acquire()
            self.sleepers.discard(sleeper)


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
