"""``amqp://`` with many callers on one backend object at once: their requests leave
together (one message while another is on its way) and their replies come back
together, yet each caller gets its own outcome, one caller's error is its own, and
a scheduler killed while such batches are in flight loses and doubles nothing.

The tests use the shared RabbitMQ under a namespace (``prefix``) of their own, deleted
afterwards (the conformance suite's ``amqp`` entry); the killed scheduler is a
``delayq scheduler`` process of the test's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import DuplicateId, LeaseLost, SchedulerNotRunning
from delayq.backends.amqp import _blocking
from delayq.durable import AsyncQueue, Queue

pytest.importorskip("aiormq")

from conformance.conftest import amqp_url


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield from amqp_url(tmp_path)


def test_concurrent_callers_each_get_their_own_outcome(url: str) -> None:
    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as q:
            await q.put("first", id="taken")
            [held] = await q.reserve(wait=0)

            async def one(i: int) -> object:
                kind = i % 6
                if kind == 0:
                    with pytest.raises(DuplicateId):
                        await q.put(i, id="taken", on_conflict="error")
                    return "duplicate"
                if kind == 1:
                    return (await q.put_outcome(i, id="taken")).created
                if kind == 2:
                    return await q.put(i, id=f"m{i}", delay=3600)
                if kind == 3:
                    return await q.cancel(f"missing{i}")
                if kind == 4:
                    message = await q.get("taken")
                    assert message is not None
                    return message.payload
                forged = dataclasses.replace(held, lease="not-the-token")
                with pytest.raises(LeaseLost):
                    await q.ack(forged)
                return "lease lost"

            for _ in range(3):  # many rounds of 96 callers at once
                outcomes = await asyncio.gather(*(one(i) for i in range(96)))
                expected = ["duplicate", False, "", False, "first", "lease lost"]
                for i, outcome in enumerate(outcomes):
                    if i % 6 == 2:
                        assert outcome == f"m{i}"
                    else:
                        assert outcome == expected[i % 6], (i, outcome)
            stats = await q.stats()
            assert (stats.scheduled, stats.active) == (16, 1)
            for i in range(2, 96, 6):
                message = await q.get(f"m{i}")
                assert message is not None
                assert message.payload == i
            await q.ack(held)  # the forged acks did not touch it
            await q.purge()

    asyncio.run(main())


def test_threads_sharing_a_queue_each_get_their_own_outcome(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync face: 16 threads on one Queue (one link), their calls coalesced: each
    request is published by a calling thread (docs/rabbitmq.md, "The sync face's
    path"), and several leave in one message."""
    request = _blocking.BlockingClient.request
    senders: list[threading.Thread] = []

    def recorded(self: Any, *args: Any) -> None:
        senders.append(threading.current_thread())
        request(self, *args)

    with Queue(url, name="jobs") as q:
        q.put("first", id="taken")
        monkeypatch.setattr(_blocking.BlockingClient, "request", recorded)
        errors: list[BaseException] = []
        start = threading.Barrier(16)

        def work(k: int) -> None:
            try:
                start.wait(30)
                for i in range(20):
                    assert q.put((k, i), id=f"t{k}-{i}") == f"t{k}-{i}"
                    with pytest.raises(DuplicateId):
                        q.put(k, id="taken", on_conflict="error")
                    assert q.cancel(f"missing{k}") is False
            except BaseException as exc:  # seen by the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert set(senders) <= set(threads)
        assert 0 < len(senders) < 16 * 20 * 2  # the refused puts and the cancels: some together
        monkeypatch.undo()
        assert q.stats().ready == 1 + 16 * 20
        message = q.get("t7-13")
        assert message is not None
        assert message.payload == [7, 13]
        q.purge()


def scheduler_process(url: str, *, wait: bool = True) -> subprocess.Popen[bytes]:
    """A ``delayq scheduler`` of ``url``'s namespace; with ``wait``, once it stands for
    election (a client's call is refused at once before: SchedulerNotRunning)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "scheduler", "--url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    if wait:
        deadline = time.monotonic() + 30
        with Queue(url.replace("scheduler=on", "scheduler=off"), name="jobs") as client:
            while True:
                try:
                    client.stats()
                    break
                except SchedulerNotRunning:
                    assert process.poll() is None, "the scheduler process ended"
                    assert time.monotonic() < deadline, "no scheduler stood in 30 s"
                    time.sleep(0.05)
    return process


def test_a_scheduler_killed_under_many_callers_loses_and_doubles_nothing(url: str) -> None:
    """16 producers put one by one through one backend object (their requests and
    replies in batches) while the scheduler's process is killed (SIGKILL): every put
    returns, each message is stored once, with the id its put returned."""
    client_url = url.replace("scheduler=on", "scheduler=off")
    first = scheduler_process(url)
    second: subprocess.Popen[bytes] | None = None

    async def main() -> tuple[list[str], list[str]]:
        async with AsyncQueue(client_url, name="jobs", request_timeout=30) as q:
            await q.stats()  # the first process is elected
            acked: list[str] = []
            halfway = asyncio.Event()

            async def producer(k: int) -> None:
                for i in range(60):
                    acked.append(await q.put({"k": k, "i": i}))
                    if len(acked) >= 300:
                        halfway.set()

            async def kill() -> None:
                nonlocal second
                await halfway.wait()
                # a candidate, elected once the first dies
                second = scheduler_process(url, wait=False)
                first.send_signal(signal.SIGKILL)

            await asyncio.gather(kill(), *(producer(k) for k in range(16)))
            assert first.wait(10) == -signal.SIGKILL
            page = await q.peek("ready", limit=2000)
            await q.purge()
            return acked, [message.id for message in page]

    try:
        acked, stored = asyncio.run(main())
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)
    assert len(acked) == 16 * 60
    assert len(stored) == len(set(stored)) == len(acked)
    assert set(stored) == set(acked)
