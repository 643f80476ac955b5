"""Shared helpers of the worker tests: a unique memory:// URL, a serve-until loop,
and a memory backend with the two contract additions the worker asks for."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from delayq.backends.memory import AsyncMemoryBackend, _Store
from delayq.durable.message import Record, State, apply_ack, apply_nack
from delayq.durable.queue import AsyncQueue
from delayq.worker import Worker


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


class FullContractBackend(AsyncMemoryBackend):
    """memory:// plus the proposed ``nack(..., dead=True)`` and ``release``."""

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
        if not dead:
            return await super().nack(queue, id, token, delay_ms=delay_ms, error=error)

        def step(store: _Store, now: int) -> State:
            record = store.load(id, now)
            if record is not None:
                record = replace(record, max_attempts=record.attempts)
            new = apply_nack(record, token, now, delay_ms=0, error=error, seq=next(store.seq))
            store.write(new)
            return new.state

        return self._run(queue, step)

    async def release(self, queue: str, id: str, token: str) -> None:
        def step(store: _Store, now: int) -> None:
            record = store.load(id, now)
            apply_ack(record, token, now)  # LeaseLost unless held
            assert record is not None
            store.write(
                replace(
                    record,
                    state=State.SCHEDULED,
                    attempts=record.attempts - 1,
                    lease=None,
                    lease_until=None,
                )
            )
            store.wake_all()

        self._run(queue, step)


def full_contract_queue(url: str, name: str = "default", **options: object) -> AsyncQueue:
    """An AsyncQueue over :class:`FullContractBackend`."""
    queue = AsyncQueue(url, name=name, **options)  # type: ignore[arg-type]
    queue._backend = FullContractBackend(url)
    return queue


def ids_of(records: Sequence[Record]) -> list[str]:
    return [record.id for record in records]
