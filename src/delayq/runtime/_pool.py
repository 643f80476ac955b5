"""What the worker runs its handlers with: a thread pool of daemon threads, and
concurrency slots.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any, ParamSpec, TypeVar

__all__ = ["DaemonPool", "Slots"]

P = ParamSpec("P")
T = TypeVar("T")


class DaemonPool(Executor):
    """Threads for sync handlers: one per handler running at once, reused when idle.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not keep a stopping process
    alive: a sync handler still running after the grace period cannot be killed, and
    its message has been released already.
    """

    def __init__(self, name: str = "delayq-worker") -> None:
        self._name = name
        self._jobs: SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self._closed = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on an idle thread (or a new one)."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{self._threads}", daemon=True
                )
                thread.start()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, call = job
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del job, future, call
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let idle threads end; running ones end when their handler returns."""
        with self._lock:
            self._closed = True
            count = self._threads
        for _ in range(count):
            self._jobs.put(None)


class Slots:
    """How many more handlers may start (asyncio, one loop)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._changed = asyncio.Event()

    async def take_all(self) -> int:
        """Wait for at least one free slot, then take every free slot."""
        while self.free == 0:
            self._changed.clear()
            await self._changed.wait()
        taken, self.free = self.free, 0
        return taken

    def give(self, count: int = 1) -> None:
        """Return ``count`` slots."""
        if count:
            self.free += count
            self._changed.set()
