"""delayq and its peers on the same Redis, in one run: ``python3 benchmarks/peers/run.py``.

Each peer runs from a venv of its own made from its pinned requirements file (again
whenever that file changes): arq, rq, bullmq's driver and this one in ``.venv``
(``requirements.txt``), celery in ``.venv-celery``, dramatiq, huey and saq in
``.venv-<name>`` (``<name>-requirements.txt``), bullmq under Node.js from
``bullmq/package-lock.json`` (``npm ci`` into ``bullmq/node_modules``), delayq from
the repository's own ``.venv`` (``make .venv/.installed``). Each peer and variant
runs ``<peer>_bench.py`` (celery: ``celery_redis_bench.py``), every one on
``_harness.run_benchmark``, in its own empty Redis database, flushed afterwards, its
worker stopped even on failure or timeout. The machine's floors are measured in the
same run, before the peers and after them (the table shows the better of the two):
pipelined ZADD (enqueue) and 8 threads of the job alone with no queue (drain).
It prints one table and writes ``benchmarks/results/peers-redis.json``.

Options: ``--quick`` (smaller sizes), ``--runs delayq,arq:tuned,...`` (a peer alone
means all its variants; the default is every peer but rq), ``--redis URL`` (a server
without a database number), ``--db PEER=N`` (repeatable), ``--timeout SECONDS`` per
run, ``--json PATH``, ``--reinstall``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _driver import ensure_venv

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
ROOT = BENCHMARKS.parent
VENV = HERE / ".venv"
REQUIREMENTS = HERE / "requirements.txt"
LOCAL_RESULTS = HERE / "results"
DEFAULT_JSON = BENCHMARKS / "results" / "peers-redis.json"
BULLMQ = HERE / "bullmq"
#: Every peer's variants, in the table's order.
VARIANTS: dict[str, tuple[str, ...]] = {
    "delayq": ("defaults", "quiet", "processes-2", "tuned"),
    "celery": ("defaults", "tuned"),
    "dramatiq": ("defaults", "tuned"),
    "arq": ("defaults", "tuned"),
    "huey": ("defaults", "tuned"),
    "saq": ("defaults", "tuned"),
    "bullmq": ("defaults", "tuned"),
    "rq": ("defaults",),
}
#: The asyncio floor's INCRs in flight (one client, one process): as many as delayq's
#: tuned worker runs handlers per process (``delayq_bench.TUNED_CONCURRENCY``) and
#: bullmq's tuned worker jobs.
ASYNC_IN_FLIGHT = 50
#: What runs without ``--runs``: every peer but rq, whose worker forks a process per
#: job (the 20,000-job drain takes minutes); ``--runs ...,rq`` adds it.
DEFAULT_RUNS = "delayq,celery,dramatiq,arq,huey,saq,bullmq"
#: Each peer's Redis database (the floors' too); each must be empty.
DEFAULT_DBS = {
    "delayq": 2,
    "celery": 3,
    "dramatiq": 4,
    "huey": 5,
    "saq": 6,
    "bullmq": 7,
    "floors": 8,
    "arq": 12,
    "rq": 13,
}
#: Each peer's script where it is not ``<peer>_bench.py`` (that one is Celery on RabbitMQ).
SCRIPTS = {"celery": "celery_redis_bench.py"}
#: The venv and requirements file of the peers not in ``.venv``.
OWN_VENVS = {
    "celery": (HERE / ".venv-celery", HERE / "celery-requirements.txt"),
    "dramatiq": (HERE / ".venv-dramatiq", HERE / "dramatiq-requirements.txt"),
    "huey": (HERE / ".venv-huey", HERE / "huey-requirements.txt"),
    "saq": (HERE / ".venv-saq", HERE / "saq-requirements.txt"),
}


# -- the venvs ---------------------------------------------------------------------------


def ensure_bullmq(reinstall: bool) -> None:
    """``npm ci`` in ``bullmq/`` unless ``node_modules`` holds this package-lock.json."""
    lock = BULLMQ / "package-lock.json"
    stamp = BULLMQ / "node_modules" / ".package-lock.sha256"
    wanted = hashlib.sha256(lock.read_bytes()).hexdigest()
    if not reinstall and stamp.exists() and stamp.read_text().strip() == wanted:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("bullmq needs Node.js and npm (or leave it out: --runs ...)")
    print(f"npm ci in {BULLMQ} ...", file=sys.stderr)
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"], cwd=BULLMQ, check=True, stdout=sys.stderr
    )
    stamp.write_text(wanted + "\n")


def python_for(peer: str, reinstall: bool) -> Path:
    """The interpreter ``<peer>_bench.py`` runs in (its venv made first)."""
    if peer == "delayq":
        python = ROOT / ".venv" / "bin" / "python"
        if not python.exists():
            raise SystemExit(f"delayq runs from {ROOT / '.venv'}: run `make .venv/.installed`")
        return python
    if peer == "bullmq":
        ensure_bullmq(reinstall)
    if peer in OWN_VENVS:
        return ensure_venv(*OWN_VENVS[peer], reinstall=reinstall)
    return Path(sys.executable)


def inside_venv() -> bool:
    """Whether this interpreter is the driver's venv."""
    return Path(sys.prefix).resolve() == VENV.resolve()


