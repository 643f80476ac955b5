"""Real worker processes on sqlite://, redis://, postgresql://, amqp:// and kafka:// :
kill -9, SIGTERM drain, cron across three processes, and retries with backoff into dead.
On amqp:// every process is a candidate for the namespace's scheduler, so the worker
killed with -9 may be the scheduler too: its successor rebuilds the leases from the log.
On kafka:// the workers never stand: the scheduler is held open in the test process
(_apps.py).

The app (_apps.WORKER_APP) and the stores are those of _apps.py: each a private one,
cleaned up afterwards; without a reachable server a case is skipped, or fails when
``$DELAYQ_REQUIRE`` lists the backend."""

from __future__ import annotations

import itertools
import signal
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from _apps import STORES, Workers, workers_on

from delayq.durable import Queue

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")


@pytest.fixture(params=list(STORES))
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workers]:
    """The app's directory on a fresh, isolated store of each backend."""
    yield from workers_on(request.param, tmp_path)


def test_a_worker_killed_while_holding_jobs_loses_none(env: Workers) -> None:
    env.send(4)
    first = env.worker("jobs", lease=1.0, job_seconds=60)
    env.wait(lambda: len(env.lines("start")) == 4)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    env.worker("jobs", lease=1.0)
    env.wait(lambda: len(env.lines("done")) == 4)
    env.stop_all()
    done = env.lines("done")
    assert sorted(i for i, _ in done) == ["0", "1", "2", "3"]
    assert all(pid != str(first.pid) for _, pid in done)
    with Queue(env.url, name="jobs") as queue:
        assert queue.stats().total == 0  # every job acked, none left behind


def test_sigterm_drains_gracefully(env: Workers) -> None:
    env.send(12)
    first = env.worker("jobs", job_seconds=0.4, grace=10)
    env.wait(lambda: len(env.lines("start")) >= 4)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0, env.stderr_of(first)
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


def test_three_processes_run_each_cron_tick_once(env: Workers) -> None:
    for _ in range(3):
        env.worker("cron")
    env.wait(lambda: len(env.lines("tick")) >= 10, timeout=50)
    env.stop_all()
    ticks = [tick for tick, _ in env.lines("tick")]
    runs = Counter(ticks)
    assert max(runs.values()) == 1, [t for t, n in runs.items() if n > 1]
    times = sorted(datetime.fromisoformat(t.split(":", 2)[2].replace("Z", "+00:00")) for t in runs)
    steps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    # No tick missed once all three run. A tick is put about one period ahead (by each
    # producer and by the run of the tick before), and one whose successor's time has
    # come is skipped by design: 1 s, not 0.5 s, so that a loaded machine stalling
    # every process at once for half a second (seen in a run of the suite that took
    # twice its usual time) misses none.
    assert steps[2:] == [1.0] * len(steps[2:])
    assert len({pid for _, pid in env.lines("tick")}) >= 2  # the runs are shared


def test_an_always_failing_job_ends_dead_after_its_backoff(env: Workers) -> None:
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
