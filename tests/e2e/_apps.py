"""What the end-to-end tests of worker processes share: a private store of each backend,
and a directory with an app module whose jobs write what they did to a log, and the
processes started from it.

The stores are those of the conformance suite (tests/conformance/conftest.py): a key
prefix of its own on the test Redis, a schema of its own on the test PostgreSQL, a
namespace of its own on the test RabbitMQ, each removed afterwards. Without a reachable
server those cases are skipped, or fail when ``$DELAYQ_REQUIRE`` lists the backend.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from conformance import conftest as conformance
from delayq.durable import Queue

__all__ = ["STORES", "WORKER_APP", "AppDir", "Workers", "workers_on"]


def redis_url(tmp_path: Path) -> Iterator[str]:
    """The conformance suite's private key prefix on the test Redis, its keys deleted
    afterwards, and then checked gone (no process of the test left writes there)."""
    for url in conformance.redis_url(tmp_path):
        yield url
    import redis  # noqa: PLC0415 (optional: the backend was skipped without it)

    prefix = parse_qs(urlsplit(url).query)["prefix"][0]
    with redis.Redis.from_url(url.partition("?")[0], socket_connect_timeout=2) as client:
        left = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    assert not left, left


#: A fresh, isolated store of each backend: ``yield from STORES[name](tmp_path)``.
STORES: dict[str, Callable[[Path], Iterator[str]]] = {
    "sqlite": conformance.sqlite_url,
    "redis": redis_url,
    "postgres": conformance.postgres_url,
    "amqp": conformance.amqp_url,
    "kafka": conformance.kafka_purged_url,
}


#: ``wlog.py``, written beside the app: ``from wlog import record``.
RECORDER = """
import os


def record(*parts):
    \"\"\"A line ``parts ...`` to $WLOG: one short O_APPEND write, atomic.\"\"\"
    with open(os.environ["WLOG"], "a") as log:
        log.write(" ".join(map(str, parts)) + "\\n")
