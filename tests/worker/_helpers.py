"""Shared helpers of the worker tests: a unique memory:// URL and a serve-until loop."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence

from delayq.durable.message import Record
from delayq.runtime import Worker


def memory_url() -> str:
    """A fresh memory:// namespace, so tests never share messages."""
    return f"memory://t{uuid.uuid4().hex[:12]}"


async def serve_until(
    worker: Worker, condition: Callable[[], bool], timeout: float = 5.0, *, settle: float = 0.0
) -> None:
    """Serve until ``condition()`` holds (then ``settle`` seconds more), then stop."""
    task = asyncio.create_task(worker.serve())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while not condition():
            if task.done():
                task.result()
            assert loop.time() < deadline, "condition not reached in time"
            await asyncio.sleep(0.005)
        await asyncio.sleep(settle)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def wait_for(condition: Callable[[], object], timeout: float = 3.0) -> None:
    """Return once ``condition()`` is true; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


def ids_of(records: Sequence[Record]) -> list[str]:
    return [record.id for record in records]
