"""Run the bank of hand-written mutations of the I/O code (tests/mutations/bank.toml).

For each entry: copy ``src/`` into a temporary directory (the working tree is never
edited), replace the entry's text in its file there, check that ``delayq`` imports from
the copy, run the entry's tests against the copy with a time limit, and report whether
a test failed::

    python scripts/mutants.py                 # every entry, one pytest at a time
    python scripts/mutants.py --only pg-claim-no-skip-locked --only guard-delete
    python scripts/mutants.py --list          # the entries, without running them
    python scripts/mutants.py --check         # only: does each text occur exactly once?

Each entry ends as ``caught`` (a selected test failed), ``SURVIVED`` (they all passed),
``stale`` (its text does not occur exactly once: the code moved, mend the entry),
``timeout``, ``no-tests`` (the selection ran nothing, or only skips), ``error``
(pytest could not run) or, with ``--baseline``, ``baseline-fails`` (the tests fail
without the mutation: flaky, or the selection is wrong). The table goes to stdout and the records to
``benchmarks/results/mutants.json``. The exit status is 0 whatever the outcomes: the
bank reports, it does not gate. Standard library only (Python 3.11: tomllib).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib

ROOT = Path(__file__).resolve().parent.parent
BANK = ROOT / "tests" / "mutations" / "bank.toml"
RESULTS = ROOT / "benchmarks" / "results" / "mutants.json"
# A node id ("FAILED tests/x.py::test[a b] - why"), not a captured "ERROR ..." log line.
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+\.py(?:::.+?)?)(?: - .*)?$", re.MULTILINE)
# pytest's last line, bare under -q ("3 passed, 1 skipped in 2.01s"), else between "="s.
_SUMMARY = re.compile(
    r"^=* ?((?:\d+ \w+|no tests ran)(?:, \d+ \w+)*(?: in [\d.]+s)?.*?) ?=*$", re.MULTILINE
)
_PASSED = re.compile(r"(\d+) passed")


@dataclass(frozen=True)
class Entry:
    """One mutation: where, what it replaces, the bug it models and what should catch it."""

    id: str
    file: str
    find: str
    replace: str
    models: str
    tests: list[str]
    k: str = ""
    timeout: float = 0.0


@dataclass
class Outcome:
    """What running one entry gave."""

    id: str
    models: str
    status: str
    seconds: float
    first_failure: str = ""
    summary: str = ""
    detail: list[str] = field(default_factory=list)


def load(path: Path) -> list[Entry]:
    """The bank's entries, in file order; a malformed entry or a repeated id stops here."""
    if sys.version_info < (3, 11):
        raise SystemExit("the mutation bank needs Python 3.11 or later (tomllib)")
    data = tomllib.loads(path.read_text())
    entries: list[Entry] = []
    seen: set[str] = set()
    for raw in data.get("mutant", []):
        try:
            entry = Entry(**raw)
        except TypeError as exc:
            raise SystemExit(f"{path}: entry {raw.get('id', '?')!r}: {exc}") from exc
        if entry.id in seen:
            raise SystemExit(f"{path}: id {entry.id!r} appears twice")
        if not entry.tests or entry.find == entry.replace:
            raise SystemExit(f"{path}: entry {entry.id!r} needs tests and a change")
        seen.add(entry.id)
        entries.append(entry)
    return entries