"""


class AppDir:
    """A directory with the app module ``wapp.py`` (``source``), the log its jobs write
    (``$WLOG``, a line ``kind field ...`` each, by ``record`` of ``wlog.py``), and the
    processes started from it, each with its stderr in a file of its own.

    The processes get ``$WURL`` (the store), ``$WLOG`` and ``$JOB_SECONDS``, and no
    ``$FORCE_COLOR`` (their log lines are read as plain text). :meth:`close` kills
    those still running; a subclass may stop them its own way.
    """

    def __init__(self, root: Path, url: str, source: str) -> None:
        self.root = root
        (root / "wapp.py").write_text(textwrap.dedent(source))
        (root / "wlog.py").write_text(RECORDER)
        self.url = url
        self.log = root / "log.txt"
        self.log.touch()
        self.procs: list[subprocess.Popen[str]] = []
        self._stderr: dict[int, Path] = {}

    def start(self, *argv: str, job_seconds: float = 0.0, **env: str) -> subprocess.Popen[str]:
        """``python *argv`` in the directory, ``env`` added to its environment."""
        environ = {key: value for key, value in os.environ.items() if key != "FORCE_COLOR"}
        environ.update(WURL=self.url, WLOG=str(self.log), JOB_SECONDS=str(job_seconds), **env)
        environ["PYTHONFAULTHANDLER"] = "1"  # a process that hangs shows its threads (hung)
        path = self.root / f"stderr-{len(self.procs)}.txt"
        with path.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, *argv], cwd=self.root, env=environ, stderr=err, text=True
            )
        self.procs.append(proc)
        self._stderr[proc.pid] = path
        return proc

    def stderr_path(self, proc: subprocess.Popen[str]) -> Path:
        """The file of ``proc``'s stderr."""
        return self._stderr[proc.pid]

    def stderr_of(self, proc: subprocess.Popen[str]) -> str:
        """What ``proc`` wrote to its stderr so far."""
        return self._stderr[proc.pid].read_text()

    def hung(self, proc: subprocess.Popen[str], *, tasks: bool = False) -> str:
        """The stderr of ``proc``, a process that hangs, with the stack of each of its
        threads (its fault handler prints them on SIGABRT, and it ends); with ``tasks``,
        first those of its event loop's tasks (an app that prints them on SIGUSR1)."""
        if tasks:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return self.stderr_of(proc)

    def lines(self, kind: str) -> list[list[str]]:
        """The fields of each ``kind`` line of the log."""
        return [
            line.split()[1:]
            for line in self.log.read_text().splitlines()
            if line.startswith(kind + " ")
        ]

    def send(self, count: int) -> None:
        """``count`` calls of the task ``work(i)`` to the queue ``jobs``, ids ``j<i>``."""
        with Queue(self.url, name="jobs") as queue:
            queue.put_many(
                [
                    {"payload": {"task": "work", "args": [i], "kwargs": {}}, "id": f"j{i}"}
                    for i in range(count)
                ]
            )

    def check(self) -> None:
        """Fail the test if a process ended as it should not have: here, with a status
        other than 0 or a kill -9."""
        for proc in self.procs:
            if proc.poll() not in (None, 0, -signal.SIGKILL):
                pytest.fail(f"{proc.args} exited {proc.returncode}:\n{self.stderr_of(proc)}")

    def wait(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        """Return once ``condition()`` holds; fail at once if :meth:`check` does, or
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not condition():
            self.check()
            if time.monotonic() >= deadline:
                errors = "".join(self.stderr_of(proc) for proc in self.procs)
                pytest.fail(f"not reached in {timeout} s\n{errors}{self.log.read_text()}")
            time.sleep(0.02)

    def close(self) -> None:
        """Kill the processes still running."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


#: The app of :class:`Workers`: ``python wapp.py QUEUES LEASE GRACE`` runs one Worker.
WORKER_APP = """
import asyncio, os, signal, sys, time
from delayq.runtime import App
from delayq.durable.retry import RetryPolicy
from delayq.runtime import Worker, current_message
from wlog import record

app = App(os.environ["WURL"], retry=RetryPolicy(max_attempts=4, base=0.2, factor=2.0, jitter=0.0))


@app.task(queue="jobs")
def work(i):
    record("start", i, os.getpid())
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))
    record("done", i, os.getpid())


@app.task(queue="fail")
def always_fails():
    record("attempt", current_message().attempts, time.time())
    raise RuntimeError("always")


@app.every("1s", queue="cron")
def beat():
    record("tick", current_message().id, os.getpid())


# On SIGUSR1 (a test's ``hung``): where each task of the loop waits.
def print_tasks(*_):
    for task in asyncio.all_tasks(asyncio.get_running_loop()):
        print("task", task, file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


signal.signal(signal.SIGUSR1, print_tasks)

if __name__ == "__main__":
    queues, lease, grace = sys.argv[1].split(","), float(sys.argv[2]), float(sys.argv[3])
    Worker(app, queues=queues, lease=lease, grace=grace, concurrency=4).run()
    record("exit", os.getpid())
"""


class Workers(AppDir):
    """Worker processes of :data:`WORKER_APP`, each started on its own."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root, url, WORKER_APP)

    def worker(
        self, queues: str, *, lease: float = 5.0, grace: float = 10.0, job_seconds: float = 0.0
    ) -> subprocess.Popen[str]:
        """A worker of ``queues`` (comma-separated)."""
        return self.start("wapp.py", queues, str(lease), str(grace), job_seconds=job_seconds)

    def stop_all(self) -> None:
        """SIGTERM to those running; each must end with 0 (or have been killed -9)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                hung = self.hung(proc, tasks=True)
                pytest.fail(f"{proc.args} still running 30 s after SIGTERM:\n{hung}")
            assert proc.returncode in (0, -signal.SIGKILL), self.stderr_of(proc)


def workers_on(store: str, tmp_path: Path) -> Iterator[Workers]:
    """:class:`Workers` on a fresh store of ``STORES[store]`` (for a fixture to yield
    from): those still running are killed at the end, then the store is cleaned up."""
    for url in STORES[store](tmp_path):
        workers = Workers(tmp_path, url)
        try:
            yield workers
        finally:
            workers.close()
