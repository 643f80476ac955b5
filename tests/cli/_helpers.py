"""Shared helpers of the CLI tests: run ``delayq`` in-process, check error lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from delayq.cli import main
from delayq.durable.registry import redact_url


class Cli:
    """Runs ``delayq ...`` in-process (CliRunner) against one queue URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None, url: bool = True) -> Result:
        if url and redact_url(self.url) != self.url:
            # As the warning of a password in --url advises (amqp://guest:guest@...).
            return self.runner.invoke(main, list(args), input=input, env={"DELAYQ_URL": self.url})
        argv = [*args, "--url", self.url] if url else list(args)
        return self.runner.invoke(main, argv, input=input)


def one_error_line(result: Result) -> str:
    """The failed command printed exactly one line, on stderr, nothing on stdout,
    and no traceback; returns that line."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert result.stdout == "", result.stdout
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), result.exception
    return lines[0]


def command_args(command: str, tmp_path: Path) -> list[str]:
    """The arguments of ``delayq <command>`` that opens a queue (``worker`` runs an App
    of ``tmp_path``, which it writes), before ``--url``."""
    (tmp_path / "tasks.py").write_text(
        "from delayq import App\n\napp = App('memory://')\n\n\n"
        "@app.task\ndef noop() -> None:\n    pass\n"
    )
    return {
        "stats": ["stats"],
        "put": ["put", "jobs", "{}"],
        "worker": ["worker", "tasks:app"],
        "serve": ["serve", "--port", "0"],
        "scheduler": ["scheduler"],
    }[command]


def run_delayq(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``delayq <args>`` in a process of its own (the environment inherited: PYTHONPATH
    may point at another copy of the code), its output as text."""
    program = f"import sys\nfrom delayq.cli import main\nsys.argv = ['delayq', *{args!r}]\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )


def error_lines(run: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a command printed on stderr, but the warning about a password in --url
    (the tests pass one there on purpose)."""
    lines = [text for text in run.stderr.splitlines() if text.strip()]
    return [text for text in lines if not text.startswith("warning: a password in --url")]
