"""``delayq demo`` end to end: a real subprocess, real time, the summary line checked."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

SUMMARY = re.compile(
    r"^fired=(?P<fired>\d+) cancelled=(?P<cancelled>\d+) p50=(?P<p50>[\d.]+)ms "
    r"p99=(?P<p99>[\d.]+)ms max=(?P<max>[\d.]+)ms early=(?P<early>\d+) "
    r"elapsed=(?P<elapsed>[\d.]+)s$",
    re.MULTILINE,
)


def run_demo(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("store", ["heap", "wheel"])
def test_demo_settles_every_order_and_fires_nothing_early(store: str) -> None:
    result, took = run_demo("--orders", "60", "--window", "1", "--seed", "7", "--store", store)
    assert result.returncode == 0, result.stderr
    match = SUMMARY.search(result.stdout)
    assert match, result.stdout
    fired, cancelled = int(match["fired"]), int(match["cancelled"])
    assert fired + cancelled == 60
    assert cancelled > 0
    assert int(match["early"]) == 0
    assert float(match["p50"]) <= float(match["p99"]) <= float(match["max"])
    # one line per firing, each with its lateness
    assert len(re.findall(r"expired: order cancelled\s+late\s+[\d.]+ ms", result.stdout)) == fired
    assert 0.5 <= float(match["elapsed"]) <= 5.0  # about the window; bounds are generous
    assert took < 30.0


def test_demo_rejects_bad_options() -> None:
    result, _ = run_demo("--orders", "0")
    assert result.returncode == 2
    assert "--orders" in result.stderr
    result, _ = run_demo("--store", "list")
    assert result.returncode == 2


def test_help_lists_the_demo() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert "demo" in result.stdout
