"""What only the async face can show: it never blocks the event loop."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.durable import AsyncQueue

from .conftest import BACKENDS


@pytest.fixture(params=sorted(BACKENDS))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from BACKENDS[request.param](tmp_path)


def test_waiting_reserve_does_not_block_the_loop(url: str) -> None:
    async def main() -> tuple[int, float]:
        async with AsyncQueue(url, name="loop") as q:
            await q.stats()  # connect first: only the wait itself is measured
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.create_task(ticker())
            await q.put("x", delay=1.0)
            before, started = ticks, time.monotonic()
            [msg] = await q.reserve(wait=5)
            elapsed = time.monotonic() - started
            during = ticks - before
            await q.ack(msg)
            task.cancel()
            await q.purge()
            return during, elapsed

    ticks, elapsed = asyncio.run(main())
    assert elapsed >= 0.9
    # A reserve that blocked the loop would leave the ticker at 0 or 1 of the ~100 ticks
    # of the wait; a loaded machine (or a garbage collection late in a long run, seen
    # eating 250 ms) takes a share, never most of them.
    assert ticks >= 20


def test_cancelled_reserve_claims_nothing(url: str) -> None:
    async def main() -> int:
        async with AsyncQueue(url, name="cancel") as q:
            waiter = asyncio.create_task(q.reserve(wait=30))
            await asyncio.sleep(0.05)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await q.put("x")
            got = await q.reserve(wait=0)
            await q.purge()
            return len(got)

    assert asyncio.run(main()) == 1


def test_many_tasks_share_one_queue(url: str) -> None:
    async def main() -> list[int]:
        async with AsyncQueue(url, name="tasks") as q:
            got: list[int] = []

            async def consumer() -> None:
                while True:
                    for msg in await q.reserve(wait=1, max=5):
                        got.append(msg.payload)
                        await q.ack(msg)

            tasks = [asyncio.create_task(consumer()) for _ in range(8)]
            await asyncio.sleep(0.05)
            for i in range(200):
                await q.put(i, delay=(i % 5) / 100)
            for _ in range(500):
                if len(got) == 200:
                    break
                await asyncio.sleep(0.01)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await q.purge()
            return got

    assert sorted(asyncio.run(main())) == list(range(200))


def test_a_task_cancelled_while_it_puts_ends_cancelled(url: str) -> None:
    """A task cancelled in the middle of its calls ends with CancelledError, wherever in
    a call the cancellation lands, and leaves nothing for asyncio to complain about.
    Before Python 3.12, ``asyncio.wait_for`` dropped a cancellation that came as what it
    awaited ended: on kafka:// one put in 20 returned as if never cancelled, and a
    Worker whose cron producer was cancelled so at its stop never ended."""

    async def main() -> tuple[list[str], list[dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        complaints: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: complaints.append(context))
        rng = random.Random(5)
        endings: list[str] = []
        async with AsyncQueue(url, name="cancelled") as q:
            await q.stats()  # connected: every cancellation lands in a call

            async def putting(trial: int) -> None:
                for i in itertools.count():
                    # A cron producer's put: an id, kept if there (a fast put where
                    # the backend has one), and a plain one.
                    await q.put(i, id=f"t{trial}-{i}", delay=60, on_conflict="ignore")
                    await q.put(i, delay=60, on_conflict="error")
                    await asyncio.sleep(0)  # a call that never waits (memory://) yields here

            for trial in range(60):
                task = asyncio.create_task(putting(trial))
                await asyncio.sleep(rng.uniform(0.005, 0.03))
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=10)
                if not done:
                    endings.append("still running 10 s after its cancel")
                    task.cancel()
                    await asyncio.wait({task}, timeout=10)
                elif not task.cancelled():
                    endings.append(f"ended without CancelledError: {task.exception()!r}")
            await q.purge()
        return endings, complaints

    endings, complaints = asyncio.run(main())
    assert endings == []
    assert complaints == []
