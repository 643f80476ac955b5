"""Shared helpers of the CLI tests: run ``delayq`` in-process, check error lines."""

from __future__ import annotations

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
