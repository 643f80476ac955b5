"""``delayq scheduler``: a process that is only the scheduler of an amqp:// or kafka://
namespace, so producers and consumers that never stand get served; and the startup
check of the long-running commands on a namespace that has no scheduler yet."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from conformance.conftest import amqp_url, drop_amqp_shards, kafka_fresh_url
from delayq import Queue
from delayq.backends._replicated._options import shard_of
from delayq.cli._common import check_backend
from delayq.durable.registry import redact_url
from delayq.errors import NoScheduler

from ._helpers import Cli, one_error_line

pytest.importorskip("aiormq")
pytest.importorskip("pika")

from backends import _amqp_mistakes, _kafka_mistakes


@pytest.fixture(params=["amqp", "kafka"])
def plain_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh amqp:// or kafka:// namespace, its URL as a user writes it (no scheduler
    option)."""
    if request.param == "kafka":
        yield from kafka_fresh_url(tmp_path)
        return
    for url in amqp_url(tmp_path):
        yield url.replace("&scheduler=on", "")


def test_only_a_replicated_backend_has_a_scheduler(tmp_path: Path) -> None:
    result = Cli(f"sqlite:///{tmp_path / 'q.db'}")("scheduler")
    assert result.exit_code == 2
    assert "only amqp://, amqps:// and kafka:// have an elected scheduler" in one_error_line(result)


def test_a_scheduler_that_ends_gives_its_caller_back_the_signal_handlers_it_found(
    tmp_path: Path,
) -> None:
    """Run in a caller's process (click's runner, an app that embeds the CLI), the
    command sets its SIGTERM / SIGINT handlers while it runs and puts back what it found
    when it ends, here on a broker that is down."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    down = "amqp://guest:guest@127.0.0.1:1/?request_timeout=0.5"
    result = Cli(down)("scheduler")
    assert result.exit_code == 1, result.output
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_scheduler_process_serves_clients_that_never_stand(plain_url: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "scheduler", "--url", plain_url],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1"},
    )
    try:
        with Queue(plain_url, name="jobs", scheduler="off", request_timeout=1) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.stats()
                    break
                except OSError:  # no scheduler stands, or none is elected yet
                    assert process.poll() is None, process.communicate()[1]
                    assert time.monotonic() < deadline
            id = client.put("hello")
            [message] = client.reserve(wait=0)
            assert message.id == id
            client.ack(message)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # its fault handler prints its stacks
            _, err = process.communicate(timeout=10)
            pytest.fail(f"still running 30 s after SIGTERM:\n{err}")
    assert process.returncode == 0, err
    assert "scheduler_elected" in err


def test_the_startup_check_passes_on_a_namespace_without_a_scheduler(plain_url: str) -> None:
    check_backend(plain_url, "jobs", 20.0)  # raises CliError when it does not answer


def test_a_scheduler_whose_startup_check_fails_exits_1_with_nothing_left_running(
    plain_url: str,
) -> None:
    """A candidate that stands and never serves (a scheduler that hangs) holds the
    election: the start-up check gets no answer within the request timeout, and the
    command exits 1 with its error; the candidacy it was renewing on a new connection
    ends with the queue's close, quietly (no "Task exception was never retrieved")."""
    url = f"{plain_url}&request_timeout=0.5"
    mistakes = _kafka_mistakes if url.startswith("kafka:") else _amqp_mistakes
    with mistakes.mute_candidate(url):
        run = subprocess.run(
            [sys.executable, "-m", "delayq.cli", "scheduler", "--url", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "COLUMNS": "200"},
        )
    assert run.returncode == 1, run.stderr
    assert "scheduler_process_stopped" in run.stderr
    assert "error: " in run.stderr
    assert "never retrieved" not in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


