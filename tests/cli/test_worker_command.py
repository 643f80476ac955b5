"""``delayq worker MODULE:APP``: finding the app, and refusing what cannot run.

Running a worker to its end (signals, exit status) is tested in a real process:
tests/e2e/test_cli_worker.py.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq import App
from delayq.cli._worker import load_app

from ._helpers import Cli, one_error_line

APP = """
from delayq import App

app = App({url!r})
empty = App({url!r})
not_an_app = 42


class holder:
    app = app


@app.task(queue="jobs")
def work(n):
    return n
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> Iterator[str]:
    """A directory with an app module of a unique name, as the current directory;
    sys.path and sys.modules are restored afterwards."""
    name = f"cliapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP.format(url=url)))
    (tmp_path / f"{name}_broken.py").write_text("import json\n\nvalue = 1 / 0\n")
    (tmp_path / f"{name}_needs.py").write_text("import not_installed_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    for module in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[module]


def test_load_app_finds_an_app_in_the_current_directory(project: str) -> None:
    app = load_app(f"{project}:app")
    assert isinstance(app, App)
    assert app.queue_names == ["jobs"]
    assert load_app(f"{project}:holder.app") is app


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("{p}", "must be module:attribute"),
        (":app", "must be module:attribute"),
        ("{p}:", "must be module:attribute"),
        ("no_such_module_xyz:app", "no module named 'no_such_module_xyz'"),
        ("{p}.sub:app", "no module named"),
        ("{p}:missing", "has no attribute 'missing'"),
        ("{p}:holder.missing", "has no attribute 'holder.missing'"),
        ("{p}:not_an_app", "is a int, not a delayq App"),
        ("{p}:work", "is a Task, not a delayq App"),
        ("{p}:empty", "the app has no tasks"),
    ],
)
def test_a_bad_app_is_a_usage_error(cli: Cli, project: str, spec: str, expected: str) -> None:
    result = cli("worker", spec.format(p=project))
    assert result.exit_code == 2, result.output
    assert expected in one_error_line(result)


def test_a_module_that_raises_is_one_line_with_its_place(cli: Cli, project: str) -> None:
    result = cli("worker", f"{project}_broken:app")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "ZeroDivisionError: division by zero" in line
    assert f"({project}_broken.py:3)" in line


def test_a_missing_dependency_of_the_module_is_not_a_bad_path(cli: Cli, project: str) -> None:
    result = cli("worker", f"{project}_needs:app")
    assert result.exit_code == 1
    assert "No module named 'not_installed_dependency_xyz'" in one_error_line(result)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--queues", "jobs,other"], "no task of the app uses the queues ['other']"),
        (["--queues", ","], "--queues"),
        (["--concurrency", "0"], "--concurrency"),
        (["--lease", "0"], "--lease"),
        (["--lease", "soon"], "unknown duration"),
        (["--grace", "-1"], "--grace"),
        (["--processes", "0"], "Invalid value for '--processes': 0 is not in the range x>=1"),
        (["--processes", "two"], "Invalid value for '--processes': 'two' is not a valid integer"),
        (["--processes", "1.5"], "Invalid value for '--processes'"),
        (["--prefetch", "-1"], "Invalid value for '--prefetch': -1 is not in the range x>=0"),
        (["--processes", "2", "--lease", "0"], "--lease"),
        (["--processes", "2", "--queues", "other"], "no task of the app uses the queues"),
    ],
)
def test_bad_worker_options_are_usage_errors(
    cli: Cli, project: str, args: list[str], expected: str
) -> None:
    result = cli("worker", f"{project}:app", *args)
    assert result.exit_code == 2, result.output
    assert expected in one_error_line(result)


@pytest.mark.parametrize("processes", ["1", "3"])
def test_an_unreachable_store_fails_fast(
    cli: Cli, project: str, tmp_path: Path, processes: str
) -> None:
    """With --processes N the supervisor checks before it starts anyone: the same
    line, once, and no child."""
    url = f"sqlite:///{tmp_path / 'missing' / 'dir' / 'q.db'}"
    result = cli("worker", f"{project}:app", "--url", url, "--processes", processes, url=False)
    assert result.exit_code == 1
    assert f"cannot use the queue at {url}" in one_error_line(result)


def test_a_bad_app_under_processes_is_the_same_one_line(cli: Cli, project: str) -> None:
    result = cli("worker", f"{project}_broken:app", "--processes", "2")
    assert result.exit_code == 1
    assert "ZeroDivisionError: division by zero" in one_error_line(result)
