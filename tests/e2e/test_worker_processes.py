"""Real worker processes on sqlite://, redis://, postgresql:// and amqp:// : kill -9,
SIGTERM drain, cron across three processes, and retries with backoff into dead. On amqp://
every process is a candidate for the namespace's scheduler, so the worker killed with -9
may be the scheduler too: its successor rebuilds the leases from the log.

Each redis case runs under its own key prefix on ``$DELAYQ_TEST_REDIS`` (by default
``redis://127.0.0.1:6379/0``) and deletes every key under it afterwards; each postgres
case in its own schema on ``$DELAYQ_TEST_POSTGRES``, dropped afterwards. Without a
reachable server those cases are skipped, or fail when ``$DELAYQ_REQUIRE`` lists the
backend (as in tests/conformance/conftest.py)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import NoReturn

import pytest

from conformance.conftest import amqp_url
from delayq.durable import Queue

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

APP = """
import os, sys, time
from delayq.runtime import App
from delayq.durable.retry import RetryPolicy
from delayq.runtime import Worker, current_message

app = App(os.environ["WURL"], retry=RetryPolicy(max_attempts=4, base=0.2, factor=2.0, jitter=0.0))


def record(*parts):
    with open(os.environ["WLOG"], "a") as log:  # one short O_APPEND write: atomic
        log.write(" ".join(map(str, parts)) + "\\n")


@app.task(queue="jobs")
def work(i):
    record("start", i, os.getpid())
    time.sleep(float(os.environ.get("JOB_SECONDS", "0")))
    record("done", i, os.getpid())


@app.task(queue="fail")
def always_fails():
    record("attempt", current_message().attempts, time.time())
    raise RuntimeError("always")


@app.every("500ms", queue="cron")
def beat():
    record("tick", current_message().id, os.getpid())


if __name__ == "__main__":
    queues, lease, grace = sys.argv[1].split(","), float(sys.argv[2]), float(sys.argv[3])
    Worker(app, queues=queues, lease=lease, grace=grace, concurrency=4).run()
    record("exit", os.getpid())
"""


def unavailable(backend: str, reason: str) -> NoReturn:
    """Skip, or fail when ``$DELAYQ_REQUIRE`` lists ``backend`` (or ``all``)."""
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    if backend in required or "all" in required:
        pytest.fail(f"{backend} is required by DELAYQ_REQUIRE but unavailable: {reason}")
    pytest.skip(f"{backend} unavailable: {reason}")


def sqlite_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'q.db'}"


def redis_url(tmp_path: Path) -> Iterator[str]:
    """A private key prefix on the test Redis; its keys are deleted afterwards (and
    checked gone)."""
    try:
        import redis  # noqa: PLC0415 (optional: the backend is skipped without it)
    except ImportError:
        unavailable("redis", "redis-py is not installed (pip install 'delayq[redis]')")
    base = os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
    prefix = f"delayq-e2e-{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(base, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        unavailable("redis", f"{base}: {exc}")
    try:
        assert not list(client.scan_iter(match=f"{prefix}:*"))
        yield f"{base}{'&' if '?' in base else '?'}prefix={prefix}"
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        left = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        client.close()
    assert not left, left


def postgres_url(tmp_path: Path) -> Iterator[str]:
    """A private schema on the test PostgreSQL (``$DELAYQ_TEST_POSTGRES``), dropped
    afterwards."""
    try:
        import psycopg  # noqa: PLC0415 (optional: the backend is skipped without it)
    except ImportError:
        unavailable("postgres", "psycopg is not installed (pip install 'delayq[postgres]')")
    base = os.environ.get("DELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    schema = f"delayq_e2e_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=2)
    except psycopg.Error as exc:
        unavailable("postgres", f"{base}: {exc}")
    with admin:
        try:
            yield f"{base}{'&' if '?' in base else '?'}schema={schema}"
        finally:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


BACKENDS: dict[str, Callable[[Path], Iterator[str]]] = {
    "sqlite": sqlite_url,
    "redis": redis_url,
    "postgres": postgres_url,
    "amqp": amqp_url,
}


class Env:
    def __init__(self, tmp_path: Path, url: str) -> None:
        self.dir = tmp_path
        (tmp_path / "wapp.py").write_text(textwrap.dedent(APP))
        self.url = url
        self.log = tmp_path / "log.txt"
        self.log.touch()
        self.procs: list[subprocess.Popen[str]] = []

    def worker(
        self, queues: str, *, lease: float = 5.0, grace: float = 10.0, job_seconds: float = 0.0
    ) -> subprocess.Popen[str]:
        env = dict(os.environ, WURL=self.url, WLOG=str(self.log), JOB_SECONDS=str(job_seconds))
        proc = subprocess.Popen(
            [sys.executable, str(self.dir / "wapp.py"), queues, str(lease), str(grace)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def lines(self, kind: str) -> list[list[str]]:
        return [
            line.split()[1:]
            for line in self.log.read_text().splitlines()
            if line.startswith(kind + " ")
        ]

    def wait(self, condition: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for proc in self.procs:
                if proc.poll() not in (None, 0, -signal.SIGKILL):
                    pytest.fail(f"worker died: {proc.returncode}\n{proc.communicate()[1]}")
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.02)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            _, err = proc.communicate(timeout=30)
            assert proc.returncode in (0, -signal.SIGKILL), err


@pytest.fixture(params=list(BACKENDS))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, isolated store of each backend (cleaned up after the workers stop)."""
    yield from BACKENDS[request.param](tmp_path)