def _copy_sources(dest: Path) -> Path:
    src = dest / "src"
    shutil.copytree(
        ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    )
    return src


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT / "tests")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def imported_from(src: Path) -> str:
    """Where ``delayq`` is imported from with ``PYTHONPATH`` set to ``src`` (must be inside)."""
    out = subprocess.run(
        [sys.executable, "-c", "import delayq; print(delayq.__file__)"],
        env=_env(src),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return out.stdout.strip() or out.stderr.strip()


def _run(cmd: list[str], env: dict[str, str], limit: float) -> tuple[int | None, str]:
    # A session of its own, so a timeout kills pytest with the servers and workers it spawned.
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def staleness(entry: Entry, src: Path) -> str | None:
    """Why ``entry`` cannot be applied to the sources under ``src`` (None: it can)."""
    target = src / entry.file.removeprefix("src/")
    if not target.is_file():
        return f"no file {entry.file}"
    count = target.read_text().count(entry.find)
    return None if count == 1 else f"the text occurs {count} times in {entry.file}"


def run_entry(
    entry: Entry, default_timeout: float, pytest_args: list[str], *, baseline: bool = False
) -> Outcome:
    """Apply ``entry`` to a copy of ``src/``, run its tests, and say what happened;
    with ``baseline``, run them on the unchanged copy first (they must pass there)."""
    start = time.monotonic()
    limit = entry.timeout or default_timeout

    def done(status: str, **kw: Any) -> Outcome:
        return Outcome(entry.id, entry.models, status, round(time.monotonic() - start, 1), **kw)

    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly"]
    cmd += ["-p", "no:cacheprovider", "-rfE", *pytest_args, *entry.tests]
    if entry.k:
        cmd += ["-k", entry.k]
    with tempfile.TemporaryDirectory(prefix=f"mutant-{entry.id}-") as tmp:
        src = _copy_sources(Path(tmp))
        stale = staleness(entry, src)
        if stale is not None:
            return done("stale", detail=[stale])
        if baseline:
            code, out = _run(cmd, _env(src), limit)
            if code != 0:
                first, summary, tail = _read(out)
                return done("baseline-fails", first_failure=first, summary=summary, detail=tail)
        target = src / entry.file.removeprefix("src/")
        text = target.read_text()
        target.write_text(text.replace(entry.find, entry.replace))
        where = imported_from(src)
        if not where.startswith(str(src)):
            return done("error", detail=[f"delayq imported from {where}, not the copy"])
        code, out = _run(cmd, _env(src), limit)
    first, summary, tail = _read(out)
    if code is None:
        return done("timeout", summary=summary, detail=tail)
    if code == 1:
        return done("caught", first_failure=first, summary=summary)
    if code == 0:
        passed = _PASSED.search(summary)
        if passed is None or passed.group(1) == "0":
            return done("no-tests", summary=summary)
        return done("SURVIVED", summary=summary)
    if code == 5:
        return done("no-tests", summary=summary, detail=tail)
    return done("error", first_failure=first, summary=summary, detail=tail)


def _read(out: str) -> tuple[str, str, list[str]]:
    """The first failing test, the summary line and the last lines of pytest's output."""
    summaries = _SUMMARY.findall(out)
    failures = _FAILED.findall(out)
    tail = out.strip().splitlines()[-15:]
    return (failures[0] if failures else "", summaries[-1] if summaries else "", tail)


def table(outcomes: list[Outcome]) -> str:
    """The outcomes as a fixed-width table, one line per entry, then the counts."""
    rows = [("id", "status", "s", "first failing test / note", "models")]
    for o in outcomes:
        note = o.first_failure or (o.detail[0] if o.status == "stale" else o.summary)
        rows.append((o.id, o.status, f"{o.seconds:.0f}", note, o.models))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:4])) + "  " + r[4] for r in rows
    ]
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    lines.append(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bank", type=Path, default=BANK)
    parser.add_argument("--only", action="append", default=[], metavar="ID")
    parser.add_argument("--list", action="store_true", help="print the entries and stop")
    parser.add_argument("--check", action="store_true", help="report stale entries and stop")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per entry")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="run each entry's tests on unchanged sources first (twice the time)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    entries = load(args.bank)
    if args.only:
        unknown = set(args.only) - {e.id for e in entries}
        if unknown:
            parser.error(f"no entry {', '.join(sorted(unknown))} in {args.bank}")
        entries = [e for e in entries if e.id in args.only]
    if args.list:
        for e in entries:
            print(f"{e.id}  {e.file}  {e.models}")
        return 0
    if args.check:
        for e in entries:
            print(f"{e.id}: {staleness(e, ROOT / 'src') or 'ok'}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutant-check-") as tmp:
        src = _copy_sources(Path(tmp))
        where = imported_from(src)
        print(f"delayq imports from {where}", flush=True)
        if not where.startswith(str(src)):
            print("the copy of src/ is not the one imported: PYTHONPATH is ignored", flush=True)
            return 0
    outcomes: list[Outcome] = []
    for entry in entries:
        outcome = run_entry(entry, args.timeout, args.pytest_args, baseline=args.baseline)
        outcomes.append(outcome)
        print(
            f"{outcome.id}: {outcome.status} in {outcome.seconds:.0f} s"
            f" {outcome.first_failure or outcome.summary}",
            flush=True,
        )
    print()
    print(table(outcomes))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
