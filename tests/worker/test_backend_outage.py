"""A Worker whose Redis dies under it and comes back: a few log lines with a doubling
pause and the URL's password hidden, one line when it is back, and it runs messages
again; an ack or a nack that the outage cut is logged as such, on both paths of the
Worker, and its message runs again once its lease ran out. A private ``redis-server``
that the test kills (SIGKILL) and starts again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends._redis_server import RedisProcess
from delayq.durable import AsyncQueue, Message
from delayq.runtime import Worker
from delayq.runtime.outage import Outage

from ._helpers import wait_for

#: A user of its own, so that the URL carries a password to hide.
ACL = ("--save", "", "--user", "app", "on", ">hunter2", "~*", "&*", "+@all")
ADDRESS = r"url=redis://app:\*\*\*@127\.0\.0\.1:\d+/0"
UNAVAILABLE = re.compile(
    # ReplyLost: the kill cut a reserve whose reply never came (delayq.OutcomeUnknown).
    rf"^worker\.backend_unavailable {ADDRESS} error=(?:ConnectionError|ReplyLost) "
    rf'detail=".+" retry_in=(\S+)$'
)
BACK = re.compile(rf"^worker\.backend_back {ADDRESS} after=\d+\.\ds$")


def _lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if getattr(record, "delayq", {}).get("event") == event
    ]


@contextlib.asynccontextmanager
async def _serving(worker: Worker) -> AsyncIterator[None]:
    """``worker`` serving in a task of its own while the block runs; stopped after."""
    serving = asyncio.create_task(worker.serve())
    try:
        yield
    finally:
        worker.stop()
        await asyncio.wait_for(serving, 20)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_worker_rides_out_a_redis_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    redis = RedisProcess(tmp_path, ACL)
    redis.start()
    ran: list[Any] = []

    def handler(msg: Message) -> None:
        ran.append(msg.payload)

    async def main() -> None:
        async with AsyncQueue(f"redis://app:hunter2@127.0.0.1:{redis.port}/0") as queue:
            worker = Worker(queue, handler)
            async with _serving(worker):
                await queue.put("before")
                await wait_for(lambda: ran == ["before"])
                redis.kill()
                # Once its waiting reserve gives up, the worker tries with a doubling
                # pause: a try a second would be 3 lines or more in 2.5 s.
                await wait_for(lambda: _lines(caplog, "worker.backend_unavailable"), 20)
                await asyncio.sleep(2.5)
                down = _lines(caplog, "worker.backend_unavailable")
                assert 1 <= len(down) <= 3, down
                steps = []
                for line in down:
                    match = UNAVAILABLE.match(line)
                    assert match is not None, line
                    steps.append(match.group(1))
                assert steps == ["1s", "2s", "4s"][: len(steps)]

                await asyncio.to_thread(redis.start)
                await wait_for(lambda: _lines(caplog, "worker.backend_back"), 20)
                await queue.put("after")
                await wait_for(lambda: ran == ["before", "after"])

    try:
        asyncio.run(main())
    finally:
        redis.stop()
    back = _lines(caplog, "worker.backend_back")
    assert len(back) == 1
    assert BACK.match(back[0]), back
    assert "hunter2" not in caplog.text
    assert "reserve_failed" not in caplog.text
    # The backend's own reconnects say it once each (its listener, a waiting reserve).
    lost = [r for r in caplog.records if r.levelno >= logging.WARNING and "lost" in r.getMessage()]
    assert len(lost) <= 2, [r.getMessage() for r in lost]


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["sync", "async"])  # the fast path; a job (task) each
@pytest.mark.parametrize(
    ("ends", "event"), [("returns", "job.ack_failed"), ("raises", "job.unsettled")]
)
def test_an_ack_or_a_nack_cut_by_an_outage_is_logged_and_the_message_runs_again(
    kind: str, ends: str, event: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server dies while the handler runs: its ack (or its nack) fails. One line
    names that, on both paths alike; once the server is back (its data kept) and the
    lease ran out, the message runs again, as its second attempt."""
    caplog.set_level(logging.INFO, logger="delayq")
    redis = RedisProcess(tmp_path, ("--save", "", "--appendonly", "yes", "--appendfsync", "always"))
    redis.start()
    attempts: list[int] = []

    def run(msg: Message) -> None:
        attempts.append(msg.attempts)
        if len(attempts) == 1:
            redis.kill()
            if ends == "raises":
                raise RuntimeError("handler failed")

    async def run_async(msg: Message) -> None:
        run(msg)

    async def main() -> None:
        async with AsyncQueue(redis.url, name="q") as queue:
            worker = Worker(queue, run if kind == "sync" else run_async, lease=1.0)
            async with _serving(worker):
                await queue.put("job", id="j")
                await wait_for(lambda: _lines(caplog, event), 20)
                await asyncio.to_thread(redis.start)
                await wait_for(lambda: worker.counts["succeeded"] == 1, 30)

    try:
        asyncio.run(main())
    finally:
        redis.stop()
    assert attempts == [1, 2]
    [logged] = [r for r in caplog.records if getattr(r, "delayq", {}).get("event") == event]
    assert (logged.delayq["queue"], logged.delayq["id"]) == ("q", "j")  # type: ignore[attr-defined]
    assert "error=" in logged.getMessage()
    for other in ("job.ack_failed", "job.unsettled", "job_crashed", "never retrieved"):
        if other != event:
            assert other not in caplog.text


def test_loops_that_share_an_outage_log_each_step_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    changes: list[str | None] = []
    outage = Outage(
        "redis://app:hunter2@db:6379/0",
        event_prefix="worker",
        first=0.05,
        longest=0.2,
        on_change=changes.append,
    )
    refused = ConnectionRefusedError(111, "Connection refused")
    pauses = []
    for _ in range(4):
        pauses.append(outage.failed(refused, failed_event="worker.reserve_failed"))
        # Another loop failing within the same pause waits for the same moment.
        assert 0 < outage.failed(refused, failed_event="worker.reserve_failed") <= pauses[-1]
        time.sleep(pauses[-1])
    assert pauses == [0.05, 0.1, 0.2, 0.2]
    down = _lines(caplog, "worker.backend_unavailable")
    assert [line.rsplit(" ", 1)[1] for line in down] == [
        "retry_in=0.05s",
        "retry_in=0.1s",
        "retry_in=0.2s",
        "retry_in=0.2s",
    ]
    assert all(
        line.startswith("worker.backend_unavailable url=redis://app:***@db:6379/0 "
                        "error=ConnectionRefusedError ")
        for line in down
    )  # fmt: skip
    assert outage.down
    outage.answered()
    outage.answered()
    assert not outage.down
    assert len(_lines(caplog, "worker.backend_back")) == 1
    assert changes == ["ConnectionRefusedError"] * 4 + [None]
    # Not an outage but a bug: backed off the same way, logged with its traceback.
    assert outage.failed(TypeError("bad"), failed_event="worker.reserve_failed", queue="q") == 0.05
    (bug,) = [
        r
        for r in caplog.records
        if getattr(r, "delayq", {}).get("event") == "worker.reserve_failed"
    ]
    assert bug.getMessage() == "worker.reserve_failed queue=q retry_in=0.05s"
    assert bug.exc_info is not None
    assert "hunter2" not in caplog.text