# -- running --------------------------------------------------------------------------------


def run_one(
    python: Path, peer: str, variant: str, url: str, quick: bool, timeout: float
) -> dict[str, Any] | None:
    """Run ``<peer>_bench.py --variant`` in a subprocess; its report, or None if it
    failed. On timeout it gets SIGTERM (it then stops its worker and flushes its
    database), and SIGKILL 30 s later."""
    out = LOCAL_RESULTS / f"{peer}-{variant}.json"
    out.unlink(missing_ok=True)
    script = SCRIPTS.get(peer, f"{peer}_bench.py")
    command = [str(python), str(HERE / script), "--url", url]
    command += ["--variant", variant, "--json", str(out), *(["--quick"] if quick else [])]
    print(f"== {peer} {variant} on {url}", file=sys.stderr)
    started = time.monotonic()
    child = subprocess.Popen(command, cwd=HERE)
    try:
        code = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{peer} {variant}: over {timeout:.0f} s, stopping it", file=sys.stderr)
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
    print(f"{peer} {variant}: {time.monotonic() - started:.0f} s, exit {code}", file=sys.stderr)
    if code != 0 or not out.exists():
        return None
    report: dict[str, Any] = json.loads(out.read_text())
    report["seconds"] = time.monotonic() - started
    return report


def floors(url: str, jobs: int = 20_000, batch: int = 1_000, repeat: int = 3) -> dict[str, Any]:
    """The machine's floors on the same server, the best of ``repeat`` tries each:
    ``jobs`` ZADDs in pipelines of ``batch`` (what a queue's enqueue cannot beat), and
    ``jobs`` INCRs (the drain's job) from 8 threads sharing one client with no queue
    (what a worker of 8 handlers in one process cannot beat), and ``jobs`` INCRs
    awaited by :data:`ASYNC_IN_FLIGHT` asyncio tasks sharing one ``redis.asyncio``
    client (what one process of as many async handlers cannot beat). The full sizes
    in a ``--quick`` run too: they take seconds."""
    sys.path.insert(0, str(HERE))
    import redis  # noqa: PLC0415 (in the driver's venv only)
    from _harness import private_db  # noqa: PLC0415

    def zadd(client: redis.Redis) -> float:
        started = time.perf_counter()
        for start in range(0, jobs, batch):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(jobs, start + batch)):
                pipe.zadd("floor:zset", {f"job-{i}": time.time()})
            pipe.execute()
        rate = jobs / (time.perf_counter() - started)
        client.delete("floor:zset")
        return rate

    def incr(shared: redis.Redis) -> float:
        each = jobs // 8
        gate = threading.Barrier(9)

        def loop() -> None:
            gate.wait()
            for _ in range(each):
                shared.incr("floor:done")

        threads = [threading.Thread(target=loop) for _ in range(8)]
        for thread in threads:
            thread.start()
        gate.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        return each * 8 / (time.perf_counter() - started)

    async def incr_async() -> float:
        import redis.asyncio  # noqa: PLC0415

        shared = redis.asyncio.Redis.from_url(url)
        each = jobs // ASYNC_IN_FLIGHT

        async def loop() -> None:
            for _ in range(each):
                await shared.incr("floor:done")

        try:
            # Every connection made first, as a worker's are by its warm-up.
            await asyncio.gather(*(shared.ping() for _ in range(ASYNC_IN_FLIGHT)))
            started = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(ASYNC_IN_FLIGHT)))
            return each * ASYNC_IN_FLIGHT / (time.perf_counter() - started)
        finally:
            await shared.aclose()

    with private_db(url) as client:
        shared = redis.Redis.from_url(url)
        try:
            shared.ping()
            zadds = [zadd(client) for _ in range(repeat)]
            incrs = [incr(shared) for _ in range(repeat)]
            asyncs = [asyncio.run(incr_async()) for _ in range(repeat)]
        finally:
            shared.close()
    return {
        "pipelined_zadd_per_second": max(zadds),
        "incr_8_threads_per_second": max(incrs),
        "incr_async_per_second": max(asyncs),
        "async_in_flight": ASYNC_IN_FLIGHT,
        "tries": {"pipelined_zadd": zadds, "incr_8_threads": incrs, "incr_async": asyncs},
        "jobs": jobs,
    }


