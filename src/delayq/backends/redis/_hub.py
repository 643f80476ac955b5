"""Where the waiting reserves of one sharded queue sleep: one listener per shard marks its
shard in the :class:`~._shards.ShardView` and wakes them all (:class:`Hub` for threads,
:class:`AsyncHub` for asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from ..._timer import call_later_precisely
from ..._waiters import resolve
from ._listen import AsyncListener, Listener
from ._shards import ShardView

__all__ = ["AsyncHub", "Hub"]


class Hub:
    """Where the waiting reserves of one sharded queue sleep (threads): one listener per
    shard marks its shard in the view and wakes them all."""

    def __init__(self, view: ShardView) -> None:
        self.view = view
        self.listeners: list[Listener] = []
        self._cond = threading.Condition()
        self._generation = 0
        self._closed = False

    @property
    def generation(self) -> int:
        """Changes whenever waiters should look at the queue again."""
        return self._generation

    def mark_unheard(self) -> None:
        """Mark the shards whose listener is not running (their news may be missed)."""
        for shard, listener in enumerate(self.listeners):
            if not listener.running:
                self.view.mark(shard)

    def news(self, shard: int) -> None:
        """Shard ``shard`` changed: mark it and wake every waiter."""
        self.view.mark(shard)
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Around a waiting reserve: every shard's listener runs."""
        with contextlib.ExitStack() as stack:
            for listener in self.listeners:
                stack.enter_context(listener.session())
            yield

    def wait(self, generation: int, timeout: float | None) -> None:
        """Sleep up to ``timeout`` s unless news came after ``generation`` or closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._generation != generation, timeout)

    def close(self) -> None:
        """Wake every waiter for good and stop the listeners."""
        with self._cond:
            self._closed = True
            self._generation += 1
            self._cond.notify_all()
        for listener in self.listeners:
            listener.close()


class AsyncHub:
    """:class:`Hub` for asyncio: waiters sleep on futures of the loop."""

    def __init__(self, view: ShardView) -> None:
        self.view = view
        self.listeners: list[AsyncListener] = []
        self._generation = 0
        self._futures: set[asyncio.Future[None]] = set()
        self._closed = False

    @property
    def generation(self) -> int:
        """Changes whenever waiters should look at the queue again."""
        return self._generation

    def mark_unheard(self) -> None:
        """Mark the shards whose listener is not running (their news may be missed)."""
        for shard, listener in enumerate(self.listeners):
            if not listener.running:
                self.view.mark(shard)

    def news(self, shard: int) -> None:
        """Shard ``shard`` changed: mark it and wake every waiter."""
        self.view.mark(shard)
        self._generation += 1
        for future in self._futures:
            if not future.done():
                future.set_result(None)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Around a waiting reserve: every shard's listener runs."""
        with contextlib.ExitStack() as stack:
            for listener in self.listeners:
                stack.enter_context(listener.session())
            yield

    async def wait(self, generation: int, timeout: float | None) -> None:
        """Sleep up to ``timeout`` s unless news came after ``generation`` or closed."""
        if self._closed or self._generation != generation:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._futures.add(future)
        timer = None if timeout is None else call_later_precisely(loop, timeout, resolve, future)
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
            self._futures.discard(future)

    async def close(self) -> None:
        """Wake every waiter for good and stop the listeners."""
        self._closed = True
        self.news(0)
        for listener in self.listeners:
            await listener.close()
