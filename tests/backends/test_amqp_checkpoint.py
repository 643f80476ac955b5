"""Checkpoints and retention of ``amqp://`` (docs/rabbitmq.md, "Checkpoints and
retention"): a new scheduler replays from the last checkpoint's pointer and rebuilds
the same state; a log several times its retention loses no live message; a put that
would outgrow a quarter of the retention is refused as an outage; a scheduler killed
in the middle of a checkpoint leaves a log its successor replays from the previous
pointer, every put there exactly once; a namespace declared without retention says
what to do.

On the shared RabbitMQ, each test under a namespace of its own (deleted afterwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from delayq.backends._replicated._scheduler import _checkpoints
from delayq.durable import Message, Queue, State

pika = pytest.importorskip("pika")
pytest.importorskip("aiormq")

from conformance.conftest import amqp_url  # noqa: E402

#: The smallest retention the backend takes: checkpoints start every ~62 KB of log.
SMALL = 1_000_000


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [
        getattr(record, "delayq", {})
        for record in caplog.records
        if record.getMessage().split(" ", 1)[0] == name
    ]


def state_of(queue: Queue, ids: list[str]) -> tuple[Any, ...]:
    """What a user can see of ``queue`` (stats without the lag, which moves)."""
    stats = queue.stats()
    return (
        (stats.scheduled, stats.ready, stats.active, stats.dead, stats.next_due_at),
        queue.peek(limit=1000),
        queue.peek("active", limit=1000),
        queue.dead(limit=1000),
        [queue.get(id) for id in ids[::5]],
    )


def work(queue: Queue, ids: list[str], held: list[Message], round: int) -> None:
    """A round of what users do: puts, a put that replaces, reserves, an ack, nacks to
    scheduled and to dead, an extend (the message added to ``held``), a cancel, a
    reschedule, now and then a retry of the dead; the ids put added to ``ids``."""
    new = queue.put_many(
        [
            {"payload": f"{round}-{n}-" + "x" * 100, "delay": 60 if n % 2 == 0 else 0}
            for n in range(10)
        ]
    )
    ids += new
    queue.put({"replaced": round}, id=new[0], on_conflict="replace", delay=30)
    got = queue.reserve(max=4, lease=60)
    assert len(got) == 4
    queue.ack(got[0])
    assert queue.nack(got[1], delay=0) is State.SCHEDULED
    assert queue.nack(got[2], dead=True, error=f"boom {round}") is State.DEAD
    queue.extend(got[3], lease=120)
    held.append(got[3])
    assert queue.cancel(new[2])
    assert queue.reschedule(new[4], delay=90)
    if round % 7 == 3:
        assert queue.retry_dead([got[2].id]) == 1


def prefix_of(url: str) -> str:
    """The namespace (``prefix``) of a test URL."""
    return url.split("prefix=", 1)[1].split("&", 1)[0]


def meta_messages(url: str) -> list[tuple[str, bytes]]:
    """``(type, body)`` of every message of the namespace's meta stream."""
    return stream_messages(url, "meta")


#: How long a stream's first message may take to arrive (a stream consumer's start, on
#: a loaded machine, took more than a second), and the quiet that ends the reading after it.
FIRST_DELIVERY, QUIET = 10.0, 1.0


def stream_messages(url: str, stream: str) -> list[tuple[str, bytes]]:
    """``(type, body)`` of every message of the namespace's stream ``stream`` (an empty
    stream costs :data:`FIRST_DELIVERY`)."""
    prefix = prefix_of(url)
    base = url.split("?", 1)[0]
    connection = pika.BlockingConnection(pika.URLParameters(base))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        found: list[tuple[str, bytes]] = []
        give_up = time.monotonic() + FIRST_DELIVERY
        for method, properties, body in channel.consume(
            f"{prefix}.{stream}", arguments={"x-stream-offset": "first"}, inactivity_timeout=QUIET
        ):
            if method is None:
                if not found and time.monotonic() < give_up:
                    continue
                break
            channel.basic_ack(method.delivery_tag)
            found.append((properties.type, body))
        channel.cancel()
        return found
    finally:
        connection.close()


