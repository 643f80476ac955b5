"""``delayq serve`` as a real process against clients that misbehave on the wire:
connections that send nothing or too slowly, oversized heads, more connections than
it serves; and what its command line shows and reads (passwords, secrets, tokens)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

ADDRESS = re.compile(r"dashboard: (http://127\.0\.0\.1:(\d+)/)")
TOKEN = "a-token-read-from-a-file"


@contextmanager
def serving(
    tmp_path: Path, *args: str, url: str | None = None, dispatch: bool = False
) -> Iterator[Server]:
    """``delayq serve --port 0 ARGS`` over ``url`` (default: a sqlite file of
    tmp_path), until the block ends (then SIGTERM, and its exit status must be 0)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    environ["PYTHONUNBUFFERED"] = "1"
    process = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "serve", "--port", "0",
         "--url", url or f"sqlite:///{tmp_path}/s.db", *args,
         *([] if dispatch else ["--no-dispatch"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=environ,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        match = None
        while match is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = ADDRESS.search(line)
        assert match is not None, "".join(lines)
        yield Server(process, match.group(1), int(match.group(2)), lines)
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


class Server:
    """A running ``delayq serve``: its process, base URL, port and first lines."""

    def __init__(self, process: subprocess.Popen[str], base: str, port: int, lines: list[str]):
        self.process = process
        self.base = base
        self.port = port
        self.lines = lines

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=15)
        return sock

    def healthy(self) -> bool:
        with httpx.Client(base_url=self.base, timeout=10) as http:
            return bool(http.get("/healthz").json() == {"status": "ok"})


def _read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_slow_and_silent_clients_are_cut_off(tmp_path: Path) -> None:
    with serving(tmp_path, "--client-timeout", "1") as server:
        silent = server.connect()
        slow_head = server.connect()
        slow_head.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        slow_body = server.connect()
        slow_body.sendall(
            b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: localhost\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"payload"'
        )
        # Meanwhile everybody else is served.
        assert server.healthy()
        assert _read_all(silent) == b""  # never sent a byte: closed without a word
        assert _read_all(slow_head).startswith(b"HTTP/1.1 408")
        answer = _read_all(slow_body)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"body_timeout" in answer
        for sock in (silent, slow_head, slow_body):
            sock.close()
        with httpx.Client(base_url=server.base, timeout=10) as http:
            assert http.get("/v1/queues/q/stats").json()["scheduled"] == 0  # nothing half-put


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_oversized_head_is_refused_as_it_arrives(tmp_path: Path) -> None:
    with serving(tmp_path) as server, server.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        try:
            for _ in range(100):  # up to 1.6 MB of headers, as the review sent
                sock.sendall(b"X-Pad: " + b"a" * 16_000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us: what we want
        answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
        assert server.healthy()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_more_requests_than_the_limit_are_a_503(tmp_path: Path) -> None:
    with serving(tmp_path, "--max-concurrency", "4") as server:
        held = []
        body = b'{"wait": 8}'
        for _ in range(4):
            sock = server.connect()
            sock.sendall(
                b"POST /v1/queues/lp/reserve HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            held.append(sock)
        time.sleep(0.5)
        with httpx.Client(base_url=server.base, timeout=10) as http:
            assert http.get("/healthz").status_code == 503
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with httpx.Client(base_url=server.base, timeout=10) as http:
                if http.get("/healthz").status_code == 200:
                    break
            time.sleep(0.2)
        assert server.healthy()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_secrets_are_read_from_files_and_never_printed(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    secret_file = tmp_path / "secret"
    secret_file.write_text("a-signing-secret-from-a-file\n")
    with serving(
        tmp_path,
        "--token-file", str(token_file),
        "--signing-secret-file", str(secret_file),
        "--forwarded-allow-ips", "127.0.0.1",
    ) as server:  # fmt: skip
        output = "".join(server.lines)
        assert TOKEN not in output
        assert "a-signing-secret-from-a-file" not in output
        with open(f"/proc/{server.process.pid}/cmdline", "rb") as cmdline:
            assert TOKEN.encode() not in cmdline.read()
        with httpx.Client(base_url=server.base, timeout=10) as http:
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert http.get("/v1/queues", headers=bearer).status_code == 200
            assert http.get("/v1/queues").status_code == 401
            # The session is handed to the page's script, never set as a cookie.
            login = http.post("/login", data={"token": TOKEN}, follow_redirects=False)
            assert login.status_code == 200
            assert "set-cookie" not in login.headers


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_startup_lines_hide_passwords(tmp_path: Path) -> None:
    # The URL's password is wrong for this Redis (none is set): the server still
    # starts (the backend connects on use), and its password must not be printed.
    url = "redis://:hunter2-password@127.0.0.1:6379/0?password=hunter3"
    with serving(tmp_path, "--token", "a-token-on-the-command-line", url=url) as server:
        output = "".join(server.lines)
    assert "hunter2" not in output
    assert "hunter3" not in output
    assert "redis://:***@127.0.0.1:6379/0?password=***" in output
    # A token typed on the command line is answered with a warning.
    assert "--token on the command line can be read by other users" in output


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("args", "warned"),
    [(("--allow-callback-host", "api.example.com"), True), ((), False)],
    ids=["callbacks-allowed", "make-run"],
)
def test_a_made_up_signing_secret_is_never_printed(
    tmp_path: Path, args: tuple[str, ...], warned: bool
) -> None:
    """The warning that callbacks are signed with a made-up secret comes only when a
    callback can be sent; `make run` (no callback host allowed) has nothing to sign."""
    with serving(tmp_path, *args, dispatch=True) as server:
        output = "".join(server.lines)
    assert ("made for this run, not shown" in output) is warned, output
    # No 43-character url-safe token (what secrets.token_urlsafe(32) makes) is shown.
    assert not re.search(r"[A-Za-z0-9_-]{43}", output), output
