"""A RabbitMQ that refuses the first connection (down, a virtual host that does not
exist, a wrong password): ``delayq stats``, ``put``, ``worker``, ``serve`` and
``scheduler`` each exit 1 with the one line the Python faces raise
(tests/backends/test_amqp_open.py), without the password and without aiormq's log
lines. On a namespace where no scheduler runs, ``stats`` and ``put`` say so at once,
and how to run one; with ``delayq scheduler`` running, they succeed."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("aiormq")
pytest.importorskip("pika")

from backends._amqp_mistakes import NAMES, line, mistakes, not_running
from conformance.conftest import amqp_url

from ._helpers import command_args, error_lines, run_delayq


@pytest.mark.parametrize("command", ["stats", "put", "worker", "serve", "scheduler"])
@pytest.mark.parametrize("mistake", NAMES)
def test_each_command_says_why_in_one_line(mistake: str, command: str, tmp_path: Path) -> None:
    url, reason = mistakes()[mistake]
    run = run_delayq([*command_args(command, tmp_path), "--url", url], tmp_path)
    assert run.returncode == 1, run.stderr
    if command == "scheduler":  # it logs its start first
        assert "scheduler_process_started" in run.stderr
        assert "hunter2" not in run.stderr
        lines = [text for text in error_lines(run) if " INFO delayq: " not in text]
    else:
        lines = error_lines(run)
    assert lines == [f"error: {line(url, reason)}"], run.stderr
    assert run.stdout == ""


@pytest.fixture
def plain_url(tmp_path: Path) -> Iterator[str]:
    """A fresh namespace's URL, as a user writes it (no scheduler option)."""
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace).replace("&scheduler=on", "")


def test_without_a_scheduler_a_command_says_how_to_run_one(plain_url: str, tmp_path: Path) -> None:
    default = 10.0  # the request timeout the commands waited out before
    for command in ("stats", "put"):
        started = time.monotonic()
        run = run_delayq([*command_args(command, tmp_path), "--url", plain_url], tmp_path)
        took = time.monotonic() - started  # a Python process's start included
        assert run.returncode == 1, run.stderr
        assert error_lines(run) == [f"error: {not_running(plain_url)}"], run.stderr
        assert took < default / 2, took
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "scheduler", "--url", plain_url],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert scheduler.stderr is not None
        for text in scheduler.stderr:  # until it is elected
            if "scheduler_elected" in text:
                break
        for command in ("put", "stats"):
            run = run_delayq([*command_args(command, tmp_path), "--url", plain_url], tmp_path)
            assert run.returncode == 0, run.stderr
        assert '"ready": 1' in run.stdout or "ready" in run.stdout
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.communicate(timeout=30)
