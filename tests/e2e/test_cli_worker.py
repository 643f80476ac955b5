"""``delayq worker`` and ``delayq put`` in real processes on one SQLite file.

Messages put by one ``delayq put`` process are run by a ``delayq worker`` process
(the app module is found in the current directory); SIGTERM lets a running job
finish and exits 0; ``delayq stats`` in a third process sees the result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

APP = """
import gc
import os
import time

from delayq import App

app = App()  # $DELAYQ_URL


def record(*parts):
    with open(os.environ["WLOG"], "a") as log:  # one short O_APPEND write: atomic
        log.write(" ".join(map(str, parts)) + "\\n")


@app.task(queue="jobs")
def work(n):
    record("ran", n, time.time())


@app.task(queue="jobs")
def heap():
    record("frozen", gc.get_freeze_count())


@app.task(queue="slow")
def slow(seconds):
    record("start", seconds)
    time.sleep(seconds)
    record("done", seconds)
"""


class Project:
    """A directory with ``examples_app.py``, a SQLite queue and a log of what ran."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "examples_app.py").write_text(textwrap.dedent(APP))
        self.log = root / "log.txt"
        self.log.touch()
        self.env = {key: value for key, value in os.environ.items() if key != "FORCE_COLOR"}
        self.env.update(DELAYQ_URL=f"sqlite:///{root / 'q.db'}", WLOG=str(self.log))
        self.procs: list[subprocess.Popen[str]] = []

    def delayq(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "delayq.cli", *args],
            cwd=self.root,
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def put(self, queue: str, payload: object, *options: str) -> str:
        result = self.delayq("put", queue, json.dumps(payload), *options)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def worker(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "worker", "examples_app:app", *args],
            cwd=self.root,
            env=self.env,
            stdout=subprocess.PIPE,
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
                if proc.poll() is not None:
                    pytest.fail(f"worker exited {proc.returncode}: {proc.communicate()[1]}")
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.02)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    env = Project(tmp_path)
    yield env
    for proc in env.procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def envelope(task: str, *args: object) -> dict[str, object]:
    return {"task": task, "args": list(args), "kwargs": {}}


def test_worker_runs_what_put_sent_and_exits_0_on_sigterm(project: Project) -> None:
    put_at = time.time()
    delayed = project.put("jobs", envelope("work", "later"), "--delay", "700ms", "--id", "later")
    assert delayed == "later"
    project.put("jobs", envelope("work", "now"))
    piped = project.delayq("put", "jobs", "-", input=json.dumps(envelope("work", "piped")))
    assert piped.returncode == 0, piped.stderr

    worker = project.worker("--concurrency", "2", "--grace", "2")
    project.wait(lambda: len(project.lines("ran")) == 3)
    ran = {name: float(at) for name, at in project.lines("ran")}
    assert set(ran) == {"now", "piped", "later"}
    assert ran["later"] >= put_at + 0.7  # never early

    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=15)
    assert worker.returncode == 0, err
    assert "worker.stopped" in err
    assert "Traceback" not in err

    stats = project.delayq("stats", "jobs", "--json")
    assert stats.returncode == 0, stats.stderr
    [row] = json.loads(stats.stdout)
    assert (row["scheduled"], row["ready"], row["active"], row["dead"]) == (0, 0, 0, 0)


def test_sigterm_lets_a_running_job_finish(project: Project) -> None:
    project.put("slow", envelope("slow", 1.0), "--id", "slow-1")
    worker = project.worker("--queues", "slow", "--grace", "10", "--lease", "5s")
    project.wait(lambda: len(project.lines("start")) == 1)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=15)
    assert worker.returncode == 0, err
    assert project.lines("done") == [["1.0"]]  # finished within the grace period
    gone = project.delayq("get", "slow", "slow-1")
    assert gone.returncode == 1  # acked: no longer stored
    assert "no message 'slow-1'" in gone.stderr


def test_worker_with_a_bad_app_path_says_so_in_one_line(project: Project) -> None:
    result = project.delayq("worker", "examples_app:nope")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: examples_app:nope: 'examples_app' has no attribute 'nope' "
        "(see 'delayq worker --help')"
    ]


@pytest.mark.parametrize(
    ("files", "spec", "place"),
    [
        ({"shop.py": "from delayq import App\napp = App()\ndef f(:\n"}, "shop:app", "shop.py:3"),
        (
            {"shop/__init__.py": "from .tasks import app\n", "shop/tasks.py": "app = (\n"},
            "shop:app",
            "shop/tasks.py:1",
        ),
    ],
    ids=["module", "package"],
)
def test_a_syntax_error_in_the_app_is_one_line_with_its_file_and_line(
    project: Project, files: dict[str, str], spec: str, place: str
) -> None:
    for name, text in files.items():
        (project.root / name).parent.mkdir(exist_ok=True)
        (project.root / name).write_text(text)
    result = project.delayq("worker", spec)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: importing 'shop' failed: SyntaxError: "), line
    assert line.endswith(f" ({place})"), line
    assert "frozen" not in line


def test_worker_sets_its_start_up_heap_aside(project: Project) -> None:
    """The objects alive once the worker is set up (redis-py's and the app's imports,
    tens of thousands) are frozen: a full collection, which would scan them all and stop
    the worker for tens of milliseconds, sees only what came later."""
    project.put("jobs", envelope("heap"))
    worker = project.worker()
    project.wait(lambda: len(project.lines("frozen")) == 1)
    [[count]] = project.lines("frozen")
    assert int(count) > 10_000
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 0
