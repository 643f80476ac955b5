"""The pytest plugin as a project opts into it: ``pytest_plugins = ["delayq.testing"]``
in its conftest.py, in a pytest of its own; nothing loads it by itself, and
delayq.testing imports without pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

APP = """
import os
from delayq import App

app = App(os.environ.get("DELAYQ_URL", "sqlite:///never.db"))
done = []

@app.task
def remind(user: str) -> None:
    done.append(user)
"""

TESTS = """
from delayq.testing import Harness
import remind_app

def test_remind_after_a_day(delayq_harness, delayq_clock):
    harness = delayq_harness(remind_app.app)
    assert isinstance(harness, Harness)
    assert harness.clock is delayq_clock
    remind_app.remind.send("ann", delay="1d")
    harness.advance("23h")
    assert remind_app.done == []
    harness.advance("1h")
    assert remind_app.done == ["ann"]

def test_the_app_is_back_on_its_own_backend():
    assert remind_app.app.url == "sqlite:///never.db"
"""


def test_a_project_opts_in_through_its_conftest(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["delayq.testing"]\n')
    (tmp_path / "remind_app.py").write_text(APP)
    (tmp_path / "test_remind.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k != "DELAYQ_URL"}
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the project's opt-in alone (and a quick start)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
    assert not (tmp_path / "never.db").exists()  # no test touched the app's own backend


def test_no_entry_point_loads_the_plugin_by_itself() -> None:
    assert [ep for ep in entry_points(group="pytest11") if ep.value.startswith("delayq")] == []


def test_delayq_testing_imports_without_pytest() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["pytest"] = None  # import pytest fails, as where it is not installed
        import delayq.testing
        assert delayq.testing.__all__ == ["Harness", "JobRun"]
        assert not hasattr(delayq.testing, "delayq_harness")
        from delayq import App
        app = App("sqlite:///never.db")
        ran = []
        app.task(lambda: ran.append(1), name="job")
        with delayq.testing.Harness(app) as harness:
            app.tasks["job"].send(delay=5)
            harness.advance(5)
        assert ran == [1]
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
