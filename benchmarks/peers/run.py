"""Compare delayq's peers on Redis in one command: ``python3 benchmarks/peers/run.py``.

It makes ``benchmarks/peers/.venv`` from ``requirements.txt`` (pinned arq and rq;
again whenever that file changes), re-runs itself inside it, runs ``arq_bench.py``
and ``rq_bench.py`` one after the other (each with its own empty Redis database,
flushed afterwards, and its worker stopped even on failure or timeout), prints one
table and writes ``benchmarks/results/peers.json``. When
``benchmarks/results/durable-redis.json`` exists (``benchmarks/durable.py --url
redis://...``), delayq's matching numbers are shown beside the peers'.

Options: ``--quick`` (smaller sizes), ``--peers arq,rq``, ``--redis URL`` (a server
without a database number), ``--arq-db N``/``--rq-db N``, ``--timeout SECONDS`` per
peer, ``--json PATH``, ``--reinstall``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
VENV = HERE / ".venv"
REQUIREMENTS = HERE / "requirements.txt"
STAMP = VENV / ".requirements.sha256"
LOCAL_RESULTS = HERE / "results"
DEFAULT_JSON = BENCHMARKS / "results" / "peers.json"
DELAYQ_JSON = BENCHMARKS / "results" / "durable-redis.json"
PEERS = ("arq", "rq")
DEFAULT_DBS = {"arq": 12, "rq": 13}


# -- the venv ----------------------------------------------------------------------------


def venv_python() -> Path:
    """The interpreter of ``benchmarks/peers/.venv``."""
    return VENV / "bin" / "python"


def ensure_venv(reinstall: bool) -> None:
    """Create the venv and install the pinned requirements, unless it already holds
    exactly this ``requirements.txt``."""
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    fresh = venv_python().exists() and STAMP.exists() and STAMP.read_text().strip() == wanted
    if fresh and not reinstall:
        return
    print(f"making {VENV} from {REQUIREMENTS.name} ...", file=sys.stderr)
    venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    pip = [str(venv_python()), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "install", "-r", str(REQUIREMENTS)], check=True)
    STAMP.write_text(wanted + "\n")


def inside_venv() -> bool:
    """Whether this interpreter is the peers' venv."""
    return Path(sys.prefix).resolve() == VENV.resolve()


# -- running the peers --------------------------------------------------------------------


def run_peer(peer: str, url: str, quick: bool, timeout: float) -> dict[str, Any] | None:
    """Run ``<peer>_bench.py`` in a subprocess; its report, or None if it failed.
    On timeout it gets SIGTERM (it then stops its worker and flushes its database),
    and SIGKILL 30 s later."""
    out = LOCAL_RESULTS / f"{peer}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(HERE / f"{peer}_bench.py"), "--url", url, "--json", str(out)]
    if quick:
        command.append("--quick")
    print(f"== {peer} on {url}", file=sys.stderr)
    started = time.monotonic()
    child = subprocess.Popen(command, cwd=HERE)
    try:
        code = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{peer}: over {timeout:.0f} s, stopping it", file=sys.stderr)
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        return None
    finally:
        if child.poll() is None:  # interrupted (Ctrl-C): let it clean up first
            child.terminate()
            child.wait(timeout=30)
    print(f"{peer}: {time.monotonic() - started:.0f} s, exit {code}", file=sys.stderr)
    if code != 0 or not out.exists():
        return None
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def delayq_reference() -> dict[str, Any] | None:
    """delayq's matching numbers from ``durable-redis.json``, in the peers' shape."""
    if not DELAYQ_JSON.exists():
        return None
    document = json.loads(DELAYQ_JSON.read_text())
    by_name = {m["name"]: m["value"] for m in document.get("measures", [])}
    tag = "lateness, consumer in another process"
    return {
        "peer": "delayq",
        "version": (document.get("environment") or {}).get("commit") or "",
        "enqueue_per_second": by_name.get("put one by one"),
        "drain": {"jobs_per_second": by_name.get("drain: reserve(max=100) + ack")},
        "lateness": {
            "p50_ms": by_name.get(f"{tag}: p50"),
            "p99_ms": by_name.get(f"{tag}: p99"),
            "max_ms": by_name.get(f"{tag}: max"),
            "lost": by_name.get(f"{tag}: lost"),
            "duplicates": by_name.get(f"{tag}: duplicates"),
            "early": by_name.get(f"{tag}: early"),
            "worker_cpu_percent": by_name.get(f"{tag}: consumer CPU"),
        },
        "source": str(DELAYQ_JSON),
        "started": (document.get("environment") or {}).get("started"),
    }


# -- the table ------------------------------------------------------------------------------

#: (label, path into a report, unit) per row; a ``None`` path starts a new section.
ROWS: list[tuple[str, tuple[str, ...] | None, str]] = [
    ("enqueue one by one", ("enqueue_per_second",), "/s"),
    ("drain: 1 worker process, no-op job", ("drain", "jobs_per_second"), "/s"),
    ("", None, ""),
    ("lateness {late}: p50", ("lateness", "p50_ms"), "ms"),
    ("lateness {late}: p99", ("lateness", "p99_ms"), "ms"),
    ("lateness {late}: max", ("lateness", "max_ms"), "ms"),
    ("lateness {late}: min", ("lateness", "min_ms"), "ms"),
    ("lateness {late}: lost", ("lateness", "lost"), "count"),
    ("lateness {late}: duplicates", ("lateness", "duplicates"), "count"),
    ("lateness {late}: early (start < due)", ("lateness", "early"), "count"),
    ("lateness {late}: worker CPU", ("lateness", "worker_cpu_percent"), "%"),
    ("", None, ""),
    ("lateness {light}: p50", ("lateness_light", "p50_ms"), "ms"),
    ("lateness {light}: p99", ("lateness_light", "p99_ms"), "ms"),
    ("lateness {light}: max", ("lateness_light", "max_ms"), "ms"),
    ("lateness {light}: min", ("lateness_light", "min_ms"), "ms"),
    ("lateness {light}: lost", ("lateness_light", "lost"), "count"),
    ("lateness {light}: early (start < due)", ("lateness_light", "early"), "count"),
    ("", None, ""),
    ("Redis commands/s during the run (all clients)", ("server_commands_per_second",), "/s"),
]


