"""Many producers and consumers at once: every item that was not cancelled comes out
exactly once, and none comes out before its deadline."""

from __future__ import annotations

import asyncio
import queue as stdlib_queue
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from delayq import AsyncDelayQueue, DelayQueue, Handle, QueueClosed

pytestmark = pytest.mark.timeout(60)

PRODUCERS = 4
CONSUMERS = 4
PER_PRODUCER = 5_000  # 20k items in all
MAX_DELAY = 0.02


class Ledger:
    """What the producers did: every handle, and which cancels succeeded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handles: dict[int, Handle[int]] = {}
        self.cancelled: set[int] = set()
        self.rescheduled = 0
        self.errors: list[BaseException] = []


def produce(q: Any, ledger: Ledger, base: int, seed: int) -> None:
    rng = random.Random(seed)
    mine: list[Handle[int]] = []
    try:
        for i in range(PER_PRODUCER):
            item = base + i
            handle = q.put(item, delay=rng.choice((0.0, rng.uniform(-0.005, MAX_DELAY))))
            with ledger.lock:
                ledger.handles[item] = handle
            mine.append(handle)
            roll = rng.random()
            if roll < 0.1:
                victim = rng.choice(mine[-50:])
                if q.cancel(victim):
                    with ledger.lock:
                        ledger.cancelled.add(victim.value)
            elif roll < 0.25:
                victim = rng.choice(mine[-50:])
                if q.reschedule(victim, delay=rng.uniform(-0.005, MAX_DELAY)):
                    with ledger.lock:
                        ledger.rescheduled += 1
            if i % 100 == 0:
                time.sleep(0.001)  # let the consumers catch up and sleep now and then
    except BaseException as exc:
        ledger.errors.append(exc)


def check(ledger: Ledger, received: list[tuple[int, float]]) -> None:
    assert not ledger.errors, ledger.errors
    assert len(ledger.handles) == PRODUCERS * PER_PRODUCER
    counts = Counter(item for item, _ in received)
    duplicates = [item for item, n in counts.items() if n > 1]
    assert not duplicates, f"{len(duplicates)} items came out twice"
    expected = set(ledger.handles) - ledger.cancelled
    assert set(counts) == expected
    assert ledger.cancelled
    assert ledger.rescheduled
    early = [
        (item, ledger.handles[item].deadline - when)
        for item, when in received
        if when < ledger.handles[item].deadline
    ]
    assert not early, f"{len(early)} items came out early, e.g. {early[:3]}"
    assert not any(h.pending for h in ledger.handles.values())


def test_threads(make_store: Any) -> None:
    q: DelayQueue[int] = DelayQueue(store=make_store())
    ledger = Ledger()
    received: list[tuple[int, float]] = []
    consumer_errors: list[BaseException] = []

    def consume(k: int) -> None:
        rng = random.Random(100 + k)
        out: list[tuple[int, float]] = []
        try:
            if k == 0:
                for item in q:  # blocking iteration, ends when closed and empty
                    out.append((item, time.monotonic()))
            else:
                while True:
                    try:
                        if k == 1:
                            items = [q.get(timeout=0.05)]
                        else:
                            items = q.get_many(max=rng.randint(1, 64), timeout=0.05)
                    except stdlib_queue.Empty:
                        continue
                    except QueueClosed:
                        break
                    now = time.monotonic()
                    out.extend((item, now) for item in items)
        except BaseException as exc:
            consumer_errors.append(exc)
        with ledger.lock:
            received.extend(out)

    consumers = [threading.Thread(target=consume, args=(k,)) for k in range(CONSUMERS)]
    producers = [
        threading.Thread(target=produce, args=(q, ledger, p * PER_PRODUCER, p))
        for p in range(PRODUCERS)
    ]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join(30)
    assert not any(t.is_alive() for t in producers)
    q.close()
    for t in consumers:
        t.join(30)
    assert not any(t.is_alive() for t in consumers), "a consumer never saw the end"
    assert not consumer_errors, consumer_errors
    assert len(q) == 0
    check(ledger, received)


def test_async_consumers_with_producer_threads(make_store: Any) -> None:
    q: AsyncDelayQueue[int] = AsyncDelayQueue(store=make_store())
    ledger = Ledger()
    received: list[tuple[int, float]] = []

    async def consume(k: int) -> None:
        rng = random.Random(200 + k)
        if k % 2 == 0:
            async for item in q:
                received.append((item, time.monotonic()))
        else:
            while True:
                try:
                    items = await q.get_many(max=rng.randint(1, 64))
                except QueueClosed:
                    return
                now = time.monotonic()
                received.extend((item, now) for item in items)

    async def run() -> None:
        consumers = [asyncio.ensure_future(consume(k)) for k in range(CONSUMERS)]
        await asyncio.sleep(0.01)
        producers = [
            threading.Thread(target=produce, args=(q, ledger, p * PER_PRODUCER, p))
            for p in range(PRODUCERS)
        ]
        for t in producers:
            t.start()
        loop = asyncio.get_running_loop()
        for t in producers:
            await loop.run_in_executor(None, t.join, 30)
        assert not any(t.is_alive() for t in producers)
        q.close()  # from the loop thread; the producers' puts came from other threads
        await asyncio.wait_for(asyncio.gather(*consumers), 30)

    asyncio.run(run())
    assert q._debug_state() == {"waiters": 0, "sleepers": 0}
    assert len(q) == 0
    check(ledger, received)
