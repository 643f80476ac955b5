"""The soak's two-minute version (issue 41, point 4): ``benchmarks/soak.py`` on the
embedded SQLite queue, a producer, cancels, reschedules and a ``delayq worker`` process
at a steady rate. Every put that was not cancelled runs once, never early, and nothing a
long-running deployment would run out of grows: the processes' descriptors and
sockets, their resident sets, the store's file.

It asserts counts and bounds of growth, not speed: lateness is printed, not held."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


@pytest.mark.timeout(400)
def test_two_minutes_at_a_steady_rate_lose_nothing_and_grow_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "soak.py")]
    command += ["--url", f"sqlite:///{tmp_path / 'soak.db'}", "--minutes", "2"]
    command += ["--sample", "20", "--rate", "100", "--max-delay", "10", "--json", str(out)]
    # A session of its own: whatever happens, its producer and Worker go with it.
    run = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = run.communicate(timeout=360)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 0, output[-4000:]
    result = json.loads(out.read_text())

    counts = result["counts"]
    assert counts["put"] >= 100 * 60  # the producer kept its rate, give or take the load
    assert counts["cancelled"] > 0
    assert counts["rescheduled"] > 0
    assert result["lost"] == 0, result["expected_runs"] - result["ran"]
    assert result["duplicated"] == 0
    assert result["early"] == 0

    samples = result["samples"]
    assert len(samples) == 6
    steady = samples[1:]  # after the first interval's warm-up
    for name in ("producer", "worker"):
        seen = [s["processes"][name] for s in steady]
        assert seen[-1]["fds"] <= seen[0]["fds"] + 2, (name, seen)
        assert seen[-1]["sockets"] <= seen[0]["sockets"] + 1, (name, seen)
        assert seen[-1]["rss"] <= seen[0]["rss"] + 8 * MIB, (name, seen)
    stores = [s["store"] for s in steady]
    assert max(stores) <= 2 * stores[0] + MIB, stores
