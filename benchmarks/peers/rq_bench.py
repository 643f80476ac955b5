"""rq with its built-in scheduler, default settings: enqueue, drain and lateness
(see ``_harness`` for the method).

Run by ``run.py`` inside ``benchmarks/peers/.venv``; by hand::

    benchmarks/peers/.venv/bin/python benchmarks/peers/rq_bench.py \\
        --url redis://127.0.0.1:6379/13 [--quick] [--json out.json]

The worker is rq's own CLI, ``rq worker --with-scheduler``: the flag is needed for
``enqueue_in``/``enqueue_at`` jobs to run at all, everything else is rq's default:
the ``rq.Worker`` class (forks a work horse per job), the scheduler
(``RQScheduler``, in a process the worker forks) moves due jobs to the queue every
``interval=1`` s and stores due times in whole seconds, ``result_ttl=500`` s, job
timeout 180 s, pickle serializer. Jobs go through ``Queue.enqueue`` (due now) and
``Queue.enqueue_in`` (delayed), named by their dotted path.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
from _harness import (
    HERE,
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
from rq import Queue, get_current_job

QUEUE = "peers-bench"
DEFAULTS = {
    "worker class": "rq.Worker (forks a work horse per job)",
    "scheduler": "rq worker --with-scheduler; RQScheduler interval = 1 s",
    "scheduled time resolution": "whole seconds (ScheduledJobRegistry score)",
    "result_ttl": "500 s",
    "job timeout": "180 s",
    "serializer": "pickle",
    "delayed jobs": "Queue.enqueue_in(timedelta, ...)",
}


# -- the jobs (run in the worker's work horse) -------------------------------------------


def noop() -> None:
    """The drain job: does nothing."""


def record(seq: int) -> None:
    """The lateness job: push its sequence number and start time."""
    started = time.time()
    job = get_current_job()
    assert job is not None
    job.connection.rpush(RECORD_KEY, record_line(seq, started))


# -- the benchmark (runs here) ------------------------------------------------------------


def enqueue_many(queue: Queue, count: int) -> float:
    """Enqueue ``count`` no-op jobs one by one; return jobs per second."""
    started = time.perf_counter()
    for _ in range(count):
        queue.enqueue("rq_bench.noop")
    return count / (time.perf_counter() - started)


def produce(queue: Queue, plan: list[tuple[float, float]]) -> dict[int, float]:
    """Enqueue the lateness jobs on schedule; return each one's due time (epoch s)."""
    due: dict[int, float] = {}
    started = time.monotonic()
    for seq, (offset, delay) in enumerate(plan):
        pause = started + offset - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        due[seq] = time.time() + delay
        if delay:
            queue.enqueue_in(timedelta(seconds=delay), "rq_bench.record", seq)
        else:
            queue.enqueue("rq_bench.record", seq)
    return due


def run(url: str, sizes: Sizes) -> dict[str, Any]:
    """All three measurements on an empty database; the database is flushed after."""
    report: dict[str, Any] = {
        "peer": "rq",
        "version": version("rq"),
        "url": url,
        "defaults": DEFAULTS,
        "worker": "rq worker --with-scheduler (one worker process)",
        "sizes": sizes_dict(sizes),
    }
    with private_db(url) as client, server_load(client, report):
        connection = redis.Redis.from_url(url)
        try:
            queue = Queue(QUEUE, connection=connection)
            print("rq: enqueue ...", file=sys.stderr)
            report["enqueue_per_second"] = enqueue_many(queue, sizes.enqueues)
            worker = WorkerProcess(
                [
                    str(Path(sys.executable).with_name("rq")),
                    "worker",
                    "--with-scheduler",
                    "--url",
                    url,
                    "--path",
                    str(HERE),
                    QUEUE,
                ],
                LOCAL_RESULTS / "rq-worker.log",
                {},
            )
            with worker:
                print("rq: drain ...", file=sys.stderr)
                report["drain"] = measure_drain(
                    worker,
                    lambda: queue.finished_job_registry.count,
                    sizes.enqueues,
                    sizes.drain_timeout,
                )
                warm_up(
                    client,
                    worker,
                    lambda: queue.enqueue_in(timedelta(seconds=0.2), "rq_bench.record", -1),
                )
                for key, jobs, seconds in (
                    ("lateness", sizes.late_jobs, sizes.late_seconds),
                    ("lateness_light", sizes.light_jobs, sizes.light_seconds),
                ):
                    print(f"rq: {key} ...", file=sys.stderr)
                    report[key] = measure_lateness(
                        client,
                        worker,
                        lambda plan: produce(queue, plan),
                        lateness_plan(jobs, seconds),
                        sizes,
                    )
        finally:
            connection.close()
    return report


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, write the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/13", help="an empty Redis db")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--json", type=Path, default=LOCAL_RESULTS / "rq.json")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    write_report(args.json, run(args.url, QUICK if args.quick else Sizes()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
