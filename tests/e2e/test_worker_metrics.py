"""``delayq worker --metrics-port``: what Prometheus scrapes, from a real worker process
over a real backend. Runs counted by task and outcome after real runs (succeeded,
retried, failed, timeout, dead, discarded), the run time and lateness histograms,
the messages in flight, an outage of its Redis (a private ``redis-server`` the test
kills) counted and shown; with ``--processes 2`` one page adds the children up, and a
child killed leaves its counts in it; bad ports are one line at start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _worker_process import Samples, WorkerProcess, worker_processes

from backends._redis_server import RedisProcess

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

APP = """
import os
import time

from delayq import App, Discard, Retry, RetryPolicy, current_message

app = App()  # $DELAYQ_URL
QUICK = RetryPolicy(max_attempts=2, base=0.05, jitter=0.0)


@app.task(queue="jobs")
def ok():
    with open(os.environ["PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\\n")


@app.task(queue="jobs")
def again():
    if current_message().attempts == 1:
        raise Retry(0.05, "not yet")


@app.task(queue="jobs", backoff=QUICK)
def boom():
    raise ValueError("boom")


@app.task(queue="jobs", backoff=QUICK, timeout=0.05)
def late():
    time.sleep(0.3)


@app.task(queue="jobs")
def gone():
    raise Discard("no such order")


@app.task(queue="jobs")
def hold():
    while not os.path.exists(os.environ["RELEASE"]):
        time.sleep(0.01)
"""


def runs(samples: Samples, task: str, outcome: str) -> float:
    key = (("outcome", outcome), ("queue", "jobs"), ("task", task))
    return samples.get(("delayq_runs_total", key), 0.0)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


workers = worker_processes()


def metered(root: Path, url: str, *args: str, health: bool = False) -> WorkerProcess:
    """A worker of APP with ``--metrics-port`` (and ``--health-port``, on the same port)."""
    return WorkerProcess(
        root, url, APP, *args, metrics=True, health=health,
        PIDS=str(root / "pids"), RELEASE=str(root / "release"),
    )  # fmt: skip


def test_runs_by_outcome_run_time_lateness_and_in_flight(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = metered(tmp_path, f"sqlite:///{tmp_path / 'q.db'}", health=True)
    workers.append(worker)
    worker.wait_for(lambda s: value(s, "delayq_backend_up") == 1.0)
    assert worker.get("/readyz")[0] == 200  # one port answers the probes and the metrics
    worker.put("ok", delay=0.3)
    worker.put("ok")
    for task in ("again", "boom", "late", "gone"):
        worker.put(task)
    worker.put("hold")
    samples = worker.wait_for(
        lambda s: (
            runs(s, "boom", "dead") + runs(s, "late", "dead") == 2
            and runs(s, "ok", "succeeded") + runs(s, "again", "succeeded") == 3
            and runs(s, "gone", "discarded") == 1
        )
    )
    assert runs(samples, "again", "retried") == 1  # the first attempt
    assert runs(samples, "boom", "failed") == 1  # the first attempt, then dead
    assert runs(samples, "late", "timeout") == 1
    assert value(samples, "delayq_acks_total", queue="jobs") == 3
    assert value(samples, "delayq_nacks_total", queue="jobs") == 6
    assert value(samples, "delayq_dead_total", queue="jobs") == 3
    assert value(samples, "delayq_in_flight") == 1  # hold runs until released
    # Every run that ended was timed; "late" ran past its 50 ms timeout both times.
    late = (("queue", "jobs"), ("task", "late"))
    assert samples[("delayq_run_seconds_count", late)] == 2
    assert samples[("delayq_run_seconds_bucket", (("le", "0.025"), *late))] == 0
    assert samples[("delayq_run_seconds_sum", late)] >= 0.1
    # Lateness: one observation per run that ended, from its due time (the delayed
    # one's 300 ms after its put) to its start.
    jobs = (("queue", "jobs"),)
    assert samples[("delayq_lateness_seconds_count", jobs)] == 9
    assert samples[("delayq_lateness_seconds_bucket", (("le", "5.0"), *jobs))] == 9
    assert 0 <= samples[("delayq_lateness_seconds_sum", jobs)] < 10
    (tmp_path / "release").touch()
    samples = worker.wait_for(lambda s: runs(s, "hold", "succeeded") == 1)
    assert value(samples, "delayq_in_flight") == 0
    worker.stop()


def test_an_outage_of_its_redis_is_counted_and_shown(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    redis = RedisProcess(tmp_path)
    redis.start()
    try:
        worker = metered(tmp_path, redis.url)
        workers.append(worker)
        worker.wait_for(lambda s: value(s, "delayq_backend_up") == 1.0)
        assert worker.get("/healthz")[0] == 404  # a metrics port without the probes
        redis.kill()
        samples = worker.wait_for(lambda s: value(s, "delayq_backend_up") == 0.0)
        assert value(samples, "delayq_backend_outages_total") == 1
        redis.start()
        worker.wait_for(lambda s: value(s, "delayq_backend_up") == 1.0)
        worker.put("ok")
        samples = worker.wait_for(lambda s: runs(s, "ok", "succeeded") == 1)
        assert value(samples, "delayq_backend_outages_total") == 1  # one outage, over
        worker.stop()
    finally:
        redis.stop()


def test_processes_are_added_up_and_a_dead_child_keeps_its_counts(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    worker = metered(tmp_path, url, "--processes", "2", health=True)
    workers.append(worker)
    worker.wait_for(lambda s: value(s, "delayq_backend_up") == 1.0)
    assert worker.get("/healthz")[0] == 200  # the supervisor answers both on one port
    for _ in range(6):
        worker.put("ok")
    samples = worker.wait_for(lambda s: runs(s, "ok", "succeeded") == 6)
    assert samples[("delayq_lateness_seconds_count", (("queue", "jobs"),))] == 6
    pids = (tmp_path / "pids").read_text().split()
    os.kill(int(pids[0]), signal.SIGKILL)  # its counts stay in the total
    deadline = time.monotonic() + 30
    while worker.get("/readyz")[0] == 200:  # until the supervisor saw it die
        assert time.monotonic() < deadline
        time.sleep(0.02)
    worker.put("ok")
    samples = worker.wait_for(lambda s: runs(s, "ok", "succeeded") == 7)
    assert value(samples, "delayq_acks_total", queue="jobs") == 7
    worker.stop()


def test_a_busy_or_invalid_metrics_port_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "worker_app.py").write_text(APP)
    env = {**os.environ, "DELAYQ_URL": f"sqlite:///{tmp_path / 'q.db'}"}
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        for args, code, line in (
            (["--metrics-port", str(port)], 1,
             f"error: cannot listen on http://127.0.0.1:{port}/: the port is in use: "
             "stop what holds it, or choose another with --metrics-port"),
            (["--metrics-port", "70000"], 2,
             "error: Invalid value for '--metrics-port': 70000 is not in the range "
             "0<=x<=65535. (see 'delayq worker --help')"),
            (["--metrics-port", "9", "--metrics-host", "192.0.2.1"], 1,
             "error: cannot listen on http://192.0.2.1:9/: that address is not one of "
             "this machine's: check --metrics-host"),
        ):  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "delayq.cli", "worker", "worker_app:app", *args],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == code, done.stderr
            assert done.stderr.strip().splitlines() == [line]


#: APP, with an OpenTelemetry SDK meter provider set by the app module as a user's
#: would: a reader exporting to $OTEL_OUT every 100 ms (one JSON object a line).
OTEL_APP = (
    """
import os

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

exporter = ConsoleMetricExporter(
    out=open(os.environ["OTEL_OUT"], "a", buffering=1),
    formatter=lambda data: data.to_json(indent=None) + "\\n",
)
reader = PeriodicExportingMetricReader(exporter, export_interval_millis=100)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
"""
    + APP
)


def exported(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The last export's data points, by instrument name."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return {}
    return {
        metric["name"]: metric["data"]["data_points"]
        for resource in json.loads(lines[-1])["resource_metrics"]
        for scope in resource["scope_metrics"]
        for metric in scope["metrics"]
    }


def test_a_worker_process_reports_through_the_meter_provider_its_app_sets(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    out = tmp_path / "otel.jsonl"
    out.touch()
    worker = WorkerProcess(
        tmp_path, f"sqlite:///{tmp_path / 'q.db'}", OTEL_APP, metrics=True,
        PIDS=str(tmp_path / "pids"), RELEASE=str(tmp_path / "release"), OTEL_OUT=str(out),
    )  # fmt: skip
    workers.append(worker)
    worker.wait_for(lambda s: value(s, "delayq_backend_up") == 1.0)
    for task in ("ok", "ok", "boom"):
        worker.put(task)

    def runs_of(points: dict[str, list[dict[str, Any]]]) -> dict[tuple[str, str], int]:
        return {
            (p["attributes"]["messaging.delayq.task"], p["attributes"]["messaging.delayq.outcome"]):
            p["value"] for p in points.get("delayq.runs", [])
        }  # fmt: skip

    def done() -> dict[str, list[dict[str, Any]]] | None:
        points = exported(out)
        counted = runs_of(points)
        return (
            points
            if (counted.get(("ok", "succeeded")), counted.get(("boom", "dead"))) == (2, 1)
            else None
        )

    points = worker.until(done)
    samples = worker.scrape()
    for (task, outcome), count in runs_of(points).items():
        assert runs(samples, task, outcome) == count  # the same counts as /metrics
    assert runs_of(points)[("boom", "failed")] == 1
    jobs = {"messaging.destination.name": "jobs"}
    for name, prometheus in (("delayq.acks", "delayq_acks_total"),
                             ("delayq.nacks", "delayq_nacks_total"),
                             ("delayq.dead", "delayq_dead_total")):  # fmt: skip
        [point] = points[name]
        assert point["attributes"] == jobs
        assert point["value"] == value(samples, prometheus, queue="jobs")
    durations = {
        p["attributes"]["messaging.delayq.task"]: p for p in points["messaging.process.duration"]
    }
    assert (durations["ok"]["count"], durations["boom"]["count"]) == (2, 2)
    assert durations["ok"]["attributes"]["messaging.system"] == "delayq"
    assert sum(p["count"] for p in points["delayq.lateness"]) == 4
    assert [p["value"] for p in points["delayq.backend.up"]] == [1]
    worker.stop()
