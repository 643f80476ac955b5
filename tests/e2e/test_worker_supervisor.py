"""``delayq worker --processes N`` in real processes, with real signals, on sqlite://,
redis:// (each redis case under its own key prefix, deleted afterwards) and kafka:// (its
scheduler held open in the test process, _apps.py): the
children share the jobs; a child killed with -9 is started again and its jobs are
run; SIGTERM stops them all gracefully (a second SIGTERM at once) and the supervisor
exits 0; a child that crashes at start-up is restarted after a growing pause; children
that cannot start make the supervisor exit non-zero.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from _apps import STORES, AppDir

from delayq.durable import Queue

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

APP = """
import logging, os, time
from delayq import App, current_message
from wlog import record

app = App(os.environ["WURL"])
if __name__ in ("__main__", "__mp_main__"):  # the Python face: the CLI sets logging up
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")


@app.task(queue="jobs")
def work(i):
    record("start", i, os.getpid())
    if current_message().attempts == 1:  # a job given back runs at once next time
        time.sleep(float(os.environ["JOB_SECONDS"]))
    record("done", i, os.getpid())


def make_worker():
    # For Supervisor(make_worker) from Python: refuses to start while CRASH exists.
    if os.path.exists(os.environ["WCRASH"]):
        raise RuntimeError("crash at start-up")
    from delayq import Worker
    return Worker(app, concurrency=2, lease=1.0, grace=5.0)


if __name__ == "__main__":
    from delayq.runtime import Supervisor
    raise SystemExit(Supervisor(make_worker, processes=1).run())
"""


@pytest.fixture(params=["sqlite", "redis", "kafka"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from STORES[request.param](tmp_path)


class Project(AppDir):
    """The directory of the app ``wapp.py`` with the supervisor process under test."""

    def __init__(self, root: Path, url: str) -> None:
        super().__init__(root, url, APP)
        self.crash = root / "crash"
        self.proc: subprocess.Popen[str] | None = None

    @property
    def stderr(self) -> Path:
        assert self.proc is not None
        return self.stderr_path(self.proc)

    def start(self, *argv: str, job_seconds: float = 60.0, **env: str) -> subprocess.Popen[str]:
        self.proc = super().start(*argv, job_seconds=job_seconds, WCRASH=str(self.crash), **env)
        return self.proc

    def worker(self, *options: str, job_seconds: float = 60.0) -> subprocess.Popen[str]:
        argv = ("-m", "delayq.cli", "worker", "wapp:app", "--log-level", "info", *options)
        return self.start(*argv, job_seconds=job_seconds)

    def events(self, event: str) -> list[dict[str, str]]:
        """The fields of each ``event`` line the supervisor and its children logged."""
        found = []
        for line in self.stderr.read_text().splitlines():
            match = re.search(rf": {re.escape(event)}( .*)?$", line)
            if match:
                found.append(dict(re.findall(r"(\w+)=(\S+)", match.group(1) or "")))
        return found

    def check(self) -> None:
        """The supervisor must not exit while the test waits."""
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"supervisor exited {self.proc.returncode}: {self.stderr.read_text()}")

    def exit_status(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"supervisor still running after {timeout} s: {self.stderr.read_text()}")

    def stats(self) -> tuple[int, int]:
        """(waiting, total) of the jobs queue: waiting are those no one holds."""
        with Queue(self.url, name="jobs") as queue:
            stats = queue.stats()
            return stats.scheduled + stats.ready, stats.total

    def close(self) -> None:
        """A supervisor still running gets SIGTERM, and a second one after 2 s (its
        children must not outlive it, as a kill -9 would leave them)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            signal_again_after = time.monotonic() + 2
            while proc.poll() is None and time.monotonic() < signal_again_after:
                time.sleep(0.05)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)


@pytest.fixture
def project(tmp_path: Path, url: str) -> Iterator[Project]:
    env = Project(tmp_path, url)
    try:
        yield env
    finally:
        env.close()


def child_pids(project: Project) -> set[str]:
    return {fields["pid"] for fields in project.events("supervisor.child_started")}


