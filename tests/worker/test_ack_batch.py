"""The worker's coalesced acks: one ack_many for jobs finishing together, outcomes per
message, lost leases logged as a single ack's are."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import pytest

from delayq.durable.message import Message
from delayq.durable.queue import AsyncQueue
from delayq.runtime import Worker
from delayq.runtime.ack_batch import AckBatcher

from ._helpers import memory_url, serve_until


class CountingQueue(AsyncQueue):
    """An AsyncQueue (a real memory:// one) that records the size of each ack_many."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    async def ack_many(self, msgs: Iterable[Message]) -> list[str]:
        batch = list(msgs)
        self.batches.append(len(batch))
        return await super().ack_many(batch)


def test_acks_handed_in_together_go_out_in_one_call() -> None:
    async def main() -> None:
        async with CountingQueue(memory_url(), name="q") as queue:
            await queue.put_many([{"payload": n} for n in range(10)])
            msgs = await queue.reserve(max=10, wait=0)
            batcher = AckBatcher(queue)
            outcomes = await asyncio.gather(*(batcher.ack(msg) for msg in msgs))
            assert outcomes == [True] * 10
            assert queue.batches == [10]
            assert (await queue.stats()).total == 0

    asyncio.run(main())


def test_a_lost_lease_is_false_and_the_others_are_acked() -> None:
    async def main() -> None:
        async with CountingQueue(memory_url(), name="q") as queue:
            await queue.put_many([{"payload": n, "id": f"m{n}"} for n in range(3)])
            msgs = {m.id: m for m in await queue.reserve(max=3, wait=0, lease=0.05)}
            await asyncio.sleep(0.1)
            [again] = await queue.reserve(max=1, wait=0)
            held = {m.id: m for m in await queue.reserve(max=2, wait=0)}
            stale = msgs[again.id]
            batcher = AckBatcher(queue)
            # the stale copy and the held one of the same id go in separate calls
            outcomes = await asyncio.gather(
                batcher.ack(stale), batcher.ack(again), *(batcher.ack(m) for m in held.values())
            )
            assert outcomes == [False, True, True, True]
            assert queue.batches == [3, 1]
            assert (await queue.stats()).total == 0

    asyncio.run(main())


def test_an_error_of_the_call_reaches_every_waiter() -> None:
    async def main() -> None:
        queue = AsyncQueue(memory_url(), name="q")
        await queue.put("x")
        [msg] = await queue.reserve(wait=0)
        await queue.close()
        batcher = AckBatcher(queue)
        with pytest.raises(Exception, match="closed"):
            await batcher.ack(msg)
        await batcher.drain()

    asyncio.run(main())


def test_worker_acks_concurrent_jobs_in_batches(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with CountingQueue(memory_url(), name="q") as queue:
            await queue.put_many([{"payload": n} for n in range(200)])

            async def handler(msg: Message) -> None:
                await asyncio.sleep(0)

            worker = Worker(queue, handler, concurrency=16)
            await serve_until(worker, lambda: worker.counts["succeeded"] == 200)
            assert (await queue.stats()).total == 0
            assert sum(queue.batches) == 200
            assert len(queue.batches) < 200  # coalesced

    caplog.set_level(logging.INFO, logger="delayq")
    asyncio.run(main())


def test_worker_logs_a_lease_lost_at_ack(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with AsyncQueue(memory_url(), name="q") as queue:
            await queue.put("x", id="x")

            async def handler(msg: Message) -> None:
                await queue.purge()  # the message is gone before the worker acks it

            worker = Worker(queue, handler, concurrency=2)
            await serve_until(worker, lambda: worker.counts["lease_lost"] == 1)
            assert worker.counts["succeeded"] == 0

    caplog.set_level(logging.WARNING, logger="delayq")
    asyncio.run(main())
    assert any(
        "job.lease_lost" in r.getMessage() and "at=ack" in r.getMessage() for r in caplog.records
    )
