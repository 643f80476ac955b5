"""What the reading commands print: a payload's text as itself on every command, no
wrapping when stdout is not a terminal, ``stats --watch`` on a pipe, ``--json``."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.durable.queue import Queue

from ._helpers import Cli

_LONG_ID = "order-" + "x" * 90  # with the due time, a line far wider than 80 columns


@pytest.fixture
def queue(url: str) -> Iterator[Queue]:
    with Queue(url, name="jobs") as q:
        yield q


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """No COLUMNS: the width rich picks for a pipe is its own."""
    monkeypatch.delenv("COLUMNS", raising=False)


def _dead(queue: Queue, message_id: str, payload: object) -> None:
    """Make ``message_id`` dead; call it before any other message is ready."""
    queue.put(payload, id=message_id, max_attempts=1)
    [msg] = queue.reserve(wait=0)
    queue.nack(msg, error="boom")


def test_non_ascii_payload_is_shown_as_itself_by_every_reading_command(
    cli: Cli, queue: Queue
) -> None:
    _dead(queue, "d", {"item": "café ☕"})
    queue.put({"item": "café ☕"}, id="w")
    for args in (("ls", "jobs"), ("get", "jobs", "w"), ("dead", "jobs")):
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert "café ☕" in result.stdout, (args, result.stdout)
        assert "\\u00e9" not in result.stdout, (args, result.stdout)


def test_a_long_line_is_not_wrapped_when_stdout_is_not_a_terminal(
    cli: Cli, queue: Queue, piped: None
) -> None:
    queue.put({"n": 1}, id=_LONG_ID, delay="1h")
    due = queue.get(_LONG_ID)
    assert due is not None
    result = cli("ls", "jobs")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if _LONG_ID in line]
    assert len(rows) == 1, result.stdout  # the id whole, on one line...
    assert '{"n": 1}' in rows[0]  # ...with the rest of its row
    assert any(len(line) > 80 for line in result.stdout.splitlines())


def test_json_of_every_reading_command_has_the_http_field_names(cli: Cli, queue: Queue) -> None:
    _dead(queue, "d", {"n": 2})
    queue.put({"item": "café"}, id="w", delay="1h")
    message_fields = {"id", "queue", "state", "due_at", "due_at_iso", "attempts"}
    message_fields |= {"max_attempts", "headers", "last_error", "lease_expires_at", "payload"}
    got = json.loads(cli("get", "jobs", "w", "--json").stdout)
    assert message_fields <= got.keys()
    assert got["payload"] == {"item": "café"}
    (listed,) = json.loads(cli("ls", "jobs", "--json").stdout)
    assert listed == got
    (gone,) = json.loads(cli("dead", "jobs", "--json").stdout)
    assert (gone["id"], gone["state"], gone["last_error"]) == ("d", "dead", "boom")
    (row,) = json.loads(cli("stats", "jobs", "--json").stdout)
    stats_fields = {"name", "scheduled", "ready", "active", "dead", "next_due_at", "lag"}
    assert stats_fields <= row.keys()
    assert (row["name"], row["scheduled"], row["dead"]) == ("jobs", 1, 1)


#: ``delayq`` with Ctrl-C's signal at its default, as in a user's terminal: a suite
#: started in the background of a shell without job control (``cmd &`` in a script, as
#: CI may) ignores SIGINT, every child inherits that, and the watch never saw the Ctrl-C
#: these tests send (each waited 20 s, then killed it).
_CTRL_C_AT_DEFAULT = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'delayq'; runpy.run_module('delayq.cli', run_name='__main__')"
)


def _start_watch(url: str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``delayq stats jobs --watch ARGS`` in a process of its own, stdout and stderr
    on pipes."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "DELAYQ_URL")}
    command = [sys.executable, "-c", _CTRL_C_AT_DEFAULT, "stats", "jobs", "--watch"]
    command += ["--interval", "0.05"]
    return subprocess.Popen(
        [*command, *args, "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )


def _watch_lines(url: str, tmp_path: Path, *args: str, lines: int) -> list[str]:
    """Run ``delayq stats --watch ARGS`` with stdout on a pipe until it has printed
    ``lines`` lines (or 20 s passed), interrupt it, and return what it printed."""
    process = _start_watch(url, tmp_path, *args)
    assert process.stdout is not None
    stdout = process.stdout
    printed: list[str] = []

    def read() -> None:  # on a thread: a command that never flushes cannot block the test
        for line in stdout:
            printed.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 20.0
    try:
        while len(printed) < lines and reader.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        got = list(printed[:lines])
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join()
    return got


def test_stats_watch_json_on_a_pipe_prints_a_line_per_interval(
    url: str, queue: Queue, tmp_path: Path
) -> None:
    queue.put({"n": 1}, id="a")
    printed = _watch_lines(url, tmp_path, "--json", lines=3)
    assert len(printed) == 3, printed
    for line in printed:
        (row,) = json.loads(line)
        assert (row["name"], row["ready"]) == ("jobs", 1)


def test_stats_watch_on_a_pipe_prints_the_table_per_interval(
    url: str, queue: Queue, tmp_path: Path
) -> None:
    queue.put({"n": 1}, id="a")
    printed = _watch_lines(url, tmp_path, lines=40)
    titles = [line for line in printed if line.startswith("delayq queues at")]
    assert len(titles) >= 3, printed


def test_a_payload_that_cannot_be_read_is_said_so_as_over_http(cli: Cli, url: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pickle's warning
        with Queue(url, name="jobs", serializer=pickle) as pickled:
            pickled.put({"made": "by pickle"}, id="foreign")
    data = json.loads(cli("get", "jobs", "foreign", "--json").stdout)
    assert data["payload"] is None
    assert "pickle" in data["payload_error"]
    for args in (("ls", "jobs"), ("get", "jobs", "foreign")):
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert "cannot be shown" in result.stdout, (args, result.stdout)


def test_stats_watch_ends_quietly_when_its_reader_leaves(
    url: str, queue: Queue, tmp_path: Path
) -> None:
    for extra in (["--json"], []):
        process = _start_watch(url, tmp_path, *extra)
        assert process.stdout is not None
        assert process.stderr is not None
        process.stdout.readline()
        process.stdout.close()  # as `| head -1` does
        try:
            process.wait(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.stderr.read() == "", extra  # no "cannot use the queue" line
        assert process.returncode == 1, extra  # as rich ends the table's watch


def test_dead_tracebacks_on_a_pipe_have_a_short_heading_line(
    cli: Cli, queue: Queue, piped: None
) -> None:
    _dead(queue, "d", {"n": 1})
    result = cli("dead", "jobs", "--traceback")
    assert result.exit_code == 0, result.output
    [heading] = [line for line in result.stdout.splitlines() if line.startswith("d ")]
    assert "(1/1 attempts)" in heading
    assert len(heading) <= 80, len(heading)  # a rule, not 100,000 characters of one
    assert "boom" in result.stdout
