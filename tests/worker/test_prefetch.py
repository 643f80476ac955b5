"""The Worker's prefetch on memory, redis and sqlite: messages reserved
ahead of a free handler keep their lease while they wait, never run more than
``concurrency`` at once, and go back at once on a stop; sync and async handlers
alike (sync ones run on the worker's lane of threads)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.conftest import BACKENDS
from delayq.durable.message import Message
from delayq.durable.queue import AsyncQueue
from delayq.runtime import App, Task, Worker

from ._helpers import memory_url, serve_until, wait_for

KINDS = ["sync", "async"]


@pytest.fixture(params=["memory", "redis", "sqlite"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store of memory, redis and sqlite (the other backends run the same
    consumer loop; the worker's own tests cover them)."""
    yield from BACKENDS[request.param](tmp_path)


class Blocker:
    """A handler of either kind that notes each run and holds the first one until
    :meth:`release` (or ``hold`` seconds)."""

    def __init__(self, kind: str, hold: float = 10.0) -> None:
        self.kind, self.hold = kind, hold
        self.runs: Counter[object] = Counter()
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()
        self._free = threading.Event()

    def release(self) -> None:
        self._free.set()

    def _enter(self, msg: Message) -> bool:
        with self._lock:
            first = not self.runs
            self.runs[msg.payload] += 1
            self.running += 1
            self.most = max(self.most, self.running)
        return first

    def _leave(self) -> None:
        with self._lock:
            self.running -= 1

    def handler(self) -> object:
        if self.kind == "sync":

            def sync_handler(msg: Message) -> None:
                if self._enter(msg):
                    self._free.wait(self.hold)
                else:
                    time.sleep(0.002)
                self._leave()

            return sync_handler

        async def async_handler(msg: Message) -> None:
            if self._enter(msg):
                deadline = time.monotonic() + self.hold
                while not self._free.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            else:
                await asyncio.sleep(0.002)
            self._leave()

        return async_handler


@pytest.mark.parametrize("kind", KINDS)
def test_prefetched_messages_keep_their_lease_while_they_wait(backend_url: str, kind: str) -> None:
    """Held well past their lease behind a long handler, the prefetched messages stay
    this worker's: nobody else can reserve them, and each runs once.

    The lease is long enough that a renewal late by a loaded machine's scheduling (a
    third of it due, two thirds of margin) still keeps it; 1.75 leases without one
    would free them all the same."""
    blocker = Blocker(kind)
    lease = 1.0

    async def main() -> None:
        queue = AsyncQueue(backend_url, name="q")
        other = AsyncQueue(backend_url, name="q")
        try:
            await queue.put_many([{"payload": i} for i in range(3)])
            worker = Worker(queue, blocker.handler(), concurrency=1, prefetch=2, lease=lease)

            async def elsewhere() -> None:
                await wait_for(lambda: blocker.runs)
                try:
                    await asyncio.sleep(1.75 * lease)  # renewed, or they would be free
                    assert (await other.stats()).active == 3
                    assert await other.reserve(max=3, wait=0) == []
                finally:
                    blocker.release()  # the first handler ends once this is seen

            check = asyncio.create_task(elsewhere())
            await serve_until(worker, lambda: worker.counts["succeeded"] == 3, timeout=10)
            await check
            assert worker.counts["lease_lost"] == 0
            assert (await queue.stats()).total == 0
        finally:
            await other.close()
            await queue.close()

    asyncio.run(main())
    assert blocker.runs == {0: 1, 1: 1, 2: 1}


@pytest.mark.parametrize("kind", KINDS)
def test_a_stop_gives_prefetched_messages_back_at_once(backend_url: str, kind: str) -> None:
    """The running handler finishes within the grace; the prefetched messages go back
    at once (ready again, no attempt charged) without waiting for it."""
    blocker = Blocker(kind)

    async def main() -> None:
        queue = AsyncQueue(backend_url, name="q")
        try:
            await queue.put_many([{"payload": i, "id": f"m{i}"} for i in range(4)])
            worker = Worker(queue, blocker.handler(), concurrency=1, prefetch=3, grace=10)
            serving = asyncio.create_task(worker.serve())
            await wait_for(lambda: blocker.runs)
            await wait_for_stats(queue, active=4)
            worker.stop()
            await wait_for_stats(queue, ready=3, active=1)  # while the first one still runs
            assert not serving.done()
            blocker.release()
            await asyncio.wait_for(serving, 10)
            assert worker.counts["released"] == 3
            assert worker.counts["succeeded"] == 1
            again = await queue.reserve(max=4, wait=0)
            assert sorted(msg.payload for msg in again) == [1, 2, 3]
            assert [msg.attempts for msg in again] == [1, 1, 1]  # the release charged none
            await queue.ack_many(again)
        finally:
            await queue.close()

    asyncio.run(main())
    assert blocker.runs == {0: 1}


@pytest.mark.parametrize("kind", KINDS)
def test_no_more_than_concurrency_run_at_once(backend_url: str, kind: str) -> None:
    blocker = Blocker(kind, hold=0.0)

    async def main() -> None:
        queue = AsyncQueue(backend_url, name="q")
        try:
            await queue.put_many([{"payload": i} for i in range(30)])
            worker = Worker(queue, blocker.handler(), concurrency=3, prefetch=10)
            await serve_until(worker, lambda: worker.counts["succeeded"] == 30, timeout=10)
        finally:
            await queue.close()

    asyncio.run(main())
    assert blocker.most <= 3
    assert sorted(blocker.runs) == list(range(30))
    assert set(blocker.runs.values()) == {1}


