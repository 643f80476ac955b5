"""A ``delayq worker`` process that answers HTTP (``--metrics-port``, ``--health-port``),
and what the tests of its metrics and its probes ask it (test_worker_metrics.py,
test_worker_health.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends._redis_server import free_port
from delayq import Queue

__all__ = ["Samples", "WorkerProcess", "worker_processes"]

#: A scrape: (sample name, its labels sorted) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

T = TypeVar("T")

#: The app module every :class:`WorkerProcess` runs: ``worker_app:app``.
MODULE = "worker_app"


class WorkerProcess:
    """``delayq worker worker_app:app *args`` in ``root``, ``app`` the module's source,
    on the store ``url`` (``$DELAYQ_URL``), ``env`` added to its environment. With
    ``metrics`` and ``health``, ``--metrics-port`` and ``--health-port`` on
    :attr:`port` (one port when both)."""

    def __init__(
        self,
        root: Path,
        url: str,
        app: str,
        *args: str,
        metrics: bool = False,
        health: bool = False,
        **env: str,
    ) -> None:
        (root / f"{MODULE}.py").write_text(app)
        self.root = root
        self.port = free_port()
        self.env = {**os.environ, "DELAYQ_URL": url, **env}
        ports: list[str] = []
        for on, option in ((metrics, "--metrics-port"), (health, "--health-port")):
            if on:
                ports += [option, str(self.port)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "worker", f"{MODULE}:app", *ports, *args],
            cwd=root, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def get(self, path: str, method: str = "GET", timeout: float = 5.0) -> tuple[int, str, str]:
        """The status, Content-Type and body of a request to ``path``."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.headers["Content-Type"], response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    def probe(
        self, path: str, method: str = "GET", timeout: float = 5.0
    ) -> tuple[int, dict[str, object]]:
        """The status and JSON body of a probe (``/healthz``, ``/readyz``)."""
        status, _, body = self.get(path, method, timeout)
        return status, json.loads(body)

    def scrape(self) -> Samples:
        """``/metrics``, as Prometheus reads it."""
        status, kind, text = self.get("/metrics")
        assert status == 200
        assert kind == "text/plain; version=0.0.4; charset=utf-8"
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def until(self, answer: Callable[[], T | None], timeout: float = 30.0) -> T:
        """``answer()`` once it is not None, asked every 50 ms while the process runs
        (an OSError: not listening yet)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            assert self.process.poll() is None, self.process.communicate()[1]
            try:
                got = answer()
                if got is not None:
                    return got
            except OSError as exc:
                last = exc
            assert time.monotonic() < deadline, f"never: {last}"
            time.sleep(0.05)

    def wait_for(self, check: Callable[[Samples], bool], timeout: float = 30.0) -> Samples:
        """Scrape until ``check(samples)`` holds."""

        def answer() -> Samples | None:
            samples = self.scrape()
            return samples if check(samples) else None

        return self.until(answer, timeout)

    def wait_for_status(self, path: str, status: int, timeout: float = 30.0) -> dict[str, object]:
        """Probe ``path`` until it answers ``status``: its body."""

        def answer() -> dict[str, object] | None:
            got, body = self.probe(path)
            return body if got == status else None

        return self.until(answer, timeout)

    def put(self, task: str, *args: Any, delay: float = 0.0) -> None:
        """Put a task's message to ``jobs`` as another face would (the app is not here)."""
        with Queue(self.env["DELAYQ_URL"], name="jobs") as queue:
            queue.put({"task": task, "args": list(args), "kwargs": {}}, delay=delay)

    def stop(self) -> str:
        """SIGTERM, and its stderr once it ended with 0."""
        self.process.send_signal(signal.SIGTERM)
        _, err = self.process.communicate(timeout=30)
        assert self.process.returncode == 0, err
        return err

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def worker_processes() -> Any:
    """A test module's fixture: a list to append each :class:`WorkerProcess` started
    to, those still running killed after the test (``workers = worker_processes()``)."""

    @pytest.fixture
    def workers() -> Iterator[list[WorkerProcess]]:
        started: list[WorkerProcess] = []
        yield started
        for worker in started:
            worker.kill()

    return workers
