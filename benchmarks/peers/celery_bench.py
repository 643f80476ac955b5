"""Celery on RabbitMQ with quorum queues and native delayed delivery: enqueue (one by
one, and from 16 threads at once), drain and lateness (see ``_harness`` for the
method), on the same RabbitMQ as delayq's ``amqp://`` benchmark (``celery_vs.py`` runs
both in one run). The drain runs 20,000 jobs (1,000 with ``--quick``) through the
worker: those of the two enqueue measures, topped up from 16 threads.

Runs inside ``benchmarks/peers/.venv-celery``, made from ``celery-requirements.txt``
(see README.md)::

    benchmarks/peers/.venv-celery/bin/python benchmarks/peers/celery_bench.py \\
        --broker amqp://guest:guest@127.0.0.1:5672// --redis redis://127.0.0.1:6379/14

Settings: Celery's defaults, but for what native delayed delivery needs (Celery's
documentation of quorum queues): ``task_default_queue_type = "quorum"``, a topic
exchange for the default queue (the delay ladder cannot route to a direct one) and
``confirm_publish``. The worker is ``celery worker`` (prefork pool, one child per
core). A delayed job is ``apply_async(countdown=...)``: kombu spells the countdown's
whole seconds in binary across 28 TTL queues (``celery_delayed_0..27``), and a
countdown under one second raises ``ValueError("countdown must be a positive number")``
(Celery 5.7.0, ``int(countdown)`` is 0), so a delay under a second is rounded up to
one second here: the only way to ask Celery for it without being early. Lateness is
still measured from the delay asked for (so a 200 ms job is ~800 ms late by design). Redis (an
empty database) only records when each job ran; it is flushed afterwards, and every
exchange and queue the run declared on the broker is deleted.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
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
    produce_records,
    record_line,
    sizes_dict,
    stop_on_sigterm,
    warm_up,
    write_report,
)
from celery import Celery
from kombu import Connection

QUEUE = "peers-bench-celery"
DONE_KEY = "peers-bench:done"
PRODUCERS = 16  # durable.py's concurrent producers
#: Jobs the drain runs through the worker (issue 18: 20,000, as delayq's drain), and
#: how long it may take (a loaded machine drained a few hundred a second).
DRAIN_JOBS, QUICK_DRAIN_JOBS = 20_000, 1_000
DRAIN_TIMEOUT = 600.0
BROKER_ENV, REDIS_ENV = "CELERY_BENCH_BROKER", "CELERY_BENCH_REDIS"
DEFAULTS = {
    "task_default_queue_type": "quorum (native delayed delivery needs it)",
    "default exchange": "topic (the delay ladder does not route to a direct one)",
    "broker_transport_options": "confirm_publish = True",
    "worker": "celery worker: prefork pool, concurrency = CPU count, prefetch multiplier 4",
    "delayed jobs": "apply_async(countdown=ceil(delay)): whole seconds through 28 TTL queues"
    " (a countdown under 1 s raises ValueError)",
}

app = Celery("celery_bench", broker=os.environ.get(BROKER_ENV, "amqp://guest:guest@127.0.0.1//"))
app.conf.update(
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_exchange_type="topic",
    task_default_routing_key=QUEUE,
    task_default_queue_type="quorum",
    broker_transport_options={"confirm_publish": True},
)
_records: redis.Redis | None = None


def records() -> redis.Redis:
    global _records
    if _records is None:
        _records = redis.Redis.from_url(os.environ[REDIS_ENV])
    return _records


@app.task(name="noop")
def noop() -> None:
    """The drain job: counts itself done."""
    records().incr(DONE_KEY)


@app.task(name="record")
def record(seq: int) -> None:
    """The lateness job: push its sequence number and start time."""
    records().rpush(RECORD_KEY, record_line(seq, time.time()))


def enqueue_many(count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        noop.apply_async()
    return count / (time.perf_counter() - started)


def enqueue_concurrently(count: int, threads: int = PRODUCERS) -> float:
    """Jobs per second from ``threads`` threads that each enqueue one by one at once
    (``apply_async`` shares Celery's producer pool, ``broker_pool_limit`` = 10)."""

    def some() -> None:
        for _ in range(count // threads):
            noop.apply_async()

    with ThreadPoolExecutor(threads) as pool:
        started = time.perf_counter()
        for future in [pool.submit(some) for _ in range(threads)]:
            future.result()
        return threads * (count // threads) / (time.perf_counter() - started)


def top_up(count: int, threads: int = PRODUCERS) -> None:
    """Queue ``count`` more drain jobs from ``threads`` threads at once (not timed:
    the drain's jobs past those of the two enqueue measures)."""

    def some(share: int) -> None:
        for _ in range(share):
            noop.apply_async()

    shares = [count // threads + (i < count % threads) for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(some, share) for share in shares]:
            future.result()


def enqueue_record(seq: int, delay: float) -> float:
    """Enqueue ``record(seq)`` due in ``delay`` seconds; its due time (epoch s)."""
    due = time.time() + delay
    if delay:
        record.apply_async((seq,), countdown=math.ceil(delay))
    else:
        record.apply_async((seq,))
    return due


def produce(plan: list[tuple[float, float]]) -> dict[int, float]:
    return produce_records(enqueue_record, plan)


def wait_for_ladder(broker: str, worker: WorkerProcess, timeout: float = 60.0) -> None:
    """Wait until the worker has declared the delay ladder (a delayed publish before
    that fails: no exchange ``celery_delayed_27``) and its queue."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with Connection(broker) as connection:
                channel = connection.channel()
                channel.exchange_declare("celery_delayed_27", "topic", passive=True)
                channel.queue_declare(QUEUE, passive=True)
                break
        except Exception:
            worker.check_alive()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    # The ladder's last exchange is bound to the queue's a moment after the ladder is
    # declared (a job sent in between is dropped at the end of its delay): let it be.
    time.sleep(2.0)


def clean_broker(broker: str) -> None:
    """Delete what Celery declared for this run: its queue and exchange, the delay
    ladder (``celery_delayed_*``), the event and remote-control exchanges."""
    with Connection(broker) as connection:
        channel = connection.channel()
        queues = [QUEUE, *(f"celery_delayed_{level}" for level in range(28))]
        exchanges = [
            QUEUE,
            *(f"celery_delayed_{level}" for level in range(28)),
            "celery_delayed_delivery",
            "celeryev",
            "celery.pidbox",
            "reply.celery.pidbox",
        ]
        for name in queues:
            channel.queue_delete(name)
        for name in exchanges:
            channel.exchange_delete(name)


def run(broker: str, url: str, sizes: Sizes, drain_jobs: int) -> dict[str, Any]:
    report: dict[str, Any] = {
        "peer": "celery",
        "version": version("celery"),
        "kombu": version("kombu"),
        "broker": broker.rsplit("@", maxsplit=1)[-1],
        "defaults": DEFAULTS,
        "sizes": {**sizes_dict(sizes), "drain_jobs": drain_jobs, "drain_timeout": DRAIN_TIMEOUT},
    }
    env = {BROKER_ENV: broker, REDIS_ENV: url}
    os.environ.update(env)
    with private_db(url) as client:
        try:
            # The drain's jobs wait in the queue before the worker starts (as rq's and
            # arq's do); the queue is declared as the worker would declare it.
            with app.connection_for_write() as connection:
                app.amqp.queues[QUEUE].bind(connection.default_channel).declare()
            print("celery: enqueue ...", file=sys.stderr)
            report["enqueue_per_second"] = enqueue_many(sizes.enqueues)
            print(f"celery: enqueue from {PRODUCERS} threads ...", file=sys.stderr)
            report["producers_16_per_second"] = enqueue_concurrently(sizes.enqueues)
            queued = sizes.enqueues + PRODUCERS * (sizes.enqueues // PRODUCERS)
            if queued < drain_jobs:
                print(
                    f"celery: queue {drain_jobs - queued} more for the drain ...", file=sys.stderr
                )
                top_up(drain_jobs - queued)
                queued = drain_jobs
            worker = WorkerProcess(
                [
                    str(Path(sys.executable).with_name("celery")),
                    "-A",
                    "celery_bench",
                    "worker",
                    "--loglevel=INFO",
                    "-Q",
                    QUEUE,
                ],
                LOCAL_RESULTS / "celery-worker.log",
                env,
            )
            with worker:
                print("celery: drain ...", file=sys.stderr)
                report["drain"] = measure_drain(
                    worker,
                    lambda: int(client.get(DONE_KEY) or 0),
                    queued,
                    DRAIN_TIMEOUT,
                )
                # The worker declares the delay ladder and binds the queue to it; a
                # delayed job sent before that is dropped at the end of its delay.
                wait_for_ladder(broker, worker)
                warm_up(client, worker, lambda: record.apply_async((-1,), countdown=1))
                for key, jobs, seconds in (
                    ("lateness", sizes.late_jobs, sizes.late_seconds),
                    ("lateness_light", sizes.light_jobs, sizes.light_seconds),
                ):
                    print(f"celery: {key} ...", file=sys.stderr)
                    report[key] = measure_lateness(
                        client, worker, produce, lateness_plan(jobs, seconds), sizes
                    )
        finally:
            clean_broker(broker)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--broker", default="amqp://guest:guest@127.0.0.1:5672//")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14", help="an empty Redis db")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--json", type=Path, default=LOCAL_RESULTS / "celery.json")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    sizes, drain_jobs = (QUICK, QUICK_DRAIN_JOBS) if args.quick else (Sizes(), DRAIN_JOBS)
    write_report(args.json, run(args.broker, args.redis, sizes, drain_jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