@pytest.mark.parametrize("kind", KINDS)
def test_an_app_worker_runs_no_more_than_concurrency_at_once(backend_url: str, kind: str) -> None:
    """The same through an App, whose tasks' kinds decide how the worker runs them."""
    app = App(backend_url)
    running, most = [0], [0]

    def enter() -> None:
        running[0] += 1
        most[0] = max(most[0], running[0])

    if kind == "sync":
        lock = threading.Lock()

        @app.task(name="t", queue="q")
        def sync_task() -> None:
            with lock:
                enter()
            time.sleep(0.002)
            with lock:
                running[0] -= 1

        task: Task[[], None] = sync_task
    else:

        @app.task(name="t", queue="q")
        async def async_task() -> None:
            enter()
            await asyncio.sleep(0.002)
            running[0] -= 1

        task = async_task  # type: ignore[assignment]

    app.send_many(task.message() for _ in range(30))
    worker = Worker(app, concurrency=3, prefetch=10)

    async def main() -> None:
        await serve_until(worker, lambda: worker.counts["succeeded"] == 30, timeout=10)

    try:
        asyncio.run(main())
    finally:
        app.close()
    assert most[0] <= 3
    assert worker.counts["succeeded"] == 30


async def wait_for_stats(queue: AsyncQueue, **counts: int) -> None:
    """Return once the queue's stats show ``counts`` (e.g. ``ready=3``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while True:
        stats = await queue.stats()
        if all(getattr(stats, name) == value for name, value in counts.items()):
            return
        assert loop.time() < deadline, f"stats {stats} never showed {counts}"
        await asyncio.sleep(0.01)


def test_prefetch_is_checked() -> None:
    queue = AsyncQueue("memory://prefetch-checked", name="q")
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
            Worker(queue, lambda msg: None, prefetch=bad)  # type: ignore[arg-type]
    assert Worker(queue, lambda msg: None, concurrency=4).prefetch == 16
    assert Worker(queue, lambda msg: None, prefetch=0).prefetch == 0


def test_a_sync_handler_running_past_the_grace_is_given_back(backend_url: str) -> None:
    """Its message goes back (no attempt charged) when the grace ends; what the
    handler does when it returns later changes nothing."""
    go_on = threading.Event()
    ran: list[object] = []

    def handler(msg: Message) -> None:
        ran.append(msg.payload)
        go_on.wait(10)

    async def main() -> None:
        queue = AsyncQueue(backend_url, name="q")
        try:
            await queue.put("x", id="m")
            worker = Worker(queue, handler, grace=0.1)
            await serve_until(worker, lambda: bool(ran))
            assert worker.counts["released"] == 1
            go_on.set()
            await asyncio.sleep(0.1)  # the handler returned: nothing acked
            msg = await queue.get("m")
            assert msg is not None
            assert (msg.state.value, msg.attempts) == ("ready", 0)
            assert worker.counts["succeeded"] == 0
        finally:
            go_on.set()
            await queue.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("call_seconds", "prefetch", "most_held"),
    [
        (0.0, None, 2 + 32),  # quick calls, the default: up to 16 per handler ahead
        (0.0, 8, 2 + 8),  # a prefetch given is kept to
        (0.03, None, 2 + 8),  # 30 ms calls: 8 waiting stand for 120 ms: the default
    ],
)
def test_the_default_prefetch_of_sync_handlers_grows_only_while_they_are_quick(
    call_seconds: float, prefetch: int | None, most_held: int
) -> None:
    """A Worker of sync handlers on the default prefetch (4 per handler) reserves up to
    16 per handler ahead while the messages waiting stand for at most 50 ms of its
    handlers' work; a prefetch given, or slower handlers, keep it to the bound."""
    free = threading.Event()
    calls = 0

    def handler(msg: Message) -> None:
        nonlocal calls
        calls += 1
        if calls > 130:  # seen enough: hold every thread, let the prefetch fill
            free.wait(10)
        elif call_seconds:
            time.sleep(call_seconds)

    async def main() -> int:
        queue = AsyncQueue(memory_url(), name="q")
        await queue.put_many([{"payload": i} for i in range(400)])
        worker = Worker(queue, handler, concurrency=2, prefetch=prefetch, grace=0.1)
        task = asyncio.create_task(worker.serve())
        held = 0
        try:
            await wait_for(lambda: calls > 131, timeout=20)
            for _ in range(50):  # the reserves catch up with the freed slots
                await asyncio.sleep(0.01)
                held = max(held, (await queue.stats()).active)
        finally:
            worker.stop()
            free.set()
            await asyncio.wait_for(task, 10)
            await queue.purge()
            await queue.close()
        return held

    try:
        held = asyncio.run(main())
    finally:
        free.set()
    assert held <= most_held
    if prefetch is None and not call_seconds:
        assert held > 2 + 8  # beyond the default's bound
    else:  # filled up to it, but for a claim of less than half the prefetch
        assert held > most_held - 8 // 2
