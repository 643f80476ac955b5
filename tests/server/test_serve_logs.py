"""``delayq serve`` writes its log lines (uvicorn's and delayq's) with their time, as
the worker does: a real process on a free port."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .test_serve_command import _environ, read_to_address

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) ")


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_serve_log_lines_carry_their_time(tmp_path: Path) -> None:
    env = _environ()
    env["DELAYQ_TOKEN"] = "a-token-for-the-log-test"
    process = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "serve", "--url", f"sqlite:///{tmp_path}/s.db",
         "--port", "0", "--no-dispatch", "--access-log"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )  # fmt: skip
    try:
        base, lines = read_to_address(process)
        wrong = httpx.get(f"{base}v1/queues", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
        assert process.stdout is not None
        lines += process.stdout.read().splitlines(keepends=True)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    logged = [line for line in lines if " uvicorn." in line or " delayq" in line]
    assert any("Application startup complete" in line for line in logged), lines
    assert any(" delayq: auth.failed" in line for line in logged), lines
    assert any('"GET /v1/queues HTTP/1.1" 401' in line for line in logged), lines
    for line in logged:
        assert STAMPED.match(line), line
