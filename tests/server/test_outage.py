"""A backend that cannot be reached: at start (``delayq serve`` and ``delayq worker``
refuse in one line), and lost after the start (the consumers back off in a few log
lines, ``/metrics`` answers with ``delayq_backend_up 0``, ``/healthz`` is a 503).

Real processes and a private ``redis-server`` that each test starts and kills.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends._redis_server import RedisProcess, free_port
from delayq._cli_common import CliError, check_backend

from .test_serve_command import _environ


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
    """The one line of a start refused for its backend (nothing else printed)."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: cannot use the queue at {shown_url}: "), lines[0]
    return lines[0]


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path, ("--save", ""))
    server.start()  # it pings without a password: the password comes after
    client = server.client()
    client.config_set("requirepass", "hunter2")
    client.close()
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
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    result = _serve(url, tmp_path)
    line = _refused(result, url.replace("hunter2", "***"))
    assert "refused" in line.lower()
    assert "hunter2" not in result.stderr


def test_serve_with_a_wrong_redis_password_is_one_line(
    tmp_path: Path, redis_with_password: RedisProcess
) -> None:
    url = f"redis://:wrong@127.0.0.1:{redis_with_password.port}/0"
    result = _serve(url, tmp_path)
    _refused(result, f"redis://:***@127.0.0.1:{redis_with_password.port}/0")
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
