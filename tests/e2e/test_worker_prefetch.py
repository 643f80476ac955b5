"""A worker process killed with -9 while it holds prefetched messages (reserved, not
started) loses none of them: their leases run out and another worker runs each once.
On sqlite://, redis:// and kafka://, with the app of test_worker_processes (_apps.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from _apps import Workers, workers_on

from delayq.durable import Queue

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")


@pytest.fixture(params=["sqlite", "redis", "kafka"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workers]:
    yield from workers_on(request.param, tmp_path)


def test_a_worker_killed_with_prefetched_jobs_loses_none(env: Workers) -> None:
    env.send(8)  # concurrency 4, prefetch 16 (the default): 4 run, 4 wait
    first = env.worker("jobs", lease=1.0, job_seconds=60)
    env.wait(lambda: len(env.lines("start")) == 4)
    with Queue(env.url, name="jobs") as queue:
        env.wait(lambda: queue.stats().active == 8)  # the other 4 are held, waiting
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    env.worker("jobs", lease=1.0)
    env.wait(lambda: len(env.lines("done")) == 8)
    env.stop_all()
    done = env.lines("done")
    assert sorted(i for i, _ in done) == [str(i) for i in range(8)]
    assert all(pid != str(first.pid) for _, pid in done)
    started_by_first = [i for i, pid in env.lines("start") if pid == str(first.pid)]
    assert len(started_by_first) == 4  # the prefetched ones never started there
    with Queue(env.url, name="jobs") as queue:
        assert queue.stats().total == 0
