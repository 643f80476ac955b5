"""``delayq serve`` as users run it (``make run`` runs it on sqlite:///delayq.db): a
real process on a free port, real HTTP, stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ADDRESS = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/)")
#: ``delayq`` as its console script runs it, printing at exit how many objects the
#: process had frozen out of the garbage collector's sight.
REPORT_FROZEN_AT_EXIT = (
    "import atexit, gc; "
    "atexit.register(lambda: print('frozen', gc.get_freeze_count(), flush=True)); "
    "from delayq.cli import main; main()"
)


def _environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DELAYQ_TOKEN", "DELAYQ_URL")}
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("DELAYQ_SIGNING_SECRET", None)
    return env


def read_to_address(process: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """The base URL a starting ``delayq serve`` prints, and its output lines up to it."""
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if match := ADDRESS.search(line):
            return match.group(1), lines
    raise AssertionError("no dashboard address in:\n" + "".join(lines))


def serve_once(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``delayq serve ARGS`` over a sqlite file of ``tmp_path``, for a start that must
    fail: its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", "serve", "--url", f"sqlite:///{tmp_path}/s.db",
         *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_environ(),
    )  # fmt: skip


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``delayq serve`` on port 0 over a sqlite file in tmp_path: the process, its base
    URL and the stdout lines read up to the dashboard line."""
    process = subprocess.Popen(
        [sys.executable, "-c", REPORT_FROZEN_AT_EXIT, "serve",
         "--url", f"sqlite:///{tmp_path}/s.db", "--port", "0", "--no-dispatch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=_environ(),
    )  # fmt: skip
    try:
        base, lines = read_to_address(process)
        yield process, base, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_serve_answers_http_and_stops_on_sigterm(
    served: tuple[subprocess.Popen[str], str, list[str]],
) -> None:
    process, base, lines = served
    assert not any("signing secret" in line for line in lines)
    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        put = http.post("/v1/queues/orders/messages", json={"payload": {"n": 1}, "id": "o1"})
        assert put.status_code == 201
        assert http.get("/v1/queues/orders/messages/o1").json()["payload"] == {"n": 1}
        assert http.get("/").status_code == 200  # the dashboard
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0
    # Set up, it froze its heap (FastAPI's, uvicorn's, redis-py's objects): a full
    # collection no longer scans them, which stopped it for tens of milliseconds.
    assert process.stdout is not None
    [frozen] = re.findall(r"^frozen (\d+)$", process.stdout.read(), re.MULTILINE)
    assert int(frozen) > 10_000


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_long_poll_of_a_client_that_left_claims_nothing(
    served: tuple[subprocess.Popen[str], str, list[str]],
) -> None:
    process, base, _ = served
    port = int(base.rsplit(":", 1)[1].strip("/"))
    body = b'{"wait": 25}'
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            b"POST /v1/queues/lp/reserve HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.5)
    time.sleep(0.5)  # the server notices the client is gone
    with httpx.Client(base_url=base, timeout=10) as http:
        http.post("/v1/queues/lp/messages", json={"payload": 1, "id": "after"})
        taken = http.post("/v1/queues/lp/reserve", json={"wait": 5}).json()["messages"]
        assert [m["id"] for m in taken] == ["after"]
    process.send_signal(signal.SIGINT)
    assert process.wait(20) == 0


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_sigterm_ends_a_waiting_long_poll(
    served: tuple[subprocess.Popen[str], str, list[str]],
) -> None:
    """SIGTERM once the server shows the long poll waiting (``delayq_long_polls``):
    the poll answers at once, with nothing, and the server exits 0."""
    process, base, _ = served
    answers: list[httpx.Response] = []

    def long_poll() -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            answers.append(http.post("/v1/queues/idle/reserve", json={"wait": 25}))

    with httpx.Client(base_url=base, timeout=10) as http:
        assert _long_polls(http) == 0
        started = time.monotonic()
        poll = threading.Thread(target=long_poll)
        poll.start()
        while _long_polls(http) != 1:
            assert time.monotonic() - started < 10, "the long poll never waited"
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        poll.join(30)
    [response] = answers
    assert response.json() == {"messages": []}
    assert time.monotonic() - started < 15
    assert process.wait(20) == 0


def _long_polls(http: httpx.Client) -> int:
    """The reserves waiting on the server now, as its metrics say."""
    [value] = re.findall(r"^delayq_long_polls (\S+)$", http.get("/metrics").text, re.MULTILINE)
    return int(float(value))


@pytest.mark.parametrize("host", ["0.0.0.0", "evil.localhost"])
def test_non_loopback_bind_without_token_is_one_line_exit_2(tmp_path: Path, host: str) -> None:
    """A name under ``.localhost`` is no loopback bind: the resolver that binds it may
    answer any address."""
    result = serve_once(tmp_path, "--host", host)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "without a token" in lines[0]
    assert "--token-file" in lines[0]
    assert not (tmp_path / "s.db").exists()


def test_a_busy_port_is_one_line_before_anything_else(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        result = serve_once(tmp_path, "--port", str(port))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: cannot listen on http://127.0.0.1:{port}/: the port is in use: stop what "
        "holds it, or choose another with --port"
    ]
    assert not (tmp_path / "s.db").exists()
