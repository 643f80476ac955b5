"""``delayq worker --health-port``: what an orchestrator probes, on a real worker
process. ``/healthz`` and ``/readyz`` answer 200 while it runs; ``/readyz`` is a 503
with its reason while its Redis (a private ``redis-server`` the test kills) is down and
200 again once it is back, and a 503 during the drain that SIGTERM starts; a loop
that a handler blocks leaves ``/healthz`` unanswered; a health port in use is one line
at start. With ``--processes``, the supervisor answers: ready when all its children
are."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest
from _worker_process import WorkerProcess, worker_processes

from backends._redis_server import RedisProcess

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

APP = """
import os
import time

from delayq import App

app = App()  # $DELAYQ_URL


@app.task(queue="jobs")
def slow(seconds):
    with open(os.environ["STARTED"], "w") as started:
        started.write(str(os.getpid()))
    time.sleep(seconds)


@app.task(queue="jobs")
async def stuck(seconds):  # a bug: it blocks the worker's event loop
    open(os.environ["STARTED"], "w").close()
    time.sleep(seconds)
"""


workers = worker_processes()


def healthy(root: Path, url: str, *args: str) -> WorkerProcess:
    """A worker of APP with ``--health-port``."""
    return WorkerProcess(root, url, APP, *args, health=True, STARTED=str(root / "started"))


def start(worker: WorkerProcess, task: str, *args: object) -> None:
    """Put ``task(*args)`` with ``delayq put``, and wait until its handler started."""
    started = worker.root / "started"
    started.unlink(missing_ok=True)
    put = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "put", "jobs",
         json.dumps({"task": task, "args": list(args), "kwargs": {}})],
        cwd=worker.root, env=worker.env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert put.returncode == 0, put.stderr
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_healthy_and_ready_strict_and_a_busy_port_is_one_line(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = healthy(tmp_path, f"sqlite:///{tmp_path / 'q.db'}")
    workers.append(worker)
    assert worker.wait_for_status("/readyz", 200) == {"status": "ready"}
    assert worker.probe("/healthz") == (200, {"status": "ok"})
    assert worker.probe("/readyz", method="POST")[0] == 405
    assert worker.probe("/metrics")[0] == 404
    for request in (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", b"junk\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as raw:
            raw.sendall(request)  # a head over its size cap, or not HTTP
            assert raw.recv(100).startswith(b"HTTP/1.1 400 ")
    busy = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "worker", "worker_app:app",
         "--health-port", str(worker.port)],
        cwd=tmp_path, env=worker.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert busy.returncode == 1, busy.stderr
    [line] = busy.stderr.strip().splitlines()
    assert line == (
        f"error: cannot listen on http://127.0.0.1:{worker.port}/: the port is in use: "
        "stop what holds it, or choose another with --health-port"
    )
    start(worker, "stuck", 2)  # /healthz is answered by the loop: a stuck one fails it
    with pytest.raises((TimeoutError, urllib.error.URLError)):  # no answer in time
        worker.probe("/healthz", timeout=0.5)
    assert worker.wait_for_status("/healthz", 200) == {"status": "ok"}  # it turns again
    worker.stop()


def test_not_ready_while_its_redis_is_down_and_ready_again_after(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    redis = RedisProcess(tmp_path)
    redis.start()
    try:
        worker = healthy(tmp_path, redis.url)
        workers.append(worker)
        worker.wait_for_status("/readyz", 200)
        redis.kill()
        body = worker.wait_for_status("/readyz", 503)
        assert body == {"status": "not ready", "reason": "backend_unavailable"}
        assert worker.probe("/healthz") == (200, {"status": "ok"})  # alive: no restart
        redis.start()
        worker.wait_for_status("/readyz", 200)
        worker.stop()
    finally:
        redis.stop()


def test_not_ready_during_the_drain_after_sigterm(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    worker = healthy(tmp_path, url, "--grace", "20")
    workers.append(worker)
    worker.wait_for_status("/readyz", 200)
    start(worker, "slow", 2)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.wait_for_status("/readyz", 503) == {"status": "not ready", "reason": "draining"}
    assert worker.probe("/healthz") == (200, {"status": "ok"})
    _, err = worker.process.communicate(timeout=30)
    assert worker.process.returncode == 0, err


def test_the_supervisor_is_ready_when_all_its_children_are(
    tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    worker = healthy(tmp_path, url, "--processes", "2", "--grace", "20")
    workers.append(worker)
    assert worker.wait_for_status("/readyz", 200) == {"status": "ready"}
    start(worker, "slow", 30)
    os.kill(int((tmp_path / "started").read_text()), signal.SIGKILL)  # one child dies
    body = worker.wait_for_status("/readyz", 503)
    assert body == {"status": "not ready", "reason": "starting"}  # until it is restarted
    assert worker.probe("/healthz") == (200, {"status": "ok"})
    worker.wait_for_status("/readyz", 200)
    start(worker, "slow", 2)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.wait_for_status("/readyz", 503) == {"status": "not ready", "reason": "draining"}
    _, err = worker.process.communicate(timeout=30)
    assert worker.process.returncode == 0, err
