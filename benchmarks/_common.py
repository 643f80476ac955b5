"""Helpers shared by delayq's benchmarks: timing, results, the rich table and JSON.

A benchmark records :class:`Measure` rows (a value, its unit, the target it is
held to and whether it met it) and hands them to :func:`print_table` and
:func:`write_json`. Benchmarks never assert: a missed target is reported, not
raised.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.table import Table

__all__ = [
    "RESULTS_DIR",
    "Measure",
    "bench_urls",
    "best_of",
    "console",
    "environment",
    "fresh_heap",
    "gc_frozen",
    "gc_paused",
    "load_average",
    "parse_sections",
    "percentile",
    "print_table",
    "result_path",
    "shown",
    "spawn_ready",
    "write_json",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# Wide enough for one line per row even when the output is piped to a log.
console = Console(width=max(Console().width, 140))


@dataclass
class Measure:
    """One row of a benchmark's report.

    ``passed`` is None for rows that only inform (no target); ``extra`` carries raw
    numbers that go to the JSON but not to the table.
    """

    section: str
    name: str
    value: float
    unit: str
    target: str = ""
    passed: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: The process's CPU time per item, in microseconds (the "CPU/job" column; None:
    #: not measured): unlike a rate, it hardly depends on what else the machine runs.
    cpu_per_job: float | None = None

    def shown_value(self) -> str:
        """The value as the table shows it."""
        value = self.value
        if self.unit == "x":
            return f"{value:.2f}x"
        if self.unit in {"items/s", "timers/s"}:
            return f"{value:,.0f} {self.unit}"
        if self.unit == "count":
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:,.0f} {self.unit}"
        if abs(value) >= 10:
            return f"{value:.1f} {self.unit}"
        return f"{value:.3f} {self.unit}"


def fresh_heap() -> None:
    """Collect garbage (all generations) so one section's leftovers do not tax the next."""
    gc.collect()
    gc.collect()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Switch the collector off for untimed set-up (filling a queue with a million
    items would otherwise rescan them over and over); on again afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def gc_frozen() -> Iterator[None]:
    """Move every object alive now out of the collector's sight (:func:`gc.freeze`),
    so a big pre-filled structure is not rescanned by each collection of a timed run
    or by :func:`fresh_heap` between runs; thawed afterwards."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def best_of(repeat: int, run: Callable[[], float]) -> tuple[float, list[float]]:
    """Call ``run`` (which returns a duration) ``repeat`` times; return the best and all.

    Garbage is collected before each run; the collector stays enabled during the run,
    as it would be in an application.
    """
    times: list[float] = []
    for _ in range(repeat):
        fresh_heap()
        times.append(run())
    return min(times), times


def parse_sections(text: str | None, known: Iterable[str]) -> list[str]:
    """``"a,c,h"`` -> ``["a", "c", "h"]`` (all of ``known`` when ``text`` is None)."""
    names = list(known)
    if text is None:
        return names
    chosen = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [part for part in chosen if part not in names]
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}; choose from {','.join(names)}")
    return [name for name in names if name in chosen]


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of the sorted ``ordered``: the value at rank
    ``q * n`` (the last for ``q`` = 1); NaN when there is none."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def bench_urls(chosen: str | None, name: str) -> Iterator[list[str]]:
    """The URLs to measure: ``chosen``, or sqlite (temporary file) and redis
    (``$DELAYQ_BENCH_REDIS``, default ``redis://127.0.0.1:6379/0``, unique prefix
    ``delayq-bench-<name>-...``, keys deleted afterwards; skipped with a note when Redis
    is down)."""
    if chosen is not None:
        yield [chosen]
        return
    with tempfile.TemporaryDirectory(prefix=f"delayq-bench-{name}-") as tmp:
        urls = [f"sqlite:///{Path(tmp) / f'{name}.db'}"]
        base = os.environ.get("DELAYQ_BENCH_REDIS", "redis://127.0.0.1:6379/0")
        prefix = f"delayq-bench-{name}-{uuid.uuid4().hex[:8]}"
        client = None
        try:
            import redis  # noqa: PLC0415

            client = redis.Redis.from_url(base, socket_connect_timeout=2)
            client.ping()
            urls.append(f"{base}{'&' if '?' in base else '?'}prefix={prefix}")
        except Exception as exc:
            console.print(f"redis skipped: {exc}", style="yellow")
        try:
            yield urls
        finally:
            if client is not None:
                keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
                if keys:
                    client.delete(*keys)
                client.close()


def spawn_ready(command: list[str], count: int, *, stdin: bool = False) -> list[Any]:
    """``count`` processes of ``command`` (text pipes: stdout, and stdin when asked),
    returned once each has printed ``ready``; all killed when one does not."""
    children = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit(f"a process of {command[1:2]} did not start")
    except BaseException:
        for child in children:
            child.kill()
            child.wait(10)
        raise
    return children


def shown(url: str) -> str:
    """``url`` without a temporary path, for the table and the JSON."""
    return "sqlite (tmp file)" if url.startswith("sqlite:") else url


def result_path(name: str, url: str | None, quick: bool) -> Path:
    """``RESULTS_DIR/<name>[-<url's scheme>][-quick].json``."""
    scheme = f"-{urlsplit(url).scheme.lower()}" if url else ""
    return RESULTS_DIR / f"{name}{scheme}{'-quick' if quick else ''}.json"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def environment() -> dict[str, Any]:
    """Where the numbers come from: Python, platform, CPUs, commit, time."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "commit": _git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg": load_average(),
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def print_table(title: str, measures: list[Measure]) -> None:
    """Print the measures as one rich table, a row per measure."""
    table = Table(title=title, title_justify="left", show_lines=False, header_style="bold")
    table.add_column("§", justify="center")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target")
    table.add_column("result", justify="center")
    cpu = any(m.cpu_per_job is not None for m in measures)
    if cpu:
        table.add_column("CPU/job", justify="right")
    table.add_column("note", style="dim")
    previous = None
    for m in measures:
        if previous is not None and m.section != previous:
            table.add_section()
        previous = m.section
        if m.passed is None:
            verdict = "[dim]info[/dim]"
        elif m.passed:
            verdict = "[bold green]PASS[/bold green]"
        else:
            verdict = "[bold red]MISS[/bold red]"
        cells = [m.section, m.name, m.shown_value(), m.target, verdict]
        if cpu:
            cells.append("" if m.cpu_per_job is None else f"{m.cpu_per_job:.1f} us")
        table.add_row(*cells, m.note)
    console.print(table)
    judged = [m for m in measures if m.passed is not None]
    passed = sum(1 for m in judged if m.passed)
    console.print(f"targets met: {passed}/{len(judged)}")


def write_json(path: Path, payload: dict[str, Any], measures: list[Measure]) -> None:
    """Write ``payload`` plus every measure (extras included) as indented JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = dict(payload)
    document["measures"] = [asdict(m) for m in measures]
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    console.print(f"wrote {path}")
