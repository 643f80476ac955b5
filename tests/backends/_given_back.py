"""A reserve cancelled while its claim runs, and its queue closed at once (a worker
stopping while idle): the shared part of the local-store backends' tests that the
close gives back what the claim took."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from delayq.durable import AsyncQueue, Queue, State

__all__ = ["given_back_by_the_close"]


def given_back_by_the_close(url: str, linger: Callable[[Any, threading.Event], None]) -> None:
    """Put ``x``; ``linger(backend, claimed)`` makes the backend's claim set ``claimed``
    once it took the message and return only some 0.3 s later. The reserve is
    cancelled as soon as ``claimed`` is set and the queue closed at once: another queue
    object must then find ``x`` ready, no attempt counted, and reserve it."""

    async def cancel_and_close() -> None:
        async with AsyncQueue(url, name="closing") as q:
            await q.put("x", id="x")
            claimed = threading.Event()
            linger(q.backend, claimed)
            task = asyncio.ensure_future(q.reserve(wait=0, lease=60))
            while not claimed.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(cancel_and_close())
    with Queue(url, name="closing") as again:
        message = again.get("x")
        assert message is not None
        assert (message.state, message.attempts) == (State.READY, 0)
        assert [m.id for m in again.reserve(wait=0)] == ["x"]
        again.purge()
