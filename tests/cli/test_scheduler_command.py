"""``delayq scheduler``: a process that is only the scheduler of an amqp:// namespace,
so producers and consumers that never stand get served; and the startup check of the
long-running commands on an amqp:// namespace that has no scheduler yet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.conftest import amqp_url
from delayq import Queue
from delayq.cli._common import check_backend

from ._helpers import Cli, one_error_line

pytest.importorskip("aiormq")


@pytest.fixture
def plain_url(tmp_path: Path) -> Iterator[str]:
    """A fresh amqp:// namespace, its URL as a user writes it (no scheduler option)."""
    for url in amqp_url(tmp_path):
        yield url.replace("&scheduler=on", "")


def test_only_a_replicated_backend_has_a_scheduler(tmp_path: Path) -> None:
    result = Cli(f"sqlite:///{tmp_path / 'q.db'}")("scheduler")
    assert result.exit_code == 2
    assert "only amqp:// and amqps:// have an elected scheduler" in one_error_line(result)


def test_a_scheduler_process_serves_clients_that_never_stand(plain_url: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "scheduler", "--url", plain_url],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        with Queue(plain_url, name="jobs", scheduler="off", request_timeout=1) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    id = client.put("hello")
                    break
                except OSError:  # no scheduler elected yet
                    assert process.poll() is None, process.communicate()[1]
                    assert time.monotonic() < deadline
            [message] = client.reserve(wait=0)
            assert message.id == id
            client.ack(message)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "scheduler_elected" in err


def test_the_startup_check_passes_on_a_namespace_without_a_scheduler(plain_url: str) -> None:
    check_backend(plain_url, "jobs", 20.0)  # raises CliError when it does not answer
