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
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends._redis_server import RedisProcess, free_port

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


class HealthyWorker:
    """A ``delayq worker --health-port`` process in ``root``, and its probes."""

    def __init__(self, root: Path, url: str, *args: str) -> None:
        (root / "health_app.py").write_text(APP)
        self.started = root / "started"
        self.port = free_port()
        self.env = {**os.environ, "DELAYQ_URL": url, "STARTED": str(self.started)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "worker", "health_app:app",
             "--health-port", str(self.port), *args],
            cwd=root, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def probe(
        self, path: str, method: str = "GET", timeout: float = 5.0
    ) -> tuple[int, dict[str, object]]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def wait_for(self, path: str, status: int, timeout: float = 30.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, self.process.communicate()[1]
            try:
                got, body = self.probe(path)
                if got == status:
                    return body
            except OSError:  # not listening yet
                pass
            assert time.monotonic() < deadline, f"{path} never answered {status}"
            time.sleep(0.05)

    def put(self, task: str, *args: object) -> None:
        self.started.unlink(missing_ok=True)
        put = subprocess.run(
            [sys.executable, "-m", "delayq.cli", "put", "jobs",
             json.dumps({"task": task, "args": list(args), "kwargs": {}})],
            cwd=self.started.parent, env=self.env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert put.returncode == 0, put.stderr
        deadline = time.monotonic() + 30
        while not self.started.exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        _, err = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, err
        return err

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def workers() -> Iterator[list[HealthyWorker]]:
    started: list[HealthyWorker] = []
    yield started
    for worker in started:
        worker.kill()


def test_healthy_and_ready_strict_and_a_busy_port_is_one_line(
    tmp_path: Path, workers: list[HealthyWorker]
) -> None:
    worker = HealthyWorker(tmp_path, f"sqlite:///{tmp_path / 'q.db'}")
    workers.append(worker)
    assert worker.wait_for("/readyz", 200) == {"status": "ready"}
    assert worker.probe("/healthz") == (200, {"status": "ok"})
    assert worker.probe("/readyz", method="POST")[0] == 405
    assert worker.probe("/metrics")[0] == 404
    for request in (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", b"junk\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as raw:
            raw.sendall(request)  # a head over its size cap, or not HTTP
            assert raw.recv(100).startswith(b"HTTP/1.1 400 ")
    busy = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "worker", "health_app:app",
         "--health-port", str(worker.port)],
        cwd=tmp_path, env=worker.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert busy.returncode == 1, busy.stderr
    [line] = busy.stderr.strip().splitlines()
    assert line == (
        f"error: cannot listen on http://127.0.0.1:{worker.port}/: the port is in use: "
        "stop what holds it, or choose another with --health-port"
    )
    worker.put("stuck", 2)  # /healthz is answered by the loop: a stuck one fails it
    with pytest.raises((TimeoutError, urllib.error.URLError)):  # no answer in time
        worker.probe("/healthz", timeout=0.5)
    assert worker.wait_for("/healthz", 200) == {"status": "ok"}  # it turns again
    worker.stop()


def test_not_ready_while_its_redis_is_down_and_ready_again_after(
    tmp_path: Path, workers: list[HealthyWorker]
) -> None:
    redis = RedisProcess(tmp_path)
    redis.start()
    try:
        worker = HealthyWorker(tmp_path, redis.url)
        workers.append(worker)
        worker.wait_for("/readyz", 200)
        redis.kill()
        body = worker.wait_for("/readyz", 503)
        assert body == {"status": "not ready", "reason": "backend_unavailable"}
        assert worker.probe("/healthz") == (200, {"status": "ok"})  # alive: no restart
        redis.start()
        worker.wait_for("/readyz", 200)
        worker.stop()
    finally:
        redis.stop()


def test_not_ready_during_the_drain_after_sigterm(
    tmp_path: Path, workers: list[HealthyWorker]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    worker = HealthyWorker(tmp_path, url, "--grace", "20")
    workers.append(worker)
    worker.wait_for("/readyz", 200)
    worker.put("slow", 2)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.wait_for("/readyz", 503) == {"status": "not ready", "reason": "draining"}
    assert worker.probe("/healthz") == (200, {"status": "ok"})
    _, err = worker.process.communicate(timeout=30)
    assert worker.process.returncode == 0, err


def test_the_supervisor_is_ready_when_all_its_children_are(
    tmp_path: Path, workers: list[HealthyWorker]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    worker = HealthyWorker(tmp_path, url, "--processes", "2", "--grace", "20")
    workers.append(worker)
    assert worker.wait_for("/readyz", 200) == {"status": "ready"}
    worker.put("slow", 30)
    os.kill(int(worker.started.read_text()), signal.SIGKILL)  # one child dies
    body = worker.wait_for("/readyz", 503)
    assert body == {"status": "not ready", "reason": "starting"}  # until it is restarted
    assert worker.probe("/healthz") == (200, {"status": "ok"})
    worker.wait_for("/readyz", 200)
    worker.put("slow", 2)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.wait_for("/readyz", 503) == {"status": "not ready", "reason": "draining"}
    _, err = worker.process.communicate(timeout=30)
    assert worker.process.returncode == 0, err
