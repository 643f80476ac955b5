"""The hand-written I/O pairs behind the face written once in :mod:`._async.backend`:
the lock of its first use, and how a claim is kept from being lost when the task
awaiting it is cancelled (the sync face cannot be cancelled mid-call)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["AsyncLock", "Lock", "guarded", "guarded_async"]

T = TypeVar("T")

AsyncLock = asyncio.Lock
Lock = threading.Lock

# The give-back tasks of cancelled claims, referenced until they finish.
_PENDING: set[asyncio.Task[None]] = set()


def guarded(call: Callable[[], T], give_back: Callable[[T], object]) -> T:
    """``call()`` (on the sync face nothing can interrupt it half way)."""
    return call()


async def guarded_async(
    call: Callable[[], Awaitable[T]], give_back: Callable[[T], Awaitable[None]]
) -> T:
    """``await call()`` in a task of its own: when the awaiting task is cancelled, the
    call still finishes, and what it returned is handed to ``give_back`` (a claim
    nobody receives is released at once instead of waiting out its lease)."""
    task = asyncio.ensure_future(call())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:

        def done(finished: asyncio.Future[T]) -> None:
            if finished.cancelled() or finished.exception() is not None:
                return
            back = asyncio.ensure_future(give_back(finished.result()))
            _PENDING.add(back)
            back.add_done_callback(_PENDING.discard)

        task.add_done_callback(done)
        raise