# -- the table ------------------------------------------------------------------------------


def cell(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}"


def row(name: str, report: dict[str, Any] | None) -> str:
    """One line of the markdown table."""
    if report is None:
        return f"| {name} | failed | | | | | | |"
    late = report.get("lateness") or {}
    enqueue = report.get("enqueue") or {}
    lateness = " / ".join(cell(late.get(k), 1) for k in ("p50_ms", "p99_ms", "max_ms"))
    counts = " / ".join(cell(late.get(k)) for k in ("lost", "duplicates", "early"))
    batch = enqueue.get("batch_per_second")
    batch_cell = f"{cell(batch)} ({enqueue['batch_api']})" if batch else "-"
    return (
        f"| {name} | {lateness} | {counts} | {cell(enqueue.get('one_by_one_per_second'))} | "
        f"{batch_cell} | {cell((report.get('drain') or {}).get('jobs_per_second'))} | "
        f"{cell(late.get('worker_cpu_percent'))} | {report['worker']} |"
    )


def print_table(reports: dict[str, dict[str, Any] | None], floor: dict[str, Any] | None) -> None:
    late = "lateness p50 / p99 / max ms"
    print(
        f"\n| peer (variant, version) | {late} | lost / dup / early | enqueue 1 by 1 /s | "
        "enqueue batch /s | drain /s | worker CPU % | worker |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, report in reports.items():
        name = f"{key} {report['version']}" if report else key
        print(row(name, report))
    if floor is not None:
        print(
            f"| the machine: pipelined ZADD; 8 threads of the job alone (no queue) | | | | "
            f"{cell(floor['pipelined_zadd_per_second'])} | "
            f"{cell(floor['incr_8_threads_per_second'])} | | |"
        )
        print(
            f"| the machine: the job alone on asyncio, {ASYNC_IN_FLIGHT} in flight, one "
            f"process (no queue) | | | | | {cell(floor['incr_async_per_second'])} | | |"
        )
    print()
    for line in summary(reports, floor):
        print(line)


def best(reports: dict[str, dict[str, Any] | None], mine: bool, path: tuple[str, ...]) -> Any:
    """(value, run) of the highest ``path`` among delayq's runs (``mine``) or the peers'."""
    found = []
    for key, report in reports.items():
        value: Any = report
        for step in path:
            value = (value or {}).get(step)
        if report and (report["peer"] == "delayq") == mine and value and value == value:
            found.append((value, key))
    return max(found) if found else (None, None)


def summary(reports: dict[str, dict[str, Any] | None], floor: dict[str, Any] | None) -> list[str]:
    """Issue 38's ratios (delayq's best run against the best peer's and the floors),
    and what the table cannot say: saturated workers, a server reset meanwhile."""
    lines = []
    for label, paths in (
        ("enqueue", (("enqueue", "batch_per_second"), ("enqueue", "one_by_one_per_second"))),
        ("drain", (("drain", "jobs_per_second"),)),
    ):
        ours = max((best(reports, True, p) for p in paths), key=lambda b: b[0] or 0)
        theirs = max((best(reports, False, p) for p in paths), key=lambda b: b[0] or 0)
        if ours[0] and theirs[0]:
            lines.append(
                f"{label}: delayq {ours[0]:,.0f}/s ({ours[1]}) = {ours[0] / theirs[0]:.1f}x "
                f"the best peer, {theirs[0]:,.0f}/s ({theirs[1]})"
            )
        if floor and ours[0] and label == "enqueue":
            share = 100 * ours[0] / floor["pipelined_zadd_per_second"]
            lines.append(f"enqueue: delayq = {share:.0f}% of the floor (pipelined ZADD)")
    if floor:
        # Each delayq drain against the floor of its kind of handler: the sync ones
        # against 8 threads of the job, the async one against the job on asyncio.
        for key, report in reports.items():
            rate = ((report or {}).get("drain") or {}).get("jobs_per_second")
            if not report or report["peer"] != "delayq" or not rate or rate != rate:
                continue
            if report["variant"] == "tuned":
                alone = floor["incr_async_per_second"]
                what = f"the job alone on asyncio, {ASYNC_IN_FLIGHT} in flight, one process"
            else:
                alone, what = floor["incr_8_threads_per_second"], "8 threads of the job alone"
            lines.append(f"drain: {key} {rate:,.0f}/s = {100 * rate / alone:.0f}% of {what}")
    for key, report in reports.items():
        if not report:
            continue
        drain = (report.get("drain") or {}).get("jobs_per_second")
        offered = (report.get("lateness") or {}).get("offered_jobs_per_second")
        if drain and offered and drain < offered:
            lines.append(
                f"{key}: drains {drain:,.0f} jobs/s < {offered:,.0f}/s offered, so its "
                "lateness grows with the backlog"
            )
        load = report.get("server_commands_per_second")
        if isinstance(load, float) and math.isnan(load):
            lines.append(f"{key}: another client reset the server's stats during the run")
    return lines


# -- main -----------------------------------------------------------------------------------


def selected_runs(spec: str) -> list[tuple[str, str]]:
    """``delayq,arq:tuned`` -> [(delayq, defaults), (delayq, processes-2), (arq, tuned)]."""
    runs = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        peer, _, variant = item.partition(":")
        if peer not in VARIANTS or (variant and variant not in VARIANTS[peer]):
            choices = ", ".join(f"{p}:{v}" for p, vs in VARIANTS.items() for v in vs)
            raise SystemExit(f"unknown run {item!r}; choose from {choices}")
        runs += [(peer, v) for v in ((variant,) if variant else VARIANTS[peer])]
    return runs


def main(argv: list[str] | None = None) -> int:
    """Make the driver's venv, re-run inside it, run every peer, print and write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="server, no db")
    parser.add_argument("--db", action="append", default=[], help="PEER=N (repeatable)")
    parser.add_argument("--runs", default=DEFAULT_RUNS, help="peer[:variant],...")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--reinstall", action="store_true", help="rebuild the venvs")
    args = parser.parse_args(argv)
    runs = selected_runs(args.runs)
    dbs = dict(DEFAULT_DBS)
    for item in args.db:
        peer, _, number = item.partition("=")
        if peer not in dbs or not number.isdigit():
            raise SystemExit(f"--db wants PEER=N with PEER one of {', '.join(dbs)}: {item!r}")
        dbs[peer] = int(number)

    if not inside_venv():
        ensure_venv(VENV, REQUIREMENTS, args.reinstall)
        arguments = sys.argv[1:] if argv is None else argv
        os.execv(venv_python(), [str(venv_python()), str(Path(__file__).resolve()), *arguments])

    sys.path.insert(0, str(BENCHMARKS))
    from _common import environment  # noqa: PLC0415 (benchmarks/ is on the path only here)

    pythons = {peer: python_for(peer, args.reinstall) for peer in dict.fromkeys(p for p, _ in runs)}
    base = args.redis.rstrip("/")
    started = time.monotonic()
    print("== floors, before", file=sys.stderr)
    floor_before = floors(f"{base}/{dbs['floors']}")
    reports: dict[str, dict[str, Any] | None] = {}
    for peer, variant in runs:
        url = f"{base}/{dbs[peer]}"
        reports[f"{peer} ({variant})"] = run_one(
            pythons[peer], peer, variant, url, args.quick, args.timeout
        )
    print("== floors, after", file=sys.stderr)
    floor_after = floors(f"{base}/{dbs['floors']}")
    # The machine's best of both: a loaded machine's floor moves during a long run.
    floor = {
        key: max(floor_before[key], floor_after[key])
        for key in (
            "pipelined_zadd_per_second",
            "incr_8_threads_per_second",
            "incr_async_per_second",
        )
    }
    total = time.monotonic() - started
    print(f"\npeers on {base} ({'quick' if args.quick else 'full'} run, {total:.0f} s)")
    print_table(reports, floor)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "peers-redis",
        "redis": base,
        "mode": "quick" if args.quick else "full",
        "environment": environment(),
        "total_seconds": total,
        "runs": reports,
        "floors": {**floor, "before": floor_before, "after": floor_after},
        "summary": summary(reports, floor),
    }
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)
    failed = [key for key, report in reports.items() if report is None]
    if failed:
        print(f"failed: {', '.join(failed)} (see {LOCAL_RESULTS}/*-worker.log)", file=sys.stderr)
        return 1
    return 0


def venv_python() -> Path:
    """The interpreter of the driver's venv."""
    return VENV / "bin" / "python"


if __name__ == "__main__":
    sys.exit(main())