class _Logged:
    """A ``delayq scheduler`` process and the lines it logged, read as they come."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "scheduler"],
            stderr=subprocess.PIPE,
            text=True,
            # PYTHONFAULTHANDLER: one that hangs prints its threads' stacks on SIGABRT.
            env={**os.environ, "COLUMNS": "200", "DELAYQ_URL": url, "PYTHONFAULTHANDLER": "1"},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        self.lines.extend(self.process.stderr)

    def events(self) -> list[str]:
        """The delayq events logged so far, in order (``scheduler_elected``...)."""
        found = (re.search(r" delayq: (\w+)", text) for text in list(self.lines))
        return [event.group(1) for event in found if event]

    def wait_for(self, event: str, count: int = 1) -> None:
        deadline = time.monotonic() + 30
        while self.events().count(event) < count:
            assert self.process.poll() is None or self._reader.is_alive(), self.lines
            assert time.monotonic() < deadline, (event, self.lines)
            time.sleep(0.02)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(10)
            self._reader.join(10)
            pytest.fail("still running 30 s after SIGTERM:\n" + "".join(self.lines))
        self._reader.join(10)
        return code


def test_a_scheduler_logs_its_start_election_hand_over_and_stop(plain_url: str) -> None:
    first = _Logged(plain_url)
    second: _Logged | None = None
    try:
        first.wait_for("scheduler_elected")
        second = _Logged(plain_url)
        second.wait_for("scheduler_standing")
        if plain_url.startswith("kafka:"):
            _kafka_mistakes.wait_for_members(plain_url, 2)  # its join done
        assert "scheduler_elected" not in second.events()  # the first leads
        assert first.stop() == 0
        assert first.events() == [
            "scheduler_process_started",
            "scheduler_elected",
            "scheduler_standing",
            "scheduler_stepped_down",
            "scheduler_process_stopped",
        ] or first.events() == [
            "scheduler_process_started",
            "scheduler_standing",
            "scheduler_elected",
            "scheduler_stepped_down",
            "scheduler_process_stopped",
        ], first.lines
        [started] = [text for text in first.lines if "scheduler_process_started" in text]
        assert redact_url(plain_url) in started
        assert "guest:guest@" not in started
        assert "signal=SIGTERM" in first.lines[-1]
        second.wait_for("scheduler_elected")  # the hand-over
        assert second.stop() == 0
        assert second.events()[-2:] == ["scheduler_stepped_down", "scheduler_process_stopped"]
    finally:
        for logged in (first, second):
            if logged is not None and logged.process.poll() is None:
                logged.process.kill()
                logged.process.wait(10)


def _with(url: str, **options: object) -> str:
    """``url`` with ``options`` set in its query (replaced where it has them)."""
    parts = urlsplit(url)
    query = {**dict(parse_qsl(parts.query)), **{k: str(v) for k, v in options.items()}}
    return urlunsplit(parts._replace(query=urlencode(query)))


def _elected(logged: _Logged) -> list[str]:
    """The namespaces ``logged`` was elected for, in order."""
    found = (re.search(r"scheduler_elected .*namespace=(\S+)", text) for text in logged.lines)
    return [namespace.group(1) for namespace in found if namespace]


def test_a_sharded_namespace_has_an_election_a_shard_and_a_shard_out_stops_only_its_queues(
    plain_url: str,
) -> None:
    """``shards=3``: each shard is a namespace of its own (``<prefix>.<k>``) with its own
    election. One ``delayq scheduler`` stands for shard 0 (``scheduler_shards=0``),
    another for shards 1 and 2, and each is elected for exactly those. A client that
    stands for none is served on a queue of every shard, and ``queues()`` lists them
    all; a queue's messages are in its shard's namespace, where a client of that
    namespace alone sees them. Once shard 0's scheduler stops, a call on its queue gets
    no scheduler, while the queues of the other shards are served as before."""
    url = _with(plain_url, shards=3)
    prefix = dict(parse_qsl(urlsplit(url).query))["prefix"]
    names = [next(f"q{i}" for i in range(100) if shard_of(f"q{i}", 3) == k) for k in range(3)]
    first = _Logged(_with(url, scheduler_shards=0))
    second = _Logged(_with(url, scheduler_shards="1,2"))
    try:
        first.wait_for("scheduler_elected")
        second.wait_for("scheduler_elected", 2)
        assert _elected(first) == [f"{prefix}.0"], first.lines
        assert sorted(_elected(second)) == [f"{prefix}.1", f"{prefix}.2"], second.lines
        client = _with(url, scheduler="off", request_timeout=3)
        for name in names:
            with Queue(client, name=name) as queue:
                queue.put(name, id="one")
                assert queue.get("one") is not None
        with Queue(client, name=names[0]) as queue:
            assert queue.queues() == sorted(names)
        one_shard = _with(plain_url, prefix=f"{prefix}.1", scheduler="off")
        with Queue(one_shard, name=names[1]) as queue:
            assert queue.stats().ready == 1
            assert queue.queues() == [names[1]]
        assert first.stop() == 0
        with Queue(client, name=names[0]) as gone, Queue(client, name=names[2]) as served:
            with pytest.raises(NoScheduler):
                gone.stats()
            assert served.stats().ready == 1
        assert second.stop() == 0
    finally:
        for logged in (first, second):
            if logged.process.poll() is None:
                logged.process.kill()
                logged.process.wait(10)
        if url.startswith("amqp"):
            drop_amqp_shards(url, 3)
