"""Parking an asyncio task until another thread (or its own loop) wakes it."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["LoopSleeper", "resolve"]


def resolve(future: asyncio.Future[None]) -> None:
    """Complete ``future`` unless it is already done (or cancelled)."""
    if not future.done():
        future.set_result(None)


class LoopSleeper:
    """A task parked on a future of its event loop, wakeable from any thread."""

    __slots__ = ("future", "loop", "thread_id")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.thread_id = threading.get_ident()

    def wake(self) -> bool:
        """Wake the task; False if it had already woken (or its loop is gone)."""
        future = self.future
        if future.done():
            return False
        if threading.get_ident() == self.thread_id:
            future.set_result(None)
            return True
        try:
            self.loop.call_soon_threadsafe(resolve, future)
        except RuntimeError:  # the loop is closed: nobody is left to wake
            return False
        return True