def pointed_into_the_log(url: str) -> bool:
    """Whether the last pointer published names an offset the log still holds."""
    pointers = [msgpack.unpackb(body) for kind, body in meta_messages(url) if kind == "pointer"]
    return bool(pointers) and pointers[-1][1] >= first_log_offset(url)


def first_log_offset(url: str) -> int:
    prefix = prefix_of(url)
    connection = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        for method, properties, _ in channel.consume(
            f"{prefix}.log", arguments={"x-stream-offset": "first"}, inactivity_timeout=5
        ):
            assert method is not None
            channel.cancel()
            return int(properties.headers["x-stream-offset"])
        raise AssertionError("the log is empty")
    finally:
        connection.close()


def test_a_new_scheduler_replays_from_the_pointer_and_rebuilds_the_same_state(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    url = f"{base}&retention_bytes={SMALL}"
    first = Queue(url, name="a")
    queues = [first, first.named("b")]
    ids: dict[str, list[str]] = {"a": [], "b": []}
    held: list[Message] = []
    for round in range(16):
        for queue in queues:
            work(queue, ids[queue.name], held, round)
    # The last sequence number, which no message carries once the probe is cancelled.
    probes = {}
    for queue in queues:
        probe = queue.put("probe", delay=60)
        probes[queue.name] = queue.get(probe)
        assert queue.cancel(probe)
    before = [state_of(queue, ids[queue.name]) for queue in queues]
    assert events(caplog, "checkpoint_written")

    with Queue(url, name="a") as second:  # a candidate, elected once first closes
        second.stats()
        first.close()
        again = [second, second.named("b")]
        assert [state_of(queue, ids[queue.name]) for queue in again] == before
        elected = events(caplog, "scheduler_elected")[-1]
        pointers = [body for kind, body in meta_messages(url) if kind == "pointer"]
        assert elected["start"] > 0  # not the log's first entry
        assert elected["start"] in [msgpack.unpackb(body)[1] for body in pointers]
        for queue in again:
            probe = probes[queue.name]
            next = queue.get(queue.put("next", delay=60))
            assert probe is not None
            assert next is not None
            assert next.seq == (probe.seq or 0) + 1
        for message in held:  # the leases and their tokens were rolled forward
            again[0 if message.queue == "a" else 1].ack(message)
        for queue in again:
            queue.purge()


def delete_meta(url: str) -> None:
    prefix = prefix_of(url)
    connection = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
    try:
        connection.channel().queue_delete(f"{prefix}.meta")
    finally:
        connection.close()


@pytest.mark.parametrize("pointer", ["kept", "lost"])
def test_a_log_several_times_its_retention_loses_no_live_message(
    base: str, pointer: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With the pointers lost too, the new scheduler finds the latest complete
    checkpoint in the log itself (the log's head is gone: no replay from its start)."""
    caplog.set_level(logging.INFO, logger="delayq")
    url = f"{base}&retention_bytes={2 * SMALL}"
    first = Queue(url, name="jobs")
    # Put once, never touched again: only checkpoints keep their images in the log.
    quiet = first.put_many(
        [{"payload": f"quiet {n}", "delay": 3600, "headers": {"n": str(n)}} for n in range(100)]
    )
    churn = [f"churn-{n}" for n in range(200)]
    for round in range(40):  # ~8 MB of log: four times the retention
        first.put_many(
            [
                {"id": id, "payload": f"{round} " + "y" * 1000, "on_conflict": "replace"}
                for id in churn
            ]
        )
    assert first_log_offset(url) > 0  # retention dropped the log's first segments
    if pointer == "kept":
        # A pointer is published once its checkpoint's begin is read back (up to
        # LOCATE_TIMEOUT each, one at a time): on a loaded machine, seconds after the
        # last put returned. What is tested is a replay from one the log still holds.
        deadline = time.monotonic() + 30
        while not pointed_into_the_log(url):
            assert time.monotonic() < deadline, "no pointer into the log"
    if pointer == "lost":
        # Stopped first: a scheduler publishes a checkpoint's pointer once it has
        # found its offset, which may be after the last put returned.
        first.close()
        delete_meta(url)
    with Queue(url, name="jobs") as second:
        second.stats()
        first.close()
        assert second.stats().scheduled == 100
        assert second.stats().ready == 200
        for n, id in enumerate(quiet):
            message = second.get(id)
            assert message is not None
            assert (message.payload, message.headers) == (f"quiet {n}", {"n": str(n)})
        for id in churn:
            message = second.get(id)
            assert message is not None
            assert message.payload == "39 " + "y" * 1000
        assert events(caplog, "scheduler_elected")[-1]["start"] > 0
        assert bool(events(caplog, "checkpoint_gone")) == (pointer == "lost")
        second.purge()


def test_checkpoints_go_on_while_a_pointer_is_slow_to_find(
    base: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint's begin whose offset is read slowly (a loaded broker: up to
    LOCATE_TIMEOUT) holds back no later checkpoint: while it is read, the next ones
    begin as the log grows, so a backlog of puts several times the retention still
    leaves a complete checkpoint in the log, and a new scheduler takes over with every
    message. (The second checkpoint used to wait for the first one's read before the
    next could begin: the log outgrew its retention with none in it, and no scheduler
    could take over.)"""
    caplog.set_level(logging.INFO, logger="delayq")
    locate = _checkpoints.Checkpoints._locate

    async def slow(self: _checkpoints.Checkpoints, appended: int, mark: str) -> int:
        await asyncio.sleep(3)
        return await locate(self, appended, mark)

    monkeypatch.setattr(_checkpoints.Checkpoints, "_locate", slow)
    url = f"{base}&retention_bytes={2 * SMALL}"
    churn = [f"churn-{n}" for n in range(200)]
    with Queue(url, name="jobs") as first:
        for round in range(40):  # ~8 MB of log: four times the retention
            first.put_many(
                [
                    {"id": id, "payload": f"{round} " + "y" * 1000, "on_conflict": "replace"}
                    for id in churn
                ]
            )
        assert first.stats().ready == 200  # every put folded into the log
        assert first_log_offset(url) > 0  # retention dropped the log's first segments
    with Queue(url, name="jobs") as second:
        assert second.stats().ready == 200
        for id in churn:
            message = second.get(id)
            assert message is not None
            assert message.payload == "39 " + "y" * 1000
        second.purge()


def connections(*columns: str) -> list[str]:
    """The broker's connections, a line of ``columns`` each (``rabbitmqctl``)."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", *columns, "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return listed.splitlines()


def open_channels(url: str) -> int:
    """How many channels the namespace's connections hold open, as the broker counts
    them (delayq names each connection ``delayq <prefix>``)."""
    named = f'{{"connection_name","delayq {prefix_of(url)}"}}'
    listed = connections("client_properties", "channels")
    return sum(int(line.rsplit("\t", 1)[1]) for line in listed if named in line)


def test_a_read_of_the_log_given_up_leaves_no_channel_open(
    base: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A checkpoint's pointer whose offset is not read in time (a slow broker) is
    published at its lower bound, and the read given up at any step (opening its
    channel, subscribing, reading) leaves no channel open: each would hold a consumer
    on the log for as long as the scheduler runs, up to the connection's limit."""

    caplog.set_level(logging.INFO, logger="delayq")
    url = f"{base}&retention_bytes={SMALL}"
    churn = [f"churn-{n}" for n in range(100)]

    def rounds(count: int) -> None:
        for round in range(count):  # a checkpoint every ~62 KB of log
            queue.put_many(
                [
                    {"id": id, "payload": f"{round} " + "y" * 1000, "on_conflict": "replace"}
                    for id in churn
                ]
            )

    with Queue(url, name="jobs") as queue:
        rounds(5)  # every channel a put and a checkpoint use is open
        before = open_channels(url)
        written = len(events(caplog, "checkpoint_written"))
        monkeypatch.setattr(_checkpoints, "LOCATE_TIMEOUT", 0.002)
        rounds(30)
        assert len(events(caplog, "checkpoint_written")) >= written + 10
        deadline = time.monotonic() + 10  # the last locate may still be reading
        while open_channels(url) != before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert open_channels(url) == before
        assert queue.stats().ready == 100
        assert [queue.get(id).payload for id in churn] == ["29 " + "y" * 1000] * 100  # type: ignore[union-attr]
        queue.purge()


def test_a_put_that_would_outgrow_a_quarter_of_the_retention_is_refused(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Queue(f"{base}&retention_bytes={SMALL}", name="jobs") as queue:
        queue.put_many([{"payload": "z" * 1000} for _ in range(150)])  # ~170 KB of 250
        with pytest.raises(OSError, match="quarter of the log's retention"):
            queue.put_many([{"payload": "z" * 1000} for _ in range(100)])
        assert queue.stats().ready == 150  # the refused batch stored nothing
        assert events(caplog, "put_refused")
        queue.purge()
        queue.put_many([{"payload": "z" * 1000} for _ in range(100)])
        assert queue.stats().ready == 100
        queue.purge()


def test_a_namespace_declared_without_retention_says_what_to_do(base: str) -> None:
    with Queue(f"{base}&retention_bytes=0", name="jobs") as old:
        old.put("kept")  # the log as it was declared before retention
        with Queue(base, name="jobs") as new, pytest.raises(ValueError, match="retention_bytes=0"):
            new.stats()
        assert old.stats().ready == 1
        old.purge()


CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from delayq.durable import Queue

    url, directory = sys.argv[1], Path(sys.argv[2])
    stopped, acked = directory / "stopped", directory / "acked"
    queue = Queue(url, name="jobs")
    churn = [f"c{n}" for n in range(3000)]  # 3 operations of images in a checkpoint
    queue.put_many([{"id": id, "payload": "x" * 100, "delay": 3600} for id in churn])
    after, round = 0, 0
    with acked.open("a") as out:
        while after < 5:
            if stopped.exists():
                after += 1
            queue.put_many(
                [
                    {"id": id, "payload": f"{round}", "delay": 3600, "on_conflict": "replace"}
                    for id in churn[(round % 30) * 100 : (round % 30 + 1) * 100]
                ]
            )
            new = queue.put_many([{"payload": round, "delay": 3600} for _ in range(10)])
            out.write("".join(f"{id}\\n" for id in new))
            out.flush()
            round += 1
            assert round < 2000, "no second checkpoint began"
    if sys.argv[3] == "close":
        queue.close()  # its connection closes in the middle of the checkpoint
    (directory / "ready").touch()
    time.sleep(600)
    """
)


@pytest.mark.parametrize("end", ["kill", "close"])
def test_a_scheduler_stopped_in_a_checkpoint_loses_and_doubles_nothing(
    base: str, end: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed (SIGKILL), or its connection closed, in the middle of a checkpoint."""
    caplog.set_level(logging.INFO, logger="delayq")
    url = f"{base}&retention_bytes={8 * SMALL}"
    # The scheduler's second checkpoint stops for good after its first operation of
    # images (test-only switch), so that the kill lands in it, every time.
    env = {**os.environ, "DELAYQ_TEST_CHECKPOINT_STOP": f"2:1:{tmp_path / 'stopped'}"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(tmp_path), end], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert child.poll() is None, "the child process failed"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    acked = (tmp_path / "acked").read_text().split()
    pointers = [msgpack.unpackb(body) for kind, body in meta_messages(url) if kind == "pointer"]
    assert len(pointers) == 1  # the first checkpoint's; the second never ended
    with Queue(url, name="jobs") as successor:
        assert successor.stats().scheduled == 3000 + len(acked)
        assert events(caplog, "scheduler_elected")[-1]["start"] == pointers[0][1]
        seen: list[str] = []
        after: tuple[int, ...] | None = None
        while True:
            page = successor.peek("scheduled", limit=1000, after=after)
            if not page:
                break
            seen += [message.id for message in page]
            last = page[-1]
            after = (last.due_at, last.seq or 0)
        assert len(seen) == len(set(seen)) == 3000 + len(acked)
        assert set(acked) <= set(seen)
        successor.purge()
