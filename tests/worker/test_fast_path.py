"""The Worker's fast path (a plain call, sync on the lane or async in a bare task, its
lease renewed by the worker's renewal loop and its ack batched) and a job (a task of
its own per message: what a call with a timeout takes) come to the same outcomes, on
memory and redis: acked, retried, dead, given back on a stop, logged alike."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.conftest import BACKENDS
from delayq.durable.message import Message, State
from delayq.durable.queue import AsyncQueue
from delayq.durable.retry import RetryPolicy
from delayq.runtime import Discard, Retry, Worker, current_message

from ._helpers import serve_until

_TAG: contextvars.ContextVar[str] = contextvars.ContextVar("test_fast_path_tag", default="unset")
FAST = RetryPolicy(max_attempts=2, base=0.05, factor=1.0, jitter=0.0)
#: A timeout no run reaches: it only sends each message down the job path.
JOB_TIMEOUT = 60.0


@pytest.fixture(params=["memory", "redis"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store of memory and redis."""
    yield from BACKENDS[request.param](tmp_path)


def _outcome(msg: Message, seen: list[tuple[Any, int]]) -> None:
    assert current_message() is msg
    seen.append((msg.payload, msg.attempts))
    if msg.payload == "retry" and msg.attempts == 1:
        raise Retry(0.05, reason="later")
    if msg.payload == "discard":
        raise Discard("no use")
    if msg.payload == "boom":
        raise ValueError("boom")


def _handler(kind: str, seen: list[tuple[Any, int]]) -> Any:
    if kind == "sync":

        def sync_handler(msg: Message) -> None:
            _outcome(msg, seen)

        return sync_handler

    async def async_handler(msg: Message) -> None:
        await asyncio.sleep(0)
        _outcome(msg, seen)

    return async_handler


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("path", ["fast", "job"])
def test_every_outcome_is_the_same_on_the_fast_path_and_a_job(
    backend_url: str, kind: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[Any, int]] = []
    timeout = JOB_TIMEOUT if path == "job" else None

    async def main() -> dict[str, Any]:
        queue = AsyncQueue(backend_url, name="q", retry=FAST)
        for payload in ("ok", "retry", "discard", "boom"):
            await queue.put(payload, id=payload)
        worker = Worker(queue, _handler(kind, seen), concurrency=2, timeout=timeout)
        await serve_until(worker, lambda: sum(worker.counts.values()) == 6, timeout=10)
        found = {}
        for id in ("ok", "retry", "discard", "boom"):
            msg = await queue.get(id)
            found[id] = None if msg is None else (msg.state, msg.last_error)
        await queue.purge()
        await queue.close()
        return {"counts": dict(worker.counts), "found": found}

    with caplog.at_level(logging.INFO, logger="delayq"):
        result = asyncio.run(main())
    assert result["counts"] == {"succeeded": 2, "retried": 2, "dead": 2}
    assert sorted(seen) == [
        ("boom", 1), ("boom", 2), ("discard", 1), ("ok", 1), ("retry", 1), ("retry", 2)
    ]  # fmt: skip
    found = result["found"]
    assert found["ok"] is None
    assert found["retry"] is None
    assert found["discard"] == (State.DEAD, "Discard: no use")
    state, error = found["boom"]
    assert state is State.DEAD
    assert "ValueError: boom" in error
    events = Counter(
        record.delayq["event"] for record in caplog.records if hasattr(record, "delayq")
    )
    assert events["job.succeeded"] == 2
    assert events["job.retry_requested"] == 1
    assert events["job.discarded"] == 1
    assert events["job.failed"] == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("path", ["fast", "job"])
