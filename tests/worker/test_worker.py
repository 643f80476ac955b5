"""Worker over memory://: handlers, outcomes, leases, concurrency, shutdown."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import delayq
from conformance.conftest import BACKENDS
from delayq.durable.constants import MAX_ERROR_LENGTH
from delayq.durable.facade import error_text
from delayq.durable.message import Message, State
from delayq.durable.queue import AsyncQueue, Queue
from delayq.durable.retry import RetryPolicy
from delayq.runtime import Discard, Retry, Worker, current_message

from ._helpers import memory_url, serve_until

FAST = RetryPolicy(max_attempts=3, base=0.05, factor=2.0, jitter=0.0)


def test_sync_and_async_handlers_ack_what_they_finish() -> None:
    url = memory_url()
    seen: list[tuple[str, object]] = []

    def sync_handler(msg: Message) -> None:
        seen.append(("sync", msg.payload))
        assert current_message() is msg

    async def async_handler(msg: Message) -> None:
        await asyncio.sleep(0)
        seen.append(("async", msg.payload))
        assert current_message() is msg

    async def main() -> None:
        for name, handler in (("s", sync_handler), ("a", async_handler)):
            queue = AsyncQueue(url, name=name)
            await queue.put_many([{"payload": i} for i in range(10)])
            worker = Worker(queue, handler, concurrency=3)
            await serve_until(worker, lambda w=worker: w.counts["succeeded"] == 10)
            assert worker.counts["succeeded"] == 10
            assert (await queue.stats()).total == 0
            await queue.close()

    asyncio.run(main())
    assert sorted(p for kind, p in seen if kind == "sync") == list(range(10))
    assert sorted(p for kind, p in seen if kind == "async") == list(range(10))


def test_a_failing_handler_is_retried_with_backoff_then_dead() -> None:
    url = memory_url()
    times: list[float] = []

    def handler(msg: Message) -> None:
        times.append(time.monotonic())
        raise ValueError(f"boom {msg.attempts}")

    async def main() -> None:
        queue = AsyncQueue(url, name="q", retry=FAST)
        await queue.put("x", id="m")
        worker = Worker(queue, handler)
        await serve_until(worker, lambda: worker.counts["dead"] == 1)
        msg = await queue.get("m")
        assert msg is not None
        assert msg.state is State.DEAD
        assert msg.attempts == 3
        # The summary first, then where it was raised (the traceback).
        summary, _, trace = msg.last_error.partition("\n\n")
        assert summary == "ValueError: boom 3"
        assert trace.startswith("Traceback (most recent call last):")
        assert 'raise ValueError(f"boom {msg.attempts}")' in trace
        assert trace.endswith("ValueError: boom 3")
        assert worker.counts["retried"] == 2

    asyncio.run(main())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.05
    assert gaps[1] >= 0.10
    assert all(gap < 2.0 for gap in gaps)  # generous: the machine may be busy


def test_retry_asks_for_its_own_delay() -> None:
    url = memory_url()
    runs: list[float] = []

    async def handler(msg: Message) -> None:
        runs.append(time.monotonic())
        if msg.attempts == 1:
            raise Retry(delay="300ms", reason="not yet")

    async def main() -> None:
        queue = AsyncQueue(url, name="q", retry=FAST)
        await queue.put("x")
        worker = Worker(queue, handler)
        await serve_until(worker, lambda: worker.counts["succeeded"] == 1)

    asyncio.run(main())
    assert len(runs) == 2
    assert runs[1] - runs[0] >= 0.3


def test_discard_goes_to_dead_at_once(backend_url: str, caplog: pytest.LogCaptureFixture) -> None:
    runs = []

    def handler(msg: Message) -> None:
        runs.append(msg.attempts)
        raise Discard("malformed order")

    async def main() -> None:
        queue = AsyncQueue(backend_url, name="q", retry=FAST)
        await queue.put({"bad": True}, id="m")
        worker = Worker(queue, handler)
        await serve_until(worker, lambda: worker.counts["dead"] == 1)
        msg = await queue.get("m")
        assert msg is not None
        assert (msg.state, msg.attempts) == (State.DEAD, 1)
        assert msg.last_error == "Discard: malformed order"
        assert worker.counts["retried"] == 0
        assert [m.id for m in await queue.dead()] == ["m"]
        await queue.purge()
        await queue.close()

    with caplog.at_level(logging.WARNING, logger="delayq"):
        asyncio.run(main())
    assert runs == [1]  # one run: not retried until the attempts ran out
    assert "job.discarded" in caplog.text
    assert "has no nack" not in caplog.text  # no fallback any more


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handler_past_its_timeout_is_a_failure(kind: str) -> None:
    url = memory_url()

    def slow_sync(msg: Message) -> None:
        if msg.attempts == 1:
            time.sleep(0.5)

    async def slow_async(msg: Message) -> None:
        if msg.attempts == 1:
            await asyncio.sleep(5)

    async def main() -> None:
        queue = AsyncQueue(url, name="q", retry=FAST)
        await queue.put("x", id="m")
        handler = slow_sync if kind == "sync" else slow_async
        worker = Worker(queue, handler, timeout=0.1)
        await serve_until(worker, lambda: worker.counts["succeeded"] == 1)
        assert worker.counts["retried"] == 1

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["memory", "sqlite", "redis"])
def test_a_long_job_keeps_its_lease(backend: str, tmp_path: Path) -> None:
    """A job running 2.7 leases keeps its message: the worker extends the lease (every
    third of it) through the backend's extend, so nobody else reserves it meanwhile and
    its ack still holds. A renewal may come up to two thirds of a lease (1 s) late: a
    lease of 0.75 s was lost once while CI shared two cores with three test runs."""
    urls = BACKENDS[backend](tmp_path)
    url = next(urls)
    runs: list[int] = []
    expiries: list[int | None] = []

    async def main() -> None:
        queue = AsyncQueue(url, name="q")

        async def handler(msg: Message) -> None:
            runs.append(msg.attempts)
            expiries.append(msg.lease_expires_at)
            await asyncio.sleep(3.0)
            seen = await queue.get(msg.id)
            assert seen is not None
            expiries.append(seen.lease_expires_at)
            await asyncio.sleep(1.0)

        await queue.put("x")
        worker = Worker(queue, handler, lease=1.5)
        await serve_until(worker, lambda: worker.counts["succeeded"] == 1, timeout=15)
        assert worker.counts["lease_lost"] == 0
        assert (await queue.stats()).total == 0  # acked with the lease it kept
        await queue.close()

    try:
        asyncio.run(main())
    finally:
        urls.close()
    assert runs == [1]
    first, later = expiries
    assert first is not None
    assert later is not None
    assert later >= first + 2000  # extended twice or more by then


def test_concurrency_is_filled_and_never_exceeded() -> None:
    url = memory_url()
    running = 0
    peak = 0
    lock = threading.Lock()

    def handler(msg: Message) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    async def main() -> None:
        queue = AsyncQueue(url, name="q")
        await queue.put_many([{"payload": i} for i in range(40)])
        worker = Worker(queue, handler, concurrency=4)
        started = time.monotonic()
        await serve_until(worker, lambda: worker.counts["succeeded"] == 40)
        assert time.monotonic() - started < 2.0  # 40 x 50 ms / 4, with slack

    asyncio.run(main())
    assert peak == 4


def test_stop_lets_running_handlers_finish() -> None:
    url = memory_url()
    finished = []

    async def handler(msg: Message) -> None:
        await asyncio.sleep(0.3)
        finished.append(msg.payload)

    async def main() -> None:
        queue = AsyncQueue(url, name="q")
        await queue.put_many([{"payload": i} for i in range(3)])
        worker = Worker(queue, handler, grace=5)
        await serve_until(worker, lambda: len(worker._running) == 3)
        assert sorted(finished) == [0, 1, 2]
        assert worker.counts["succeeded"] == 3
        assert (await queue.stats()).total == 0

    asyncio.run(main())


def test_past_the_grace_period_messages_are_given_back(
    backend_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(msg: Message) -> None:
        await asyncio.sleep(10)

    async def main() -> None:
        queue = AsyncQueue(backend_url, name="q")
        await queue.put("x", id="m")
        await queue.put("later", id="n", delay=60)
        before = await queue.get("m")
        assert before is not None
        worker = Worker(queue, handler, grace=0.1)
        started = time.monotonic()
        await serve_until(worker, lambda: len(worker._running) == 1)
        assert time.monotonic() - started < 2.0
        assert worker.counts["released"] == 1
        msg = await queue.get("m")
        assert msg is not None
        # back where it was, for the next worker, without the attempt charged
        assert (msg.state, msg.attempts, msg.due_at) == (State.READY, 0, before.due_at)
        assert msg.last_error is None
        [again] = await queue.reserve(wait=0)
        assert (again.id, again.attempts) == ("m", 1)
        await queue.purge()
        await queue.close()

    with caplog.at_level(logging.INFO, logger="delayq"):
        asyncio.run(main())
    assert "job.released" in caplog.text
    assert "has no release" not in caplog.text  # no fallback any more


async def _purge_under_a_job(job: float, then: float, **options: Any) -> tuple[AsyncQueue, Worker]:
    """A worker on a queue of one message whose job runs ``job`` seconds: the queue is
    purged once the job started (its lease is gone), the worker stopped ``then``
    seconds later."""
    queue = AsyncQueue(memory_url(), name="q")
    await queue.put("x", id="m")
    started = asyncio.Event()

    async def handler(msg: Message) -> None:
        started.set()
        await asyncio.sleep(job)

    worker = Worker(queue, handler, **options)
    task = asyncio.create_task(worker.serve())
    await asyncio.wait_for(started.wait(), 5)
    await queue.purge()
    if then:
        await asyncio.sleep(then)
    worker.stop()
    await asyncio.wait_for(task, 10)
    return queue, worker


def test_a_job_that_lost_its_lease_is_not_released() -> None:
    async def main() -> None:
        queue, worker = await _purge_under_a_job(10, 0, grace=0.05)
        assert worker.counts["released"] == 0
        assert await queue.get("m") is None

    asyncio.run(main())


def test_a_lost_lease_is_renewed_no_more() -> None:
    """Once a renewal finds the lease lost (the message purged under its job), the
    worker stops renewing it: one loss counted at that renewal and one at the ack, not
    one per beat (a third of the lease) for the rest of the job."""

    async def main() -> None:
        # A job of 15 beats of a 0.3 s lease, over before the worker stops.
        queue, worker = await _purge_under_a_job(1.5, 2.0, lease=0.3)
        await queue.close()
        assert 1 <= worker.counts["lease_lost"] <= 2, worker.counts

    asyncio.run(main())


def test_stop_from_another_thread_and_run_blocks_until_drained() -> None:
    url = memory_url()
    with Queue(url, name="q") as sync_queue:
        sync_queue.put("x")
    queue = AsyncQueue(url, name="q")
    done = []
    worker = Worker(queue, lambda msg: done.append(msg.payload))

    def stop_soon() -> None:
        deadline = time.monotonic() + 5
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
        worker.stop()

    thread = threading.Thread(target=stop_soon)
    thread.start()
    worker.run()  # installs signal handlers: this is the main thread
    thread.join()
    assert done == ["x"]


def test_a_stop_before_serve_returns_at_once() -> None:
    queue = AsyncQueue(memory_url(), name="q")
    worker = Worker(queue, lambda msg: None)
    worker.stop()
    asyncio.run(asyncio.wait_for(worker.serve(), 2))


def test_bad_arguments() -> None:
    queue = AsyncQueue(memory_url(), name="q")
    with pytest.raises(TypeError, match="needs handler"):
        Worker(queue)
    with pytest.raises(ValueError, match="concurrency"):
        Worker(queue, print, concurrency=0)
    with pytest.raises(ValueError, match="lease"):
        Worker(queue, print, lease=0)
    with pytest.raises(TypeError, match="App or an AsyncQueue"):
        Worker("memory://", print)  # type: ignore[arg-type]


def test_every_state_change_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    url = memory_url()

    def handler(msg: Message) -> None:
        if msg.payload == "bad":
            raise RuntimeError("x")

    async def main() -> None:
        queue = AsyncQueue(url, name="q", retry=RetryPolicy(max_attempts=1))
        await queue.put_many([{"payload": "ok"}, {"payload": "bad"}])
        worker = Worker(queue, handler)
        await serve_until(worker, lambda: worker.counts["dead"] == 1 and worker.counts["succeeded"])

    with caplog.at_level(logging.DEBUG, logger="delayq"):
        asyncio.run(main())
    events = [getattr(r, "delayq", {}).get("event") for r in caplog.records]
    for event in (
        "worker.started",
        "job.reserved",
        "job.succeeded",
        "job.failed",
        "worker.stopped",
    ):
        assert event in events
    failed = next(
        r for r in caplog.records if getattr(r, "delayq", {}).get("event") == "job.failed"
    )
    assert failed.delayq["state"] == "dead"  # type: ignore[attr-defined]


def test_a_failure_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    url = memory_url()

    def lookup(msg: Message) -> None:
        table: dict[str, int] = {}
        try:
            table["zz"]
        except KeyError as exc:
            raise RuntimeError("no price for zz") from exc

    async def main() -> None:
        queue = AsyncQueue(url, name="q", retry=FAST)
        await queue.put("x", id="m", max_attempts=1)
        worker = Worker(queue, lookup)
        await serve_until(worker, lambda: worker.counts["dead"] == 1)
        await queue.close()

    caplog.set_level(logging.WARNING, logger="delayq")
    asyncio.run(main())
    [record] = [r for r in caplog.records if r.getMessage().startswith("job.failed")]
    assert 'error="RuntimeError: no price for zz"' in record.getMessage()
    assert record.exc_info is not None
    text = logging.Formatter().format(record)
    # The whole chain, down to the line that raised first.
    assert "KeyError: 'zz'" in text
    assert 'table["zz"]' in text
    assert "RuntimeError: no price for zz" in text


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_failures_log_traceback_starts_at_the_handler(
    caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """The operator reads where the handler raised, not delayq's call of it (the same
    cut as the dead letters show)."""
    url = memory_url()

    def charge(msg: Message) -> None:
        raise ValueError("card declined")

    async def charge_async(msg: Message) -> None:
        raise ValueError("card declined")

    async def main() -> None:
        queue = AsyncQueue(url, name="q", retry=FAST)
        await queue.put("x", id="m", max_attempts=1)
        worker = Worker(queue, charge if kind == "sync" else charge_async)
        await serve_until(worker, lambda: worker.counts["dead"] == 1)
        await queue.close()

    caplog.set_level(logging.WARNING, logger="delayq")
    asyncio.run(main())
    [record] = [r for r in caplog.records if r.getMessage().startswith("job.failed")]
    text = logging.Formatter().format(record)
    trace = text[text.index("Traceback (most recent call last):") :].splitlines()
    frames = [line for line in trace if line.startswith('  File "')]
    assert frames, text
    assert __file__ in frames[0], text  # the handler's own frame first
    package = str(Path(delayq.__file__).parent)
    assert not [frame for frame in frames if package in frame], text
    assert trace[-1] == "ValueError: card declined"


def test_a_long_traceback_is_cut_keeping_the_summary_and_its_end() -> None:
    def dive(n: int) -> None:
        if n == 0:
            raise ValueError("at the bottom")
        try:
            dive(n - 1)
        except ValueError as exc:
            raise ValueError("at the bottom") from exc

    try:
        dive(100)  # a chain of 101 exceptions: far more than the limit
    except ValueError as exc:
        text = error_text(exc)
    assert text is not None
    assert len(text) <= MAX_ERROR_LENGTH
    assert text.startswith("ValueError: at the bottom\n\n...\n")
    assert text.endswith('raise ValueError("at the bottom") from exc\nValueError: at the bottom')
    # An exception never raised has no traceback: the summary alone.
    assert error_text(KeyError("zz")) == "KeyError: 'zz'"
