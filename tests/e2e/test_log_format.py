"""``--log-format json`` on the long-running commands, run as a user runs them: every
line a ``delayq worker``, ``delayq serve`` or ``delayq scheduler`` process writes on
stderr is one JSON object with its time, level, logger, process and event, and the
fields its log call carries as keys (a failed job's id, queue, task and attempt, its
traceback as ``exception``; uvicorn's access log with its request)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from delayq import Queue

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

APP = """
from delayq import App

app = App()  # $DELAYQ_URL


@app.task(queue="jobs", max_attempts=1)
def boom(n):
    raise ValueError(f"bad {n}")
"""


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e225e"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Logged:
    """A ``delayq`` process and the lines of its stderr, read as they come."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", *args],
            cwd=cwd,
            env={**os.environ, "COLUMNS": "200", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.out: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(pipe, into), daemon=True)
            for pipe, into in ((self.process.stderr, self.lines), (self.process.stdout, self.out))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: object, into: list[str]) -> None:
        assert pipe is not None
        into.extend(pipe)  # type: ignore[call-overload]

    def wait_for(self, found: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not found():
            assert self.process.poll() is None, "".join(self.lines)
            assert time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.02)

    def stop(self) -> list[dict[str, object]]:
        """SIGTERM, exit 0, and every stderr line as JSON."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=30) == 0, "".join(self.lines)
        for reader in self._readers:
            reader.join(timeout=10)
        return [_parsed(line) for line in self.lines]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _parsed(line: str) -> dict[str, object]:
    record = json.loads(line)
    assert isinstance(record, dict), line
    for key in ("time", "level", "logger", "process", "event", "message"):
        assert key in record, line
    stamp = str(record["time"])
    assert stamp.endswith("Z"), stamp  # UTC
    assert len(stamp.rsplit(".", 1)[-1]) == len("123Z"), stamp  # milliseconds
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert parsed.utcoffset() == timedelta(0)
    return record


@pytest.fixture
def logged() -> Iterator[list[Logged]]:
    started: list[Logged] = []
    yield started
    for process in started:
        process.kill()


def _has(lines: list[str], text: str) -> Callable[[], bool]:
    return lambda: any(text in line for line in list(lines))


@pytest.mark.parametrize("processes", [1, 2])
def test_worker_logs_a_failed_job_as_json_with_its_fields(
    tmp_path: Path, logged: list[Logged], processes: int
) -> None:
    (tmp_path / "json_app.py").write_text(APP)
    env = {"DELAYQ_URL": f"sqlite:///{tmp_path / 'q.db'}"}
    # m1 in a caller's trace (the CLI takes $TRACEPARENT), m2 in none
    for n, id, trace in ((3, "m1", {"TRACEPARENT": PARENT}), (4, "m2", {})):
        put = subprocess.run(
            [sys.executable, "-m", "delayq.cli", "put", "jobs",
             json.dumps({"task": "boom", "args": [n], "kwargs": {}}), "--id", id],
            cwd=tmp_path, env={**os.environ, **env, **trace}, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        assert put.returncode == 0, put.stderr
    args = ["worker", "json_app:app", "--log-format", "json", "--processes", str(processes)]
    worker = Logged(args, tmp_path, env)
    logged.append(worker)
    worker.wait_for(lambda: sum("job.failed" in line for line in list(worker.lines)) == 2)
    records = worker.stop()
    [failed, untraced] = sorted(
        (r for r in records if r["event"] == "job.failed"), key=lambda r: str(r["id"])
    )
    # the line's trace id is the message's (no SDK here: no span of the run, no span_id)
    assert (failed["trace_id"], "span_id" in failed) == (TRACE_ID, False)
    assert untraced["id"] == "m2"
    assert "trace_id" not in untraced
    assert "span_id" not in untraced
    if processes == 1:
        assert {r["process"] for r in records} == {worker.process.pid}
    else:  # the supervisor's lines and its children's, each with its own pid
        children = {r["pid"] for r in records if r["event"] == "supervisor.child_started"}
        assert len(children) == processes
        assert failed["process"] in children
        assert worker.process.pid in {r["process"] for r in records}
        assert {r["process"] for r in records} <= {worker.process.pid, *children}
    assert failed["level"] == "ERROR"
    assert failed["logger"] == "delayq"
    assert (failed["id"], failed["queue"], failed["task"]) == ("m1", "jobs", "boom")
    assert (failed["attempt"], failed["state"]) == (1, "dead")
    exception = str(failed["exception"])
    assert exception.startswith("Traceback (most recent call last):")
    assert 'raise ValueError(f"bad {n}")' in exception
    assert exception.endswith("ValueError: bad 3")
    assert "delayq/runtime" not in exception  # the trimmed traceback: the user's frames
    assert "worker.stopped" in {r["event"] for r in records}


def test_worker_lines_carry_the_trace_and_span_of_the_run_under_an_sdk(
    tmp_path: Path, logged: list[Logged]
) -> None:
    """With an SDK in the worker's app, a run's lines carry its ``process`` span's
    trace and span ids: the caller's trace when the message has one, else the run's own."""
    pytest.importorskip("opentelemetry.sdk")
    from tracing.test_worker_process import APP as TRACED_APP  # noqa: PLC0415

    (tmp_path / "traced_app.py").write_text(textwrap.dedent(TRACED_APP))
    spans = tmp_path / "spans.jsonl"
    spans.touch()
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with Queue(url, name="jobs") as queue:
        envelope = {"task": "work", "args": [1], "kwargs": {}}
        queue.put(envelope, id="ok", headers={"traceparent": PARENT})
        queue.put({**envelope, "task": "fail"}, id="bad")  # no trace context
    worker = Logged(
        ["worker", "traced_app:app", "--log-format", "json"], tmp_path,
        {"DELAYQ_URL": url, "SPANS": str(spans)},
    )  # fmt: skip
    logged.append(worker)
    worker.wait_for(_has(worker.lines, "job.failed"))
    worker.wait_for(_has(worker.lines, "job.succeeded"))
    records = {r["id"]: r for r in worker.stop() if r["event"] in ("job.succeeded", "job.failed")}
    runs = {
        span["attributes"]["messaging.message.id"]: span["context"]
        for span in map(json.loads, spans.read_text().splitlines())
        if span["name"] == "process jobs"
    }
    for id in ("ok", "bad"):
        line, run = records[id], runs[id]
        assert (f"0x{line['trace_id']}", f"0x{line['span_id']}") == (
            run["trace_id"], run["span_id"],
        )  # fmt: skip
    assert records["ok"]["trace_id"] == TRACE_ID  # the caller's trace
    assert records["bad"]["trace_id"] != TRACE_ID  # a trace of its own


def test_serve_logs_uvicorn_and_the_access_log_as_json(
    tmp_path: Path, logged: list[Logged]
) -> None:
    pytest.importorskip("uvicorn")
    env = {"DELAYQ_URL": f"sqlite:///{tmp_path / 'q.db'}", "DELAYQ_LOG_FORMAT": "json"}
    server = Logged(["serve", "--port", "0", "--access-log"], tmp_path, env)
    logged.append(server)
    server.wait_for(_has(server.out, "dashboard: "))
    [address] = [line.split()[-1] for line in server.out if line.startswith("dashboard: ")]
    with urllib.request.urlopen(f"{address}healthz?probe=1", timeout=10) as response:
        assert response.status == 200
    server.wait_for(_has(server.lines, "/healthz"))
    records = server.stop()
    loggers = {r["logger"] for r in records}
    assert {"delayq", "uvicorn.error", "uvicorn.access"} <= loggers
    [access] = [r for r in records if r["logger"] == "uvicorn.access"]
    assert (access["method"], access["path"], access["status"]) == ("GET", "/healthz?probe=1", 200)
    assert "dispatch.started" in {r["event"] for r in records}


def test_scheduler_logs_as_json(tmp_path: Path, logged: list[Logged]) -> None:
    pytest.importorskip("aiormq")
    from conformance.conftest import amqp_url  # noqa: PLC0415

    for url in amqp_url(tmp_path):
        plain = url.replace("&scheduler=on", "")
        scheduler = Logged(["scheduler", "--log-format", "json"], tmp_path, {"DELAYQ_URL": plain})
        logged.append(scheduler)
        scheduler.wait_for(_has(scheduler.lines, "scheduler_elected"))
        records = scheduler.stop()
        events = {r["event"] for r in records}
        assert {"scheduler_process_started", "scheduler_elected"} <= events
        [started] = [r for r in records if r["event"] == "scheduler_process_started"]
        assert started["pid"] == scheduler.process.pid
        assert "guest:guest" not in json.dumps(records)  # the URL redacted, as in text