def test_a_stop_gives_back_what_runs_past_the_grace_and_what_waits(
    backend_url: str, kind: str, path: str
) -> None:
    """One handler holds its message past the grace, the others wait behind it (the
    prefetch): every one is given back, where it was, its attempt not charged."""
    free = threading.Event()
    started = threading.Event()

    def hold_sync(msg: Message) -> None:
        started.set()
        free.wait(10)

    async def hold_async(msg: Message) -> None:
        started.set()
        deadline = time.monotonic() + 10
        while not free.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def main() -> None:
        queue = AsyncQueue(backend_url, name="q")
        await queue.put_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
        before = {msg.id: msg.due_at for msg in [await queue.get(f"m{i}") for i in range(3)] if msg}
        handler = hold_sync if kind == "sync" else hold_async
        timeout = JOB_TIMEOUT if path == "job" else None
        worker = Worker(queue, handler, concurrency=1, prefetch=2, grace=0.1, timeout=timeout)
        task = asyncio.create_task(worker.serve())
        await asyncio.wait_for(asyncio.to_thread(started.wait, 10), 15)
        worker.stop()
        await asyncio.wait_for(task, 10)
        free.set()
        assert worker.counts["released"] == 3
        for id, due_at in before.items():
            msg = await queue.get(id)
            assert msg is not None
            assert (msg.state, msg.attempts, msg.due_at) == (State.READY, 0, due_at)
        await queue.purge()
        await queue.close()

    try:
        asyncio.run(main())
    finally:
        free.set()


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("path", ["fast", "job"])
def test_a_handler_runs_in_its_own_copy_of_the_serving_context(
    backend_url: str, kind: str, path: str
) -> None:
    """A handler, sync or async, sees the context variables of the code that serves
    the worker, and its message as current_message(); what one handler sets is seen
    by no other (each runs in a copy of its own), on the fast path as in a job."""
    seen: list[tuple[Any, str]] = []
    timeout = JOB_TIMEOUT if path == "job" else None

    def sync_handler(msg: Message) -> None:
        assert current_message() is msg
        seen.append((msg.payload, _TAG.get()))
        if msg.payload % 2:  # every other one leaves its context as it found it
            _TAG.set(f"set by {msg.payload}")

    async def async_handler(msg: Message) -> None:
        await asyncio.sleep(0)
        sync_handler(msg)

    async def main() -> None:
        _TAG.set("server")
        queue = AsyncQueue(backend_url, name="q")
        await queue.put_many([{"payload": i} for i in range(20)])
        handler = sync_handler if kind == "sync" else async_handler
        worker = Worker(queue, handler, concurrency=1, timeout=timeout)
        await serve_until(worker, lambda: worker.counts["succeeded"] == 20, timeout=10)
        await queue.close()

    asyncio.run(main())
    assert sorted(payload for payload, _ in seen) == list(range(20))
    assert {tag for _, tag in seen} == {"server"}


def test_an_async_handler_that_raises_cancelled_error_is_given_back_and_the_rest_run(
    backend_url: str,
) -> None:
    """An async handler that raises CancelledError of its own (not a stop) has its
    message given back, attempt not charged, and the worker goes on running the
    others, that one again included (one handler at a time)."""
    ran: list[Any] = []
    attempts: list[int] = []

    async def handler(msg: Message) -> None:
        ran.append(msg.payload)
        if msg.payload == "cancel":
            attempts.append(msg.attempts)
            if len(attempts) == 1:
                raise asyncio.CancelledError

    async def main() -> dict[str, int]:
        queue = AsyncQueue(backend_url, name="q")
        await queue.put("cancel", id="cancel")
        await queue.put_many([{"payload": i} for i in range(10)])
        worker = Worker(queue, handler, concurrency=1)
        await serve_until(worker, lambda: worker.counts["succeeded"] == 11, timeout=10)
        await queue.close()
        return dict(worker.counts)

    counts = asyncio.run(main())
    assert counts == {"succeeded": 11, "released": 1}
    assert sorted(map(str, ran)) == sorted(["cancel", "cancel", *map(str, range(10))])
    assert attempts == [1, 1]  # its second run is still its first attempt


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11's")
def test_a_cancel_an_async_handler_swallowed_does_not_reach_the_next_call(
    backend_url: str,
) -> None:
    """An async handler that cancels its own task and swallows the CancelledError
    leaves nothing pending for the next handler (one at a time): that one starts
    with no cancel asked of its task, and its ``asyncio.timeout`` raises TimeoutError."""
    outcomes: list[str] = []

    async def handler(msg: Message) -> None:
        if msg.payload == "swallow":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                outcomes.append("swallowed")
            return
        task = asyncio.current_task()
        assert task is not None
        outcomes.append(f"cancelling {task.cancelling()}")  # type: ignore[attr-defined,unused-ignore]
        try:
            async with asyncio.timeout(0.01):  # type: ignore[attr-defined,unused-ignore]
                await asyncio.sleep(1)
        except TimeoutError:
            outcomes.append("timed out")

    async def main() -> dict[str, int]:
        queue = AsyncQueue(backend_url, name="q")
        await queue.put("swallow")
        await queue.put_many([{"payload": i} for i in range(3)])
        worker = Worker(queue, handler, concurrency=1)
        await serve_until(worker, lambda: len(outcomes) == 7, timeout=10)
        await queue.close()
        return dict(worker.counts)

    counts = asyncio.run(main())
    assert outcomes == ["swallowed", *["cancelling 0", "timed out"] * 3]
    assert counts == {"succeeded": 4}
