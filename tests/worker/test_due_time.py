"""A handler starts at or after its message's due time, never before, whichever way the
Worker runs it: a sync handler held until then by a lane thread (a message claimed
ahead of its due time), an async one or one with a timeout held by the reserve loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.conftest import BACKENDS
from delayq.durable.message import Message
from delayq.durable.queue import AsyncQueue
from delayq.runtime import Worker

from ._helpers import serve_until

#: Messages due one every few milliseconds: most are claimed ahead and held.
COUNT = 20
EVERY = 0.006


@pytest.fixture(
    params=[
        *((name, "sync") for name in sorted(BACKENDS)),
        ("redis", "async"),
        ("redis", "job"),
        ("memory", "async"),
    ],
    ids="-".join,
)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A fresh store of a backend, and how the Worker runs the handler: ``sync`` (the
    lane), ``async`` (the loop), ``job`` (a sync handler with a timeout: a job)."""
    backend, kind = request.param
    for url in BACKENDS[backend](tmp_path):
        yield url, kind


def test_every_handler_starts_at_or_after_its_due_time(case: tuple[str, str]) -> None:
    url, kind = case
    started: list[tuple[float, int, str]] = []

    def record(msg: Message) -> None:
        started.append((time.time(), msg.due_at, msg.id))

    async def record_async(msg: Message) -> None:
        record(msg)

    handler: Any = record_async if kind == "async" else record

    async def main() -> None:
        queue = AsyncQueue(url, name="due")
        try:
            await queue.put_many([{"payload": i, "delay": 0.05 + EVERY * i} for i in range(COUNT)])
            timeout = 60.0 if kind == "job" else None
            worker = Worker(queue, handler, concurrency=2, timeout=timeout)
            await serve_until(worker, lambda: len(started) >= COUNT, 15.0, settle=0.05)
            await queue.purge()
        finally:
            await queue.close()

    asyncio.run(main())
    assert sorted(id for _, _, id in started) == sorted({id for _, _, id in started})
    assert len(started) == COUNT
    early = [(due - at * 1000.0) for at, due, _ in started if at * 1000.0 < due]
    assert early == [], f"handlers started before their due time by {early} ms"


@pytest.mark.parametrize(
    "arguments", [{"wait": float("nan")}, {"wait": "soon"}, {"lease": 0}, {"max": 0}, {"max": 1.5}]
)
def test_reserve_ahead_refuses_what_reserve_refuses_alike(arguments: dict[str, Any]) -> None:
    async def main() -> tuple[BaseException, BaseException]:
        queue = AsyncQueue("memory://due-time-arguments", name="q")
        try:
            with pytest.raises((TypeError, ValueError)) as plain:
                await queue.reserve(**arguments)
            with pytest.raises((TypeError, ValueError)) as ahead:
                await queue.reserve_ahead(**arguments)
            return plain.value, ahead.value
        finally:
            await queue.close()

    plain, ahead = asyncio.run(main())
    assert (type(ahead), str(ahead)) == (type(plain), str(plain))
