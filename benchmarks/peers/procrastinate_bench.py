"""delayq against its peer on PostgreSQL, procrastinate, on the same server in one run.

    .venv/bin/python benchmarks/peers/procrastinate_bench.py \\
        --url postgresql://postgres@127.0.0.1:5432/test [--quick]

Run with delayq's own environment (``make lint`` makes it). It runs
``benchmarks/durable.py`` on the URL (schema ``delayq_bench``), then procrastinate
(pinned in ``procrastinate-requirements.txt``, installed into
``benchmarks/peers/.venv-procrastinate``, again when that file changes) in a schema of
its own, dropped afterwards, and prints one table; JSON goes to
``benchmarks/results/peers-postgres.json``. Never asserts.

procrastinate runs with its defaults: one worker process (``app.run_worker``),
``concurrency = 1``, LISTEN/NOTIFY for jobs due at once, a poll every
``fetch_job_polling_interval = 5`` s for the others. Measured as durable.py measures
delayq: enqueue one by one (2,000 ``defer_async``); lateness of 2,000 jobs put over
10 s (one every 5 ms), each delayed by 0, 1 ms, 10 ms, 50 ms, 200 ms or 1 s
(``configure(schedule_in=...)``), lateness = the job's start (the worker's
``time.time()``) minus its due time (the producer's ``time.time()`` before the defer,
plus the delay); drain: 20,000 jobs due at once (``batch_defer_async`` by 1,000), then
the worker started, jobs/s from the first job's start to the last's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _driver as driver

VENV = driver.HERE / ".venv-procrastinate"
REQUIREMENTS = driver.HERE / "procrastinate-requirements.txt"
DELAYS = (0.0, 0.001, 0.01, 0.05, 0.2, 1.0)
RECORD_FILE = "DELAYQ_PEER_RECORD"
CONNINFO = "DELAYQ_PEER_CONNINFO"

# -- procrastinate's side (inside its venv) ---------------------------------------------

if os.environ.get(CONNINFO):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ[CONNINFO]))

    @app.task(name="record")
    def record(n: int, due: float) -> None:
        """Note when the job started, by the worker's clock."""
        started = time.time()
        with open(os.environ[RECORD_FILE], "a") as out:
            out.write(f"{n} {started!r} {due!r}\n")


def start_worker(queue: str, log: Path) -> subprocess.Popen[bytes]:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import procrastinate_bench as b; "
        f"b.app.run_worker(queues=[{queue!r}])"
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code, str(driver.HERE)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def records(path: Path) -> list[tuple[int, float, float]]:
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [(int(a), float(b), float(c)) for a, b, c in (line.split() for line in lines if line)]


