"""User mistakes: one red line on stderr, exit 2 (usage) or 1 (run time), no traceback."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from delayq import Queue

from ._helpers import Cli, one_error_line

AT = "2031-01-01T00:00:00"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["put", "q", "{bad"], "PAYLOAD is not valid JSON"),
        (["put", "q", "hello"], "quote a string"),
        (["put", "q", "1", "--delay", "3 parsecs"], "unknown duration"),
        (["put", "q", "1", "--delay", "-5 s"], "unknown duration"),
        (["put", "q", "1", "--at", AT], "has no time zone"),
        (["put", "q", "1", "--at", "next tuesday"], "not an ISO 8601 date"),
        (["put", "q", "1", "--delay", "1s", "--at", AT + "Z"], "not both"),
        (["put", "q", "1", "--header", "novalue"], "expected KEY=VALUE"),
        (["put", "q", "1", "--on-conflict", "merge"], "--on-conflict"),
        (["put", "q", "1", "--max-attempts", "0"], "--max-attempts"),
        (["put", "q"], "Missing argument 'PAYLOAD'"),
        (["put", "", "1"], "queue name must be 1 to 255 characters"),
        (["put", "q", "1", "--id", "x" * 300], "message id must be 1 to 255 characters"),
        (["reschedule", "q", "id"], "--delay DURATION or --at"),
        (["stats", "--interval", "0"], "--interval"),
        (["purge", "q", "--state", "gone"], "--state"),
        (["frobnicate"], "No such command"),
    ],
)
def test_usage_errors_exit_2(cli: Cli, args: list[str], expected: str) -> None:
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert expected in one_error_line(result)


@pytest.mark.parametrize(
    "bad_url",
    ["mqtt://localhost", "not a url", "sqlite:///x.db?cache=shared", "redis://host:99999"],
)
def test_a_bad_url_is_a_usage_error(cli: Cli, bad_url: str, tmp_path: Path) -> None:
    result = cli("put", "q", "1", "--url", bad_url, url=False)
    assert result.exit_code == 2, result.output
    assert "--url" in one_error_line(result) or "sqlite:// URL" in result.stderr


def test_a_bad_delayq_url_is_reported(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYQ_URL", "nope")
    result = cli("stats", url=False)
    assert result.exit_code == 1
    assert "$DELAYQ_URL" in one_error_line(result)


def test_a_missing_message_exits_1(cli: Cli) -> None:
    assert cli("put", "q", "1", "--id", "here").exit_code == 0
    for command in (["get", "q", "gone"], ["cancel", "q", "gone"]):
        result = cli(*command)
        assert result.exit_code == 1
        assert "no message 'gone' in queue 'q'" in one_error_line(result)


def test_a_duplicate_id_exits_1(cli: Cli) -> None:
    assert cli("put", "q", "1", "--id", "x").exit_code == 0
    result = cli("put", "q", "2", "--id", "x", "--on-conflict", "error")
    assert result.exit_code == 1
    assert "duplicate id" in one_error_line(result)


def test_a_payload_too_large_is_a_usage_error(cli: Cli) -> None:
    result = cli("put", "q", "-", input='"' + "x" * (1024 * 1024 + 10) + '"')
    assert result.exit_code == 2
    one_error_line(result)


def test_reading_a_database_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    cli = Cli(f"sqlite:///{path}")
    for command in (["get", "q", "x"], ["stats"], ["dead", "q"], ["purge", "q", "-y"]):
        result = cli(*command)
        assert result.exit_code == 1
        assert f"no queue database at {path}" in one_error_line(result)
    assert not path.exists()


def test_an_unopenable_database_exits_1(tmp_path: Path) -> None:
    cli = Cli(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
    result = cli("put", "q", "1")
    assert result.exit_code == 1
    assert "cannot use the queue at sqlite:///" in one_error_line(result)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.skipif(importlib.util.find_spec("redis") is None, reason="needs redis-py")
def test_a_server_that_is_down_exits_1() -> None:
    port = closed_port()
    url = f"redis://127.0.0.1:{port}/0"
    down = f"the server is not answering at 127.0.0.1:{port}"
    cli = Cli(url)
    for command in (["put", "q", "1"], ["stats", "q"]):
        result = cli(*command)
        assert result.exit_code == 1
        line = one_error_line(result)
        assert line == f"error: cannot use the queue at {url}: {down}"


@pytest.mark.skipif(importlib.util.find_spec("redis") is None, reason="needs redis-py")
def test_an_error_does_not_print_the_urls_password(monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port()
    monkeypatch.setenv("DELAYQ_URL", f"redis://:hunter2@127.0.0.1:{port}/0")
    result = Cli("")("stats", "q", url=False)
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "hunter2" not in result.output
    assert f"cannot use the queue at redis://:***@127.0.0.1:{port}/0" in line


def test_help_lists_every_command(cli: Cli) -> None:
    result = cli("--help", url=False)
    assert result.exit_code == 0
    for name in ("demo", "worker", "put", "get", "cancel", "reschedule", "stats", "dead"):
        assert name in result.stdout
    assert "purge" in result.stdout


def test_a_message_the_queue_cannot_touch_is_left_alone(cli: Cli, url: str) -> None:
    with Queue(url, name="q") as queue:
        queue.put(1, id="held")
        assert queue.reserve(wait=0, lease=60)
        result = cli("cancel", "q", "held")
        assert result.exit_code == 1
        assert "in flight" in one_error_line(result)
        assert queue.get("held") is not None
