"""Scenario 5 for SQLite: the wall clock steps back while messages wait.

SQLite's "now" is the wall clock of the process (``time.time``). A process of the
test's own (``_clock_step.py``) replaces its ``time.time`` with the true clock minus a
step taken while messages wait (the system clock is shared by the whole machine, so it
is never touched), puts and consumes, and hands back its history, timed on the true
clock. Nothing comes out early by the true clock: a message put before the step comes
out later by about the step; one put after it, on time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ._clock_step import AFTER, BEFORE
from ._history import Delivery, Op, check

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

STEP = 1.5


def test_a_clock_set_back_makes_sqlite_late_never_early(tmp_path: Path) -> None:
    output = tmp_path / "history.json"
    script = Path(__file__).with_name("_clock_step.py")
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "q.db"), str(STEP), str(output)],
        check=True,
        timeout=45,
    )
    ops = []
    for raw in json.loads(output.read_text()):
        delivered = [Delivery(**d) for d in raw.pop("delivered")]
        ops.append(Op(**raw, delivered=delivered))
    report = check(ops)
    report.assert_ok()  # nothing lost, nothing early by the true clock
    assert report.messages == len(BEFORE) + len(AFTER)
    due = {op.id: op.start + op.delay for op in ops if op.kind == "put"}
    late = {d.id: op.end - due[d.id] for op in ops if op.kind == "reserve" for d in op.delivered}
    # Put before the step: later by about the step. After it: on time.
    assert min(late[id] for id, _ in BEFORE) > STEP - 0.5
    assert max(late[id] for id, _ in AFTER) < STEP - 0.5
