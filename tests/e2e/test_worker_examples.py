"""Every script of examples/ runs on its own against SQLite in a fresh directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

EXPECTED = {
    "order_timeout.py": ["order 2: paid -> timeout cancelled", "cancelled orders: [1, 3]"],
    "webhook_retry.py": [
        "flaky.example/hook attempt 3",
        "dead letter: https://down.example/hook after 3 attempts: ConnectionError",
    ],
    "reminder.py": ["reminder for ada: stand-up"],
    "daily_cron.py": ["next nightly report:", "heartbeat: cron:heartbeat:"],
}


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_and_tells_its_story(script: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for text in EXPECTED[script]:
        assert text in result.stdout, result.stdout + result.stderr
    assert_tracebacks_only_of_failed_jobs(result.stderr)


def assert_tracebacks_only_of_failed_jobs(stderr: str) -> None:
    """The only tracebacks are those the worker logs with a failed job (where its task
    raised): nothing else crashed."""
    event = ""
    for line in stderr.splitlines():
        if line.startswith("Traceback"):
            assert "job.failed" in event, stderr
        elif not line.startswith((" ", "\t")) and any(
            kind in line for kind in ("job.", "worker.", "cron.")
        ):
            event = line
