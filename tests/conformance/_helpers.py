"""Small helpers shared by the conformance tests."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from delayq.durable.message import PutRequest, put_request

T = TypeVar("T")


def now_ms() -> int:
    """The local wall clock in epoch ms, floored (the servers under test run on this
    machine): a lower bound of the floor of any later backend "now"."""
    return int(time.time() * 1000)


def ceil_ms() -> int:
    """The local wall clock in epoch ms, rounded up: an upper bound of the ceiling of
    any earlier backend "now", where due times (now + delay) and lease expiries start."""
    return math.ceil(time.time() * 1000)


def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    """Run ``fn`` in a new daemon thread; its result or exception lands in the future."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


def total(q: Any) -> int:
    """How many messages the queue holds, in any state."""
    stats = q.stats()
    return int(stats.scheduled + stats.ready + stats.active + stats.dead)


def stored_request(
    message_id: str,
    payload: bytes = b"1",
    *,
    headers: dict[str, str] | None = None,
    delay_ms: int | None = None,
) -> PutRequest:
    """A put as a backend takes it, for storing what a put refuses today (an id or
    name an older version accepted, a payload it wrote): ``backend.put(queue, [it])``
    stores it unchecked. ``payload`` is JSON bytes."""
    return put_request(
        id=message_id,
        payload=payload,
        encoding="json",
        max_attempts=5,
        headers=headers or {},
        delay_ms=delay_ms,
        at_ms=None,
        on_conflict="ignore",
        generated_id=False,
    )
