"""A backend that cannot be reached: at start (``delayq serve`` and ``delayq worker``
refuse in one line), and lost after the start (the consumers back off in a few log
lines, ``/metrics`` answers with ``delayq_backend_up 0``, ``/healthz`` is a 503).

Real processes and a private ``redis-server`` that each test starts and kills.
"""

from __future__ import annotations

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

from backends._redis_server import RedisProcess, free_port
from delayq.cli._common import CliError, check_backend

from .conftest import MakeClient
from .test_serve_command import ADDRESS, _environ


def _delayq(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=_environ(),
    )


def _serve(url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _delayq(cwd, "serve", "--url", url, "--port", "0")


def _refused(result: subprocess.CompletedProcess[str], shown_url: str) -> str:
    """The one line of a start refused for its backend (nothing else printed but the
    warning of a password in --url)."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    if "***" in shown_url:
        assert lines.pop(0).startswith("warning: a password in --url"), result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot use the queue at {shown_url}: "), lines[0]
    return lines[0]


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path, ACL)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- at start ------------------------------------------------------------------------


def test_serve_on_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    line = _refused(_serve("sqlite:///nodir/x.db", tmp_path), "sqlite:///nodir/x.db")
    assert f"the directory {tmp_path / 'nodir'} of its database does not exist" in line
    assert not (tmp_path / "nodir").exists()


def test_serve_on_a_file_that_is_no_database_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.db").write_text("not a database, just notes\n" * 100)
    url = f"sqlite:///{tmp_path}/notes.db"
    assert "file is not a database" in _refused(_serve(url, tmp_path), url)


def test_serve_on_a_redis_that_is_down_is_one_line(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    result = _serve(url, tmp_path)
    line = _refused(result, url.replace("hunter2", "***"))
    assert line.endswith(f": the server is not answering at 127.0.0.1:{port}")
    assert "hunter2" not in result.stderr


def test_serve_with_a_wrong_redis_password_is_one_line(
    tmp_path: Path, redis_with_password: RedisProcess
) -> None:
    url = f"redis://app:wrong@127.0.0.1:{redis_with_password.port}/0"
    result = _serve(url, tmp_path)
    _refused(result, f"redis://app:***@127.0.0.1:{redis_with_password.port}/0")
    assert "wrong" not in result.stderr


def test_serve_on_an_unknown_host_is_one_line(tmp_path: Path) -> None:
    url = "redis://no-such-host.invalid:6379/0"
    _refused(_serve(url, tmp_path), url)


def test_a_backend_that_never_answers_is_refused_after_the_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as mute:  # accepts, never answers
        url = f"redis://127.0.0.1:{mute.getsockname()[1]}/0"
        with pytest.raises(CliError, match=r"did not answer within 0\.5s"):
            check_backend(url, "q", 0.5)


def test_worker_on_a_redis_that_is_down_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(
        "from delayq import App\napp = App()\n\n@app.task(queue='jobs')\ndef work(n):\n    pass\n"
    )
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    result = _delayq(tmp_path, "worker", "tasks:app", "--url", url)
    _refused(result, url.replace("hunter2", "***"))


# -- after the start -----------------------------------------------------------------

#: A private Redis with a user of its own, so that URLs carry a password to hide (and
#: the default user stays open for the helper's ping).
ACL = ("--save", "", "--user", "app", "on", ">hunter2", "~*", "&*", "+@all")
UNAVAILABLE = re.compile(
    r"dispatch\.backend_unavailable url=redis://app:\*\*\*@127\.0\.0\.1:\d+/0 "
    r'error=ConnectionError detail=".+" retry_in=(\S+)$'
)
BACK = re.compile(
    r"dispatch\.backend_back url=redis://app:\*\*\*@127\.0\.0\.1:\d+/0 after=\d+\.\ds$"
)


class Served:
    """``delayq serve`` in a process of its own, its output read as it comes."""

    def __init__(self, url: str, cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "serve", "--url", url, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=_environ(),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        line = self.wait_for(ADDRESS)
        match = ADDRESS.search(line)
        assert match is not None
        self.base = match.group(1)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def matching(self, pattern: re.Pattern[str]) -> list[re.Match[str]]:
        return [m for m in map(pattern.search, list(self.lines)) if m is not None]

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if pattern.search(line):
                    return line
            assert self.process.poll() is None, "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"no line matches {pattern.pattern}:\n" + "\n".join(self.lines))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(20)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)


def _gauge(http: httpx.Client) -> str:
    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    lines = answer.text.splitlines()
    up = [line for line in lines if line.startswith("delayq_backend_up ")]
    assert len(up) == 1, answer.text
    if up == ["delayq_backend_up 0.0"]:
        assert not any(line.startswith("delayq_messages{") for line in lines), answer.text
    return up[0].split()[1]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_serve_rides_out_a_redis_restart(tmp_path: Path) -> None:
    """Redis killed under a running server: /healthz is a 503 naming no address,
    /metrics answers with delayq_backend_up 0 and no message gauges, the dispatcher
    logs a few lines with a doubling pause and the password hidden, and one line when
    Redis is back, after which both answer again."""
    redis = RedisProcess(tmp_path, ACL)
    redis.start()
    url = f"redis://app:hunter2@127.0.0.1:{redis.port}/0"
    served = Served(url, tmp_path)
    try:
        with httpx.Client(base_url=served.base, timeout=15) as http:
            assert _gauge(http) == "1.0"
            redis.kill()
            health = http.get("/healthz")
            assert health.status_code == 503
            assert health.json()["error"]["code"] == "backend_unavailable"
            assert "127.0.0.1" not in health.text
            assert str(redis.port) not in health.text
            assert _gauge(http) == "0.0"

            served.wait_for(UNAVAILABLE)  # once the dispatcher's waiting reserve gives up
            time.sleep(2.5)
            steps = [m.group(1) for m in served.matching(UNAVAILABLE)]
            assert 2 <= len(steps) <= 4, steps  # a try twice a second would be 5 lines
            assert steps == ["0.5s", "1s", "2s", "4s"][: len(steps)]

            redis.start()
            served.wait_for(BACK)
            assert len(served.matching(BACK)) == 1
            assert _gauge(http) == "1.0"
            assert http.get("/healthz").json() == {"status": "ok"}
            # One outage, however many calls saw it (the Worker's metric too).
            assert "\ndelayq_backend_outages_total 1.0\n" in http.get("/metrics").text
    finally:
        code = served.stop()
        redis.stop()
    output = "\n".join(served.lines)
    assert code == 0, output
    assert "hunter2" not in output
    assert "reserve_failed" not in output
    # The backend's own reconnects say it once each (the listener, a waiting reserve).
    assert len(re.findall(r"lost (its connection|Redis)", output)) <= 2, output


def test_metrics_answer_while_the_backend_is_down(make_client: MakeClient) -> None:
    client = make_client(f"redis://127.0.0.1:{free_port()}/0")
    assert _gauge(client) == "0.0"  # a 200 for the scrape, without the message gauges
    assert client.get("/healthz").status_code == 503
    assert "\ndelayq_backend_outages_total 1.0\n" in client.get("/metrics").text
