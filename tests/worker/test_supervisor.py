"""Supervisor's checks and a stop before run; its processes, signals and restarts are
tested in real processes: tests/e2e/test_worker_supervisor.py."""

from __future__ import annotations

import pytest

from delayq.runtime import Supervisor, Worker


def make_worker() -> Worker:
    raise AssertionError("never called: no child starts")


@pytest.mark.parametrize("processes", [0, -1, 1.5, "2", True, None])
def test_processes_must_be_an_int_of_at_least_one(processes: object) -> None:
    with pytest.raises(ValueError, match=r"processes must be an int >= 1, got "):
        Supervisor(make_worker, processes=processes)  # type: ignore[arg-type]


def test_make_worker_must_be_callable() -> None:
    with pytest.raises(TypeError, match="make_worker must be a function that returns a Worker"):
        Supervisor(42, processes=2)  # type: ignore[arg-type]


def test_a_stop_before_run_starts_no_child_and_returns_0() -> None:
    supervisor = Supervisor(make_worker, processes=3)
    supervisor.stop()
    assert supervisor.run() == 0
    assert repr(supervisor) == "<Supervisor processes=3 running=0>"