def lookup(report: dict[str, Any] | None, path: tuple[str, ...]) -> Any:
    """``report[path[0]][path[1]]...``, or None where any step is missing."""
    value: Any = report
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def shown(value: Any, unit: str) -> str:
    """One cell."""
    if value is None:
        return ""
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.1f} %"
    if abs(value) >= 100:
        return f"{value:,.0f} ms"
    return f"{value:.1f} ms"


def print_comparison(
    reports: dict[str, dict[str, Any] | None], sizes: dict[str, Any], title: str
) -> None:
    """One rich table: a column per peer (and delayq's reference, if any)."""
    from rich.table import Table  # noqa: PLC0415 (rich is in the venv only)

    from _common import console  # noqa: PLC0415 (benchmarks/ is on the path only here)

    late = f"({sizes['late_jobs']} jobs over {sizes['late_seconds']:g} s)"
    light = f"(light: {sizes['light_jobs']} over {sizes['light_seconds']:g} s)"
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("measure")
    for name, report in reports.items():
        if name == "delayq":
            header = "delayq (durable-redis.json)"
        else:
            header = f"{name} {report['version']}" if report else f"{name} (failed)"
        table.add_column(header, justify="right")
    for label, path, unit in ROWS:
        if path is None:
            table.add_section()
            continue
        cells = [shown(lookup(report, path), unit) for report in reports.values()]
        table.add_row(label.format(late=late, light=light), *cells)
    console.print(table)
    for line in footnotes(reports):
        console.print(line, style="dim", highlight=False)


def footnotes(reports: dict[str, dict[str, Any] | None]) -> list[str]:
    """What the table cannot say: saturated workers, the delayq column's origin, a
    server whose counters were reset meanwhile."""
    notes = []
    for name, report in reports.items():
        if not report or name == "delayq":
            continue
        drain = lookup(report, ("drain", "jobs_per_second"))
        offered = lookup(report, ("lateness", "offered_jobs_per_second"))
        if drain and offered and drain < offered:
            notes.append(
                f"{name}: one worker drains {drain:,.0f} jobs/s < {offered:,.0f}/s offered, "
                "so its lateness grows with the backlog"
            )
        load = lookup(report, ("server_commands_per_second",))
        if isinstance(load, float) and math.isnan(load):
            notes.append(f"{name}: another client reset the server's stats during the run")
    reference = reports.get("delayq")
    if reference:
        notes.append(
            f"delayq: {reference['source']} (commit {reference['version']}, "
            f"{reference['started']}): put one by one; drain = reserve(max=100) + ack of "
            "put_many'd messages; lateness = consumer in another process; no light-load run"
        )
    return notes


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Make the venv, re-run inside it, run the peers, print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="server, no db")
    parser.add_argument("--arq-db", type=int, default=DEFAULT_DBS["arq"])
    parser.add_argument("--rq-db", type=int, default=DEFAULT_DBS["rq"])
    parser.add_argument("--peers", default=",".join(PEERS), help="which, comma-separated")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per peer")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--reinstall", action="store_true", help="rebuild the venv")
    args = parser.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; choose from {','.join(PEERS)}")

    if not inside_venv():
        ensure_venv(args.reinstall)
        arguments = sys.argv[1:] if argv is None else argv
        arguments = [a for a in arguments if a != "--reinstall"]
        os.execv(venv_python(), [str(venv_python()), str(Path(__file__).resolve()), *arguments])

    sys.path.insert(0, str(BENCHMARKS))
    from _common import environment  # noqa: PLC0415 (benchmarks/ is on the path only here)

    env = environment()
    base = args.redis.rstrip("/")
    dbs = {"arq": args.arq_db, "rq": args.rq_db}
    started = time.monotonic()
    reports: dict[str, dict[str, Any] | None] = {
        peer: run_peer(peer, f"{base}/{dbs[peer]}", args.quick, args.timeout) for peer in peers
    }
    total = time.monotonic() - started
    reference = delayq_reference()
    shown_reports = dict(reports)
    if reference is not None:
        shown_reports["delayq"] = reference
    sizes = next((r["sizes"] for r in reports.values() if r), None)
    if sizes is not None:
        mode = "quick" if args.quick else "full"
        print_comparison(shown_reports, sizes, f"peers on {base} ({mode}, {total:.0f} s)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "peers",
        "redis": base,
        "mode": "quick" if args.quick else "full",
        "environment": env,
        "total_seconds": total,
        "peers": reports,
        "delayq_reference": reference,
    }
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)
    failed = [peer for peer, report in reports.items() if report is None]
    if failed:
        print(f"failed: {', '.join(failed)} (see {LOCAL_RESULTS}/*-worker.log)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
