"""arq, default settings: enqueue, drain and lateness (see ``_harness`` for the method).

Run by ``run.py`` inside ``benchmarks/peers/.venv``; by hand::

    benchmarks/peers/.venv/bin/python benchmarks/peers/arq_bench.py \\
        --url redis://127.0.0.1:6379/12 [--quick] [--json out.json]

The worker is arq's own CLI, ``arq arq_bench.WorkerSettings``, whose settings name
only the functions and the Redis connection; everything else is arq's default:
``poll_delay=0.5`` s (the worker looks at the queue twice a second), ``max_jobs=10``,
``queue_read_limit=max(max_jobs * 5, 100)`` = 100 job ids per poll,
``job_timeout=300`` s, ``keep_result=3600`` s, ``max_tries=5``, no burst. Jobs go
through ``ArqRedis.enqueue_job`` to the default queue ``arq:queue``; delayed ones
with ``_defer_by`` (arq scores them in whole milliseconds of the client's clock).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

from _harness import (
    LOCAL_RESULTS,
    QUICK,
    RECORD_KEY,
    Sizes,
    WorkerProcess,
    lateness_plan,
    measure_drain,
    measure_lateness,
    private_db,
    record_line,
    server_load,
    sizes_dict,
    stop_on_sigterm,
    warm_up,
    write_report,
)
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.constants import default_queue_name

#: The worker reads its Redis URL from here (set by the benchmark for its subprocess).
URL_ENV = "PEERS_ARQ_URL"
DEFAULTS = {
    "poll_delay": "0.5 s",
    "max_jobs": 10,
    "queue_read_limit": "max(max_jobs * 5, 100) = 100",
    "job_timeout": "300 s",
    "keep_result": "3600 s",
    "max_tries": 5,
    "burst": False,
    "queue": default_queue_name,
    "delayed jobs": "enqueue_job(..., _defer_by=timedelta) scored in ms by the client clock",
}


# -- the jobs (run in the worker) --------------------------------------------------------


async def noop(ctx: dict[str, Any]) -> None:
    """The drain job: does nothing."""


async def record(ctx: dict[str, Any], seq: int) -> None:
    """The lateness job: push its sequence number and start time."""
    started = time.time()
    await ctx["redis"].rpush(RECORD_KEY, record_line(seq, started))


class WorkerSettings:
    """What ``arq arq_bench.WorkerSettings`` runs: the two jobs and the connection;
    every other setting is arq's default."""

    functions: ClassVar[list[Any]] = [noop, record]
    redis_settings = RedisSettings.from_dsn(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/12"))


# -- the benchmark (runs here) ------------------------------------------------------------


async def enqueue_many(pool: ArqRedis, count: int) -> float:
    """Enqueue ``count`` no-op jobs one by one; return jobs per second."""
    started = time.perf_counter()
    for _ in range(count):
        await pool.enqueue_job("noop")
    return count / (time.perf_counter() - started)


async def produce(pool: ArqRedis, plan: list[tuple[float, float]]) -> dict[int, float]:
    """Enqueue the lateness jobs on schedule; return each one's due time (epoch s)."""
    due: dict[int, float] = {}
    started = time.monotonic()
    for seq, (offset, delay) in enumerate(plan):
        pause = started + offset - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        due[seq] = time.time() + delay
        if delay:
            await pool.enqueue_job("record", seq, _defer_by=timedelta(seconds=delay))
        else:
            await pool.enqueue_job("record", seq)
    return due


def run(url: str, sizes: Sizes) -> dict[str, Any]:
    """All three measurements on an empty database; the database is flushed after."""
    loop = asyncio.new_event_loop()
    report: dict[str, Any] = {
        "peer": "arq",
        "version": version("arq"),
        "url": url,
        "defaults": DEFAULTS,
        "worker": "arq arq_bench.WorkerSettings (one process)",
        "sizes": sizes_dict(sizes),
    }
    try:
        with private_db(url) as client, server_load(client, report):
            pool = loop.run_until_complete(create_pool(RedisSettings.from_dsn(url)))
            try:
                print("arq: enqueue ...", file=sys.stderr)
                report["enqueue_per_second"] = loop.run_until_complete(
                    enqueue_many(pool, sizes.enqueues)
                )
                worker = WorkerProcess(
                    [str(Path(sys.executable).with_name("arq")), "arq_bench.WorkerSettings"],
                    LOCAL_RESULTS / "arq-worker.log",
                    {URL_ENV: url},
                )
                with worker:
                    print("arq: drain ...", file=sys.stderr)
                    report["drain"] = measure_drain(
                        worker,
                        lambda: sizes.enqueues - client.zcard(default_queue_name),
                        sizes.enqueues,
                        sizes.drain_timeout,
                    )
                    warm_up(
                        client,
                        worker,
                        lambda: loop.run_until_complete(
                            pool.enqueue_job("record", -1, _defer_by=timedelta(seconds=0.2))
                        ),
                    )
                    for key, jobs, seconds in (
                        ("lateness", sizes.late_jobs, sizes.late_seconds),
                        ("lateness_light", sizes.light_jobs, sizes.light_seconds),
                    ):
                        print(f"arq: {key} ...", file=sys.stderr)
                        report[key] = measure_lateness(
                            client,
                            worker,
                            lambda plan: loop.run_until_complete(produce(pool, plan)),
                            lateness_plan(jobs, seconds),
                            sizes,
                        )
            finally:
                loop.run_until_complete(pool.aclose())
    finally:
        loop.close()
    return report


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, write the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/12", help="an empty Redis db")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--json", type=Path, default=LOCAL_RESULTS / "arq.json")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    write_report(args.json, run(args.url, QUICK if args.quick else Sizes()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