@pytest.fixture
def env(tmp_path: Path, url: str) -> Iterator[Env]:
    environment = Env(tmp_path, url)
    yield environment
    for proc in environment.procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def send_jobs(env: Env, count: int) -> None:
    with Queue(env.url, name="jobs") as queue:
        queue.put_many(
            [
                {"payload": {"task": "work", "args": [i], "kwargs": {}}, "id": f"j{i}"}
                for i in range(count)
            ]
        )


def test_a_worker_killed_while_holding_jobs_loses_none(env: Env) -> None:
    send_jobs(env, 4)
    first = env.worker("jobs", lease=1.0, job_seconds=60)
    env.wait(lambda: len(env.lines("start")) == 4)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=10)
    env.worker("jobs", lease=1.0)
    env.wait(lambda: len(env.lines("done")) == 4)
    env.stop_all()
    done = env.lines("done")
    assert sorted(i for i, _ in done) == ["0", "1", "2", "3"]
    assert all(pid != str(first.pid) for _, pid in done)
    with Queue(env.url, name="jobs") as queue:
        assert queue.stats().total == 0  # every job acked, none left behind


def test_sigterm_drains_gracefully(env: Env) -> None:
    send_jobs(env, 12)
    first = env.worker("jobs", job_seconds=0.4, grace=10)
    env.wait(lambda: len(env.lines("start")) >= 4)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=15)
    assert first.returncode == 0, err
    started_by_first = {i for i, pid in env.lines("start") if pid == str(first.pid)}
    done_by_first = {i for i, pid in env.lines("done") if pid == str(first.pid)}
    assert started_by_first == done_by_first  # every running job finished
    assert len(done_by_first) < 12  # it stopped taking new ones
    env.worker("jobs")
    env.wait(lambda: len(env.lines("done")) == 12)
    env.stop_all()
    assert Counter(i for i, _ in env.lines("start")) == Counter(str(i) for i in range(12))
    with Queue(env.url, name="jobs") as queue:
        assert queue.stats().total == 0


def test_three_processes_run_each_cron_tick_once(env: Env) -> None:
    for _ in range(3):
        env.worker("cron")
    env.wait(lambda: len(env.lines("tick")) >= 14, timeout=40)
    env.stop_all()
    ticks = [tick for tick, _ in env.lines("tick")]
    runs = Counter(ticks)
    assert max(runs.values()) == 1, [t for t, n in runs.items() if n > 1]
    times = sorted(datetime.fromisoformat(t.split(":", 2)[2].replace("Z", "+00:00")) for t in runs)
    steps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    # No tick missed once all three run. A tick is put about one period ahead (by each
    # producer and by the run of the tick before): 0.5 s, not 0.25 s, so that a loaded
    # machine stalling every process at once for a quarter second misses none.
    assert steps[2:] == [0.5] * len(steps[2:])
    assert len({pid for _, pid in env.lines("tick")}) >= 2  # the runs are shared


def test_an_always_failing_job_ends_dead_after_its_backoff(env: Env) -> None:
    with Queue(env.url, name="fail") as queue:
        queue.put({"task": "always_fails", "args": [], "kwargs": {}}, id="f", max_attempts=4)
    env.worker("fail")
    env.wait(lambda: len(env.lines("attempt")) == 4)
    with Queue(env.url, name="fail") as queue:
        env.wait(lambda: (m := queue.get("f")) is not None and m.state.value == "dead")
        msg = queue.get("f")
    env.stop_all()
    assert msg is not None
    assert msg.attempts == 4
    assert msg.last_error.partition("\n")[0] == "RuntimeError: always"
    assert "Traceback (most recent call last):" in msg.last_error
    stamps = [float(t) for _, t in env.lines("attempt")]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    for gap, expected in zip(gaps, (0.2, 0.4, 0.8), strict=True):
        # never early; late by at most what a loaded machine may add (a reserve in
        # another process, a thread's start)
        assert expected <= gap < expected + 1.5
