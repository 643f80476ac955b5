"""What the drivers that run delayq and its peers share (``run.py``,
``procrastinate_bench.py``, ``celery_vs.py``): the peer's venv, made from its
pinned requirements (again when they change), delayq's figures read from durable.py's
JSON, and the one table both print.

Runs in delayq's own environment; imports nothing of delayq's.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import venv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = ROOT / "benchmarks" / "results"

#: A row of the table: its label and the path of keys to its value in a report.
Row = tuple[str, tuple[str, ...]]
#: The lateness rows of the table.
LATENESS_ROWS: list[Row] = [
    ("lateness p50 (ms)", ("lateness", "p50_ms")),
    ("lateness p99 (ms)", ("lateness", "p99_ms")),
    ("lateness max (ms)", ("lateness", "max_ms")),
    ("lost / duplicates / early", ("lateness",)),
]
#: durable.py's lateness section whose figures stand for delayq's.
LATENESS_TAG = "lateness, consumer in another process"


def ensure_venv(directory: Path, requirements: Path, reinstall: bool = False) -> Path:
    """The python of ``directory``, a venv made from ``requirements`` (made anew when
    it is missing, the file changed since, or ``reinstall``)."""
    python = directory / "bin" / "python"
    stamp = directory / ".requirements.sha256"
    wanted = hashlib.sha256(requirements.read_bytes()).hexdigest()
    fresh = python.exists() and stamp.exists() and stamp.read_text().strip() == wanted
    if fresh and not reinstall:
        return python
    print(f"making {directory} from {requirements.name} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(directory)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", "-r", str(requirements)], check=True)
    stamp.write_text(wanted + "\n")
    return python


def with_params(url: str, **params: str) -> str:
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def run_durable(url: str, quick: bool, path: Path) -> dict[str, float]:
    """Run ``benchmarks/durable.py`` on ``url`` (its JSON to ``path``): each measure's
    value by name."""
    command = [sys.executable, str(ROOT / "benchmarks" / "durable.py"), "--json", str(path)]
    command += ["--url", url, *(["--quick"] if quick else [])]
    subprocess.run(command, check=True)
    return {m["name"]: m["value"] for m in json.loads(path.read_text())["measures"]}


def delayq_lateness(by_name: dict[str, float]) -> dict[str, float | None]:
    """delayq's lateness figures in the peers' report shape."""
    return {
        key: by_name.get(f"{LATENESS_TAG}: {name}")
        for key, name in (
            ("p50_ms", "p50"),
            ("p99_ms", "p99"),
            ("max_ms", "max"),
            ("lost", "lost"),
            ("duplicates", "duplicates"),
            ("early", "early"),
        )
    }


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a process started in a session of its own; SIGKILL to its group
    after 15 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def shown(report: dict[str, Any], path: tuple[str, ...]) -> str:
    value: Any = report
    for key in path:
        value = (value or {}).get(key)
    if path == ("lateness",):
        late = value or {}
        return f"{late.get('lost')} / {late.get('duplicates')} / {late.get('early')}"
    if value is None or value != value:  # absent, or NaN
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def print_table(reports: Sequence[dict[str, Any]], rows: Sequence[Row]) -> None:
    """One markdown table: a row per measure, a column per report (its ``peer``)."""
    print(f"\n| measure | {' | '.join(r['peer'] for r in reports)} |")
    print(f"|---|{'---|' * len(reports)}")
    for label, path in rows:
        print(f"| {label} | {' | '.join(shown(r, path) for r in reports)} |")