def test_the_children_share_the_jobs_and_stop_gracefully(project: Project) -> None:
    supervisor = project.worker(
        "--processes", "2", "--concurrency", "2", "--grace", "10s", job_seconds=0.3
    )
    project.wait(lambda: len(project.events("worker.started")) == 2)
    project.send(16)
    project.wait(lambda: len({pid for _, pid in project.lines("start")}) >= 2)
    supervisor.send_signal(signal.SIGTERM)
    assert project.exit_status() == 0, project.stderr.read_text()
    started = project.lines("start")
    done = project.lines("done")
    pids = {pid for _, pid in started}
    assert len(pids) == 2
    assert pids == child_pids(project)
    assert str(supervisor.pid) not in pids
    assert sorted(started) == sorted(done)  # every running job finished
    assert max(Counter(i for i, _ in started).values()) == 1
    waiting, total = project.stats()
    assert waiting == total == 16 - len(done)  # the rest wait, untouched
    stopped = project.events("supervisor.child_stopped")
    assert sorted(fields["exitcode"] for fields in stopped) == ["0", "0"]
    assert project.events("supervisor.stopped") == [{"exitcode": "0"}]


def test_a_killed_child_is_restarted_and_loses_no_job(project: Project) -> None:
    """kill -9 of a child that holds two jobs: a new child takes its place and runs
    them once their lease ends; then a SIGTERM asks the children to finish their
    60 s jobs within --grace, a second SIGTERM gives them back at once: exit 0,
    nothing lost, no attempt charged."""
    project.send(4)
    supervisor = project.worker(
        "--processes", "2", "--concurrency", "2", "--prefetch", "0", "--lease", "4s"
    )
    project.wait(lambda: len(project.lines("start")) == 4)
    by_pid = Counter(pid for _, pid in project.lines("start"))
    victim = next(pid for pid, jobs in by_pid.items() if jobs == 2)
    victim_jobs = {i for i, pid in project.lines("start") if pid == victim}
    os.kill(int(victim), signal.SIGKILL)
    project.wait(lambda: {i for i, _ in project.lines("done")} == victim_jobs, timeout=30)
    died = project.events("supervisor.child_died")
    assert [(d["pid"], d["signal"], d["restart_in"]) for d in died] == [(victim, "SIGKILL", "0.5")]
    assert len(child_pids(project)) == 3
    reborn = child_pids(project) - set(by_pid)
    assert {pid for _, pid in project.lines("done")} <= reborn | (set(by_pid) - {victim})

    supervisor.send_signal(signal.SIGTERM)
    project.wait(lambda: len(project.events("supervisor.stopping")) == 1)
    supervisor.send_signal(signal.SIGTERM)
    assert project.exit_status() == 0, project.stderr.read_text()
    assert [e["graceful"] for e in project.events("supervisor.stopping")] == ["True", "False"]
    assert len(project.events("worker.releasing")) == 1  # the child that held jobs
    with Queue(project.url, name="jobs") as queue:
        held = [queue.get(f"j{i}") for i in range(4) if str(i) not in victim_jobs]
    assert [(m.state.value, m.attempts) for m in held if m is not None] == [("ready", 0)] * 2
    assert project.stats() == (2, 2)


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
def test_a_second_stop_reaches_a_child_that_was_not_running_when_both_were_sent(
    project: Project,
) -> None:
    """Two SIGTERMs sent to a process that is not running at that moment are merged
    into one by the kernel; the supervisor's two stop levels must not be: a child
    frozen (SIGSTOP) while the supervisor gets its two SIGTERMs gives its 60 s job
    back at once when it runs again, instead of waiting out its 60 s grace."""
    project.send(1)
    supervisor = project.worker("--processes", "2", "--concurrency", "1", "--grace", "60s")
    project.wait(lambda: len(project.lines("start")) == 1)
    ((_, child),) = project.lines("start")
    os.kill(int(child), signal.SIGSTOP)
    try:
        supervisor.send_signal(signal.SIGTERM)
        project.wait(lambda: len(project.events("supervisor.stopping")) == 1)
        supervisor.send_signal(signal.SIGTERM)
        project.wait(lambda: len(project.events("supervisor.stopping")) == 2)
    finally:
        os.kill(int(child), signal.SIGCONT)
    assert project.exit_status() == 0, project.stderr.read_text()
    # The frozen child went from no stop to stop now (the idle one may have stopped
    # at the first level already, or seen both at once).
    told = [e["graceful"] for e in project.events("worker.stop_told")]
    assert "False" in told
    assert len(project.events("worker.releasing")) == 1
    assert project.lines("done") == []
    with Queue(project.url, name="jobs") as queue:
        held = queue.get("j0")
    assert held is not None
    assert (held.state.value, held.attempts) == ("ready", 0), project.stderr.read_text()


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
def test_a_sigterm_to_the_whole_group_is_one_graceful_stop(project: Project) -> None:
    """A service manager stops a unit by sending SIGTERM to every process of it: the
    child gets one from it and one stop from the supervisor, which together are still
    one graceful stop (its running job finishes), not a stop at once."""
    project.send(1)
    supervisor = project.worker(
        "--processes", "2", "--concurrency", "1", "--grace", "30s", job_seconds=1.0
    )
    project.wait(lambda: len(project.lines("start")) == 1)
    ((_, child),) = project.lines("start")
    os.kill(int(child), signal.SIGTERM)
    supervisor.send_signal(signal.SIGTERM)
    assert project.exit_status() == 0, project.stderr.read_text()
    assert [i for i, _ in project.lines("done")] == ["0"]
    assert not project.events("worker.releasing")
    assert project.stats() == (0, 0)


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
def test_a_child_that_crashes_at_start_up_is_restarted_after_a_growing_pause(
    project: Project,
) -> None:
    """The Python face: Supervisor(make_worker, processes=1).run() in wapp.py. A stop
    while a restart waits for its pause starts nothing more and exits 0."""
    supervisor = project.start("wapp.py")
    project.wait(lambda: len(project.events("supervisor.child_started")) == 1)
    project.wait(lambda: bool(project.events("worker.started")))
    project.crash.touch()
    os.kill(int(project.events("supervisor.child_started")[0]["pid"]), signal.SIGKILL)
    project.wait(lambda: len(project.events("supervisor.child_died")) == 2)
    died = project.events("supervisor.child_died")
    assert [(fields["ready"], fields["restart_in"]) for fields in died] == [
        ("True", "0.5"),
        ("False", "1.0"),
    ]
    supervisor.send_signal(signal.SIGINT)  # while the next start waits its turn
    assert project.exit_status() == 0, project.stderr.read_text()
    assert len(project.events("supervisor.child_started")) == 2  # none started after


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
def test_children_that_cannot_start_make_it_exit_non_zero(project: Project) -> None:
    project.crash.touch()
    project.start("wapp.py")
    assert project.exit_status() == 1, project.stderr.read_text()
    failed = project.events("supervisor.start_failed")
    assert len(failed) == 1
    assert failed[0]["exitcode"] == "1"
    assert "RuntimeError: crash at start-up" in project.stderr.read_text()
    assert not project.events("supervisor.child_died")  # not restarted


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
def test_a_child_stopped_by_a_signal_while_it_starts_is_restarted_not_a_failed_start(
    project: Project,
) -> None:
    """A SIGTERM from outside that ends a child still importing its app says nothing of
    whether the app can start: the child is started again (it was not a failed start,
    which would make the supervisor give up and exit 1), and the workers serve."""
    project.send(1)
    supervisor = project.worker("--processes", "2", job_seconds=0.0)
    project.wait(lambda: len(project.events("supervisor.child_started")) == 2)
    for fields in project.events("supervisor.child_started"):
        os.kill(int(fields["pid"]), signal.SIGTERM)
    project.wait(lambda: len(project.events("worker.started")) == 2, timeout=30)
    assert not project.events("supervisor.start_failed"), project.stderr.read_text()
    died = project.events("supervisor.child_died")
    assert [(d["signal"], d["ready"]) for d in died] == [("SIGTERM", "False")] * 2
    assert len(project.events("supervisor.child_started")) == 4
    project.wait(lambda: project.lines("done") != [])
    supervisor.send_signal(signal.SIGTERM)
    assert project.exit_status() == 0, project.stderr.read_text()


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
def test_a_sigterm_to_the_group_while_the_children_start_is_a_stop(project: Project) -> None:
    """A service manager stops the unit while its children still import the app: each
    child dies of its SIGTERM, the supervisor takes its own as the stop it is, and
    exits 0 (not 1, a failed start), starting nothing again."""
    supervisor = project.worker("--processes", "2")
    project.wait(lambda: len(project.events("supervisor.child_started")) == 2)
    for fields in project.events("supervisor.child_started"):
        os.kill(int(fields["pid"]), signal.SIGTERM)
    supervisor.send_signal(signal.SIGTERM)
    assert project.exit_status() == 0, project.stderr.read_text()
    assert not project.events("supervisor.start_failed")
    assert len(project.events("supervisor.child_started")) == 2
