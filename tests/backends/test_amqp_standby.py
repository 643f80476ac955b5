"""The hot standby of ``amqp://`` (docs/rabbitmq.md, "Election"): a ``delayq scheduler``
that is not elected folds the log as it grows, so that when the elected one is killed
(SIGKILL) it folds only the log's tail, and every message is where it was (scheduled,
active, dead; due times, attempts, leases), the changes made right before the kill, the
checkpoints written while it followed and the fast puts not folded yet included; and
its takeover does not grow with the backlog as a cold one's does.

On the shared RabbitMQ, each test under a namespace of its own (deleted afterwards),
with ``delayq scheduler`` processes of its own, killed or stopped by their PIDs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.durable import Message, Queue, State

pytest.importorskip("pika")
pytest.importorskip("aiormq")

from backends.test_amqp_checkpoint import SMALL, state_of, work
from conformance.conftest import amqp_url


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    """A namespace of its own, its URL with no scheduler option (as a user writes it)."""
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace).replace("&scheduler=on", "")


class Scheduler:
    """A ``delayq scheduler`` process and the events it logged (JSON lines, DEBUG too:
    ``standby_caught_up`` without a collection), to a file of the test's."""

    def __init__(self, url: str, log: Path) -> None:
        self.log = log
        command = [sys.executable, "-m", "delayq.cli", "scheduler"]
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [*command, "--log-format", "json", "--log-level", "debug"],
                stderr=out,
                env={**os.environ, "DELAYQ_URL": url},
            )

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == name:
                    found.append(event)
        return found

    def wait_for(self, name: str, **fields: Any) -> dict[str, Any]:
        """The first event ``name`` (with ``fields``), once logged."""
        deadline = time.monotonic() + 120
        while True:
            for event in self.events(name):
                if all(event.get(key) == value for key, value in fields.items()):
                    return event
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, (name, self.log.read_text())
            time.sleep(0.02)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@contextlib.contextmanager
def schedulers(directory: Path) -> Iterator[Callable[[str], Scheduler]]:
    """Start a scheduler process on a URL (its log in ``directory``); each is stopped
    at the end."""
    started: list[Scheduler] = []

    def start(url: str) -> Scheduler:
        started.append(Scheduler(url, directory / f"scheduler-{len(started)}.log"))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            process.stop()


def test_a_hot_standby_that_followed_takes_over_with_every_message_where_it_was(
    base: str, tmp_path: Path
) -> None:
    url = f"{base}&retention_bytes={SMALL}"  # checkpoints every ~62 KB of log
    with schedulers(tmp_path) as start, Queue(f"{url}&scheduler=off", name="a") as queue:
        first = start(url)
        first.wait_for("scheduler_elected")
        second = start(url)
        second.wait_for("scheduler_standing")
        ids: list[str] = []
        held: list[Message] = []
        for round in range(16):
            work(queue, ids, held, round)
            ids += [queue.put(f"fast {round}-{n}", delay=90 + n) for n in range(5)]
        assert first.events("checkpoint_written")  # while the standby followed
        before = state_of(queue, ids)
        # Changed right before the kill: a fast put (maybe not folded yet), a reserve
        # with its lease, a nack to dead, a cancel.
        late = queue.put("late", delay=120)
        [claimed] = queue.reserve(max=1, lease=300)
        assert queue.nack(held.pop(), dead=True, error="late") is State.DEAD
        assert queue.cancel(ids[-1])
        last = state_of(queue, ids)
        first.kill()

        elected = second.wait_for("scheduler_elected")
        assert elected["standby"] == "hot"
        # It folded while the first worked: at its election, only the tail.
        assert elected["at_election"] < elected["entries"] / 2, elected
        assert state_of(queue, ids) == last
        assert last != before
        record = queue.get(late)
        assert record is not None
        assert record.state is State.SCHEDULED
        queue.ack(claimed)  # its lease and token came across
        for message in held:
            queue.ack(message)
        queue.purge()


def takeover(queue: Queue, elected: Scheduler, standby: Scheduler) -> float:
    """Kill ``elected`` (SIGKILL) and return the seconds until a put with its outcome is
    answered, by ``standby``."""
    killed = time.perf_counter()
    os.kill(elected.process.pid, signal.SIGKILL)
    queue.put("probe", delay=3600, on_conflict="error")  # a request, not a fast put
    seconds = time.perf_counter() - killed
    elected.kill()
    assert standby.wait_for("scheduler_elected")
    return seconds


def test_a_hot_standby_takes_over_a_backlog_much_faster_than_a_cold_one(
    base: str, tmp_path: Path
) -> None:
    """Within one run, on one backlog: the hot standby's takeover against a cold
    candidate's (which replays the log once elected, as every candidate did before)."""
    backlog = 100_000
    options = "&scheduler=off&request_timeout=120"
    with schedulers(tmp_path) as start, Queue(f"{base}{options}", name="jobs") as queue:
        first = start(base)
        first.wait_for("scheduler_elected")
        for _ in range(backlog // 1000):
            queue.put_many([{"payload": b"x" * 100, "delay": 3600}] * 1000)
        hot = start(base)  # the default of delayq scheduler
        hot.wait_for("standby_caught_up", messages=backlog)  # it folded the log
        hot_seconds = takeover(queue, first, hot)
        cold = start(f"{base}&standby=cold")
        cold.wait_for("scheduler_standing")
        cold_seconds = takeover(queue, hot, cold)
        assert cold.events("scheduler_elected")[0]["standby"] == "cold"
        assert queue.stats().scheduled == backlog + 2
        assert hot_seconds < cold_seconds / 3, (hot_seconds, cold_seconds)
        queue.purge()
