"""``delayq demo`` end to end: a real subprocess, real time, the summary line checked.

The default engine is the durable queue (``--url``, else ``$DELAYQ_URL``, else
``sqlite:///delayq.db`` in the current directory); ``--engine inproc`` runs the
same scenario on the in-process Scheduler.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from delayq import Queue
from delayq.cli import main
from delayq.cli._demo import PAID_SHARE

SUMMARY = re.compile(
    r"^fired=(?P<fired>\d+) cancelled=(?P<cancelled>\d+) p50=(?P<p50>[\d.]+)ms "
    r"p99=(?P<p99>[\d.]+)ms max=(?P<max>[\d.]+)ms early=(?P<early>\d+) "
    r"elapsed=(?P<elapsed>[\d.]+)s$",
    re.MULTILINE,
)
DURABLE_SUMMARY = re.compile(
    r"^fired=(?P<fired>\d+) cancelled=(?P<cancelled>\d+) rescheduled=(?P<rescheduled>\d+) "
    r"p50=(?P<p50>[\d.]+)ms p99=(?P<p99>[\d.]+)ms max=(?P<max>[\d.]+)ms "
    r"early=(?P<early>\d+) lost=(?P<lost>\d+) elapsed=(?P<elapsed>[\d.]+)s$",
    re.MULTILINE,
)
HEADER = re.compile(r"engine=durable, url=(?P<url>\S+), queue=(?P<queue>demo-\d+-\d+),")
FIRING = re.compile(r"expired: order cancelled\s+late\s+[\d.]+ ms")


def run_demo(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=env,
    )
    return result, time.monotonic() - started


def environ(**changes: str | None) -> dict[str, str]:
    """This process's environment without ``DELAYQ_URL``, then ``changes`` applied
    (None removes a variable)."""
    env = {key: value for key, value in os.environ.items() if key != "DELAYQ_URL"}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def check_durable_run(
    result: subprocess.CompletedProcess[str], took: float, orders: int, window: float
) -> re.Match[str]:
    """The durable demo settled every order, fired nothing early, lost nothing, took
    about ``window`` seconds and printed one line per firing and per reschedule."""
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    match = DURABLE_SUMMARY.search(result.stdout)
    assert match, result.stdout
    fired, cancelled = int(match["fired"]), int(match["cancelled"])
    assert fired + cancelled == orders
    assert cancelled > 0
    assert int(match["early"]) == 0
    assert int(match["lost"]) == 0
    assert float(match["p50"]) <= float(match["p99"]) <= float(match["max"])
    assert len(FIRING.findall(result.stdout)) == fired
    assert result.stdout.count("more time: deadline moved") == int(match["rescheduled"])
    assert 0.5 * window <= float(match["elapsed"]) <= window + 4.0  # generous bounds
    assert took < 30.0
    return match


def queue_total(url: str, name: str) -> int:
    with Queue(url, name=name) as q:
        return q.stats().total


@pytest.mark.slow
def test_durable_demo_on_a_given_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/demo.db"
    result, took = run_demo(
        "--orders", "60", "--window", "1", "--seed", "7", "--url", url, env=environ()
    )
    match = check_durable_run(result, took, orders=60, window=1.0)
    assert int(match["rescheduled"]) > 0  # seed 7 plans two reschedules
    assert (tmp_path / "demo.db").is_file()  # the database stays...
    header = HEADER.search(result.stdout)
    assert header, result.stdout
    assert header["url"] == url
    assert queue_total(url, header["queue"]) == 0  # ...but the run's queue is purged


@pytest.mark.slow
def test_durable_demo_defaults_to_delayq_db_in_the_current_directory(tmp_path: Path) -> None:
    result, took = run_demo("--orders", "60", "--window", "1", cwd=tmp_path, env=environ())
    check_durable_run(result, took, orders=60, window=1.0)
    header = HEADER.search(result.stdout)
    assert header, result.stdout
    assert header["url"] == "sqlite:///delayq.db"
    assert (tmp_path / "delayq.db").is_file()
    assert queue_total(f"sqlite:///{tmp_path}/delayq.db", header["queue"]) == 0


@pytest.mark.slow
def test_durable_demo_follows_delayq_url(tmp_path: Path) -> None:
    env = environ(DELAYQ_URL="sqlite:///other.db")
    result, took = run_demo("--orders", "30", "--window", "0.5", cwd=tmp_path, env=env)
    check_durable_run(result, took, orders=30, window=0.5)
    assert (tmp_path / "other.db").is_file()
    assert not (tmp_path / "delayq.db").exists()


@pytest.mark.slow
def test_repeated_durable_demos_share_the_file_but_not_the_queue(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/demo.db"
    names = []
    for _ in range(2):
        result, took = run_demo("--orders", "20", "--window", "0.3", "--url", url, env=environ())
        check_durable_run(result, took, orders=20, window=0.3)
        header = HEADER.search(result.stdout)
        assert header, result.stdout
        names.append(header["queue"])
    assert names[0] != names[1]
    assert [queue_total(url, name) for name in names] == [0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("store", ["heap", "wheel"])
def test_inproc_demo_settles_every_order_and_fires_nothing_early(store: str) -> None:
    result, took = run_demo(
        "--engine", "inproc", "--orders", "60", "--window", "1", "--seed", "7", "--store", store
    )
    assert result.returncode == 0, result.stderr
    match = SUMMARY.search(result.stdout)
    assert match, result.stdout
    fired, cancelled = int(match["fired"]), int(match["cancelled"])
    assert fired + cancelled == 60
    assert cancelled > 0
    assert int(match["early"]) == 0
    assert float(match["p50"]) <= float(match["p99"]) <= float(match["max"])
    # one line per firing, each with its lateness
    assert len(FIRING.findall(result.stdout)) == fired
    assert 0.5 <= float(match["elapsed"]) <= 5.0  # about the window; bounds are generous
    assert took < 30.0


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--orders", "0"], "--orders"),
        (["--engine", "inproc", "--store", "list"], "--store"),
        (["--engine", "kafka"], "--engine"),
        (["--url", "mqtt://localhost"], "--url"),  # a scheme delayq has no backend for
        (["--url", "not a url"], "--url"),
        (["--store", "heap"], "--store"),  # the durable engine has no store
        (["--engine", "inproc", "--url", "memory://"], "--url"),
    ],
)
def test_demo_rejects_bad_options(args: list[str], complaint: str, tmp_path: Path) -> None:
    result, _ = run_demo(*args, cwd=tmp_path, env=environ())
    assert result.returncode == 2, result.stdout + result.stderr
    assert complaint in result.stderr
    assert not (tmp_path / "delayq.db").exists()  # nothing was opened


def test_demo_rejects_a_bad_delayq_url(tmp_path: Path) -> None:
    result, _ = run_demo("--orders", "5", cwd=tmp_path, env=environ(DELAYQ_URL="nope"))
    assert result.returncode == 1
    assert "DELAYQ_URL" in result.stderr


def test_help_lists_the_demo() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert "demo" in result.stdout


def test_the_help_and_the_readme_give_the_paid_share_the_demo_uses() -> None:
    shown = f"about {PAID_SHARE:.0%}"
    result = CliRunner().invoke(main, ["demo", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"{shown} of the orders are paid in time" in " ".join(result.output.split())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"pays {shown} of them in time" in " ".join(readme.split())