def wait_for(path: Path, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(records(path)) < count and time.monotonic() < deadline:
        time.sleep(0.2)


async def peer_run(quick: bool, work: Path) -> dict[str, Any]:
    import procrastinate  # noqa: PLC0415

    late_jobs, late_seconds, drain_jobs = (400, 2.0, 4_000) if quick else (2_000, 10.0, 20_000)
    out: dict[str, Any] = {"peer": "procrastinate", "version": procrastinate.__version__}
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["record"]
        started = time.perf_counter()
        for i in range(2_000):
            await task.configure(queue="enqueue").defer_async(n=i, due=0.0)
        out["enqueue_per_second"] = 2_000 / (time.perf_counter() - started)

        late_file = work / "late.txt"
        worker = start_worker("late", work / "worker-late.log")
        await asyncio.sleep(3.0)  # the worker is up and listening
        rng = random.Random(7)
        step = late_seconds / late_jobs
        begin = time.monotonic()
        for i in range(late_jobs):
            await asyncio.sleep(max(0.0, begin + i * step - time.monotonic()))
            delay = rng.choice(DELAYS)
            due = time.time() + delay
            if delay > 0:
                deferrer = task.configure(queue="late", schedule_in={"seconds": delay})
            else:
                deferrer = task.configure(queue="late")
            await deferrer.defer_async(n=i, due=due)
        await asyncio.to_thread(wait_for, late_file, late_jobs, 30.0)
        driver.stop(worker)
        got = records(late_file)
        late = sorted((start - due) * 1000.0 for _, start, due in got)
        counts: dict[int, int] = {}
        for n, _, _ in got:
            counts[n] = counts.get(n, 0) + 1
        out["lateness"] = {
            "p50_ms": statistics.median(late) if late else None,
            "p99_ms": late[min(len(late) - 1, int(len(late) * 0.99))] if late else None,
            "max_ms": late[-1] if late else None,
            "lost": late_jobs - len(counts),
            "duplicates": sum(c - 1 for c in counts.values()),
            "early": sum(1 for value in late if value < 0),
        }

        for first in range(0, drain_jobs, 1_000):
            batch = [{"n": n, "due": 0.0} for n in range(first, min(drain_jobs, first + 1_000))]
            await task.configure(queue="drain").batch_defer_async(*batch)
        drain_file = work / "drain.txt"
        os.environ[RECORD_FILE] = str(drain_file)
        worker = start_worker("drain", work / "worker-drain.log")
        await asyncio.to_thread(wait_for, drain_file, drain_jobs, 600.0)
        driver.stop(worker)
        starts = sorted(start for _, start, _ in records(drain_file))
        out["drain"] = {
            "jobs": len(starts),
            "jobs_per_second": (len(starts) - 1) / (starts[-1] - starts[0])
            if len(starts) > 1
            else None,
        }
    return out


# -- the orchestrator (delayq's venv) ---------------------------------------------------


def delayq_run(url: str, quick: bool) -> dict[str, Any]:
    path = driver.RESULTS / "durable-postgresql-peers.json"
    by_name = driver.run_durable(driver.with_params(url, schema="delayq_bench"), quick, path)
    return {
        "peer": "delayq",
        "enqueue_per_second": by_name.get("put one by one"),
        "commit_floor_per_second": by_name.get("the server's commit floor: INSERT one by one"),
        "drain": {"jobs_per_second": by_name.get("drain: reserve(max=100) + ack_many")},
        "lateness": driver.delayq_lateness(by_name),
    }


def procrastinate_run(url: str, quick: bool) -> dict[str, Any]:
    import psycopg  # noqa: PLC0415 (delayq's postgres extra)

    python = driver.ensure_venv(VENV, REQUIREMENTS)
    schema = f"procrastinate_bench_{uuid.uuid4().hex[:8]}"
    work = driver.HERE / "results" / "procrastinate"
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*"):
        old.unlink()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            env = dict(
                os.environ,
                **{
                    CONNINFO: driver.with_params(url, options=f"-csearch_path%3D{schema}"),
                    RECORD_FILE: str(work / "late.txt"),
                },
            )
            command = [str(python), str(Path(__file__).resolve()), "--peer", str(work)]
            subprocess.run([*command, *(["--quick"] if quick else [])], env=env, check=True)
            report: dict[str, Any] = json.loads((work / "report.json").read_text())
            return report
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


ROWS: list[driver.Row] = [
    ("enqueue one by one (/s)", ("enqueue_per_second",)),
    ("drain (/s)", ("drain", "jobs_per_second")),
    *driver.LATENESS_ROWS,
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer is not None:
        report = asyncio.run(peer_run(args.quick, args.peer))
        (args.peer / "report.json").write_text(json.dumps(report, indent=2))
        return 0
    reports = [delayq_run(args.url, args.quick), procrastinate_run(args.url, args.quick)]
    driver.RESULTS.mkdir(parents=True, exist_ok=True)
    (driver.RESULTS / "peers-postgres.json").write_text(json.dumps(reports, indent=2))
    driver.print_table(reports, ROWS)
    floor = reports[0].get("commit_floor_per_second")
    if floor:
        print(f"\nthe server's commit floor in this run: {floor:,.0f} single-row commits/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
