"""A backend whose client library is not installed (a venv with only ``delayq[serve]``,
as ``make run`` makes): one line that says which extra to install, on every face.

Each case runs in a subprocess whose imports of the backend's client library fail as
they do when it is not installed: a meta path finder raises ``ModuleNotFoundError`` for
them (nothing is uninstalled).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: backend -> (a URL of it, the modules its extra installs, the extra)
BACKENDS = {
    "redis": ("redis://127.0.0.1:6379/0", ("redis",), "redis"),
    "postgres": (
        "postgresql://postgres@127.0.0.1:5432/test",
        ("psycopg", "psycopg_pool"),
        "postgres",
    ),
    "amqp": ("amqp://guest:guest@127.0.0.1:5672/", ("aiormq", "pamqp", "msgpack"), "amqp"),
    "kafka": ("kafka://127.0.0.1:9092", ("aiokafka", "msgpack"), "kafka"),
}

_WITHOUT = """
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""

_PYTHON = """
from delayq import AsyncQueue, BackendNotInstalled, Queue

for face in (Queue, AsyncQueue):
    try:
        face({url!r}, name="jobs")
    except BackendNotInstalled as exc:
        assert isinstance(exc.__cause__, ModuleNotFoundError), repr(exc.__cause__)
        assert exc.extra == {extra!r}, exc.extra
        print(exc)
    else:
        raise AssertionError("opened")
"""

_CLI = """
from delayq.cli import main

sys.argv = ["delayq", *{args!r}]
main()
"""


def _run(missing: tuple[str, ...], code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    program = _WITHOUT.format(missing=set(missing)) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def _line(url: str, missing: str, extra: str) -> str:
    scheme = url.partition("://")[0]
    return f"{scheme}:// needs {missing}, which is not installed: pip install 'delayq[{extra}]'"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_python_raises_a_delayq_error_that_names_the_extra(backend: str, tmp_path: Path) -> None:
    url, missing, extra = BACKENDS[backend]
    run = _run(missing, _PYTHON.format(url=url, extra=extra), tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [_line(url, missing[0], extra)] * 2


def _cli_cases(tmp_path: Path) -> dict[str, list[str]]:
    (tmp_path / "tasks.py").write_text(
        "from delayq import App\n\napp = App('memory://')\n\n\n"
        "@app.task\ndef noop() -> None:\n    pass\n"
    )
    return {
        "stats": ["stats", "--url"],
        "put": ["put", "jobs", "{}", "--url"],
        "worker": ["worker", "tasks:app", "--url"],
        "serve": ["serve", "--port", "0", "--url"],
    }


@pytest.mark.parametrize("command", ["stats", "put", "worker", "serve"])
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_each_command_says_it_in_one_line(backend: str, command: str, tmp_path: Path) -> None:
    url, missing, extra = BACKENDS[backend]
    args = [*_cli_cases(tmp_path)[command], url]
    run = _run(missing, _CLI.format(args=args), tmp_path)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("warning: a password in --url")]
    assert run.returncode == 1, run.stderr
    assert lines == [f"error: {_line(url, missing[0], extra)}"], run.stderr
    assert run.stdout == ""


def test_delayq_scheduler_says_it_in_one_line(tmp_path: Path) -> None:
    url, missing, extra = BACKENDS["amqp"]
    run = _run(missing, _CLI.format(args=["scheduler", "--url", url]), tmp_path)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1, run.stderr
    assert lines[-1:] == [f"error: {_line(url, missing[0], extra)}"], run.stderr
    assert len(lines) == 2, run.stderr  # and the warning of a password in --url


def test_a_python_without_sqlite3_is_told_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    code = """
    from delayq import BackendNotInstalled, Queue

    try:
        Queue({url!r})
    except BackendNotInstalled as exc:
        assert isinstance(exc.__cause__, ModuleNotFoundError)
        assert exc.extra is None
        print(exc)
    """
    run = _run(("sqlite3",), code.format(url=url), tmp_path)
    assert run.returncode == 0, run.stderr
    assert (
        run.stdout
        == "sqlite:// needs sqlite3, which is not installed: use a Python that has sqlite3\n"
    )
    assert not (tmp_path / "q.db").exists()
