"""The client's cost of a put, and the Worker's own cost of a job, in instructions per
operation (issue 38, points 2, 4 and 5).

Run ``.venv/bin/python benchmarks/client_cost.py`` (``--paths`` chooses among
:data:`PATHS`; ``--pg`` / ``--redis`` the servers). Each path runs in a child process
under ``valgrind --tool=callgrind`` twice, with ``--small`` and ``--large``
operations after the same set-up and warm-up; the difference of the two runs'
instruction counts, divided by the difference of the operations, is the client's cost
of one operation: start-up, imports, connecting and warming up cancel out
(``--scale N``: N times both counts, so that what happens a few times a run, one
more or less in either (a collection of the garbage collector's older generations,
millions of instructions), weighs N times less a job: the memory sync worker path
moved by 4,000 a job between runs of the same code at 1, by at most 1,150 at 4, the
async one and the queue alone by at most 750). Valgrind
counts the instructions of the client process only (the server's work and the time
spent waiting for it are not in them), and the count hardly depends on what else the
machine runs, unlike a rate. The table sets each path beside its floor, the least a
client of the same server does for the same effect:

* PostgreSQL, a put one by one (``Queue.put`` of a small JSON payload, sync face;
  ``AsyncQueue.put`` too) against a plain INSERT of one row through psycopg, prepared
  (``prepare=True``), autocommit;
* Redis, a put one by one (``Queue.put``, sync face) against one ``ZADD`` per call
  through redis-py (hiredis);
* SQLite and memory, a put one by one (``Queue.put`` and ``AsyncQueue.put``), with no
  floor (they are the store);
* Redis, per message of a batch of 1000: ``App.send_many`` of task calls and
  ``Queue.put_many`` of raw items, against redis-py's pipeline
  (``transaction=False``, hiredis) of one ``ZADD`` per message;
* the worker alone, on redis and memory: due task calls drained by one in-process
  :class:`~delayq.Worker` whose handler does nothing (a sync one at concurrency 8, an
  async one at 32), less the same child's puts alone (``*-fill``, measured in the
  same way): what the Worker, its queue's reserve and ack included, costs per job.
  Its "floor" column is the fill it was taken from. The ``*-metrics`` paths: the
  same on memory with the Worker's Prometheus metrics on (``Worker(metrics=True)``).
  The ``*-otel-*`` paths (issue 42): the same with OpenTelemetry configured in the
  child after its puts, before the Worker starts: ``api`` (the trace and metrics
  APIs imported, no provider set), ``disabled`` (the SDK's providers with
  ``OTEL_SDK_DISABLED=true``: no-op), ``sampled-out`` (the SDK's tracer provider
  sampling nothing: spans made, not recorded), ``spans`` (every span exported to a
  file, BatchSpanProcessor), ``metrics`` (the SDK's meter provider, a periodic reader
  exporting to a file: the Worker's metrics reported through OpenTelemetry).
  The ``*-logged`` paths: the same with delayq's log lines set up as ``delayq worker``
  sets them up by default (INFO, text, on a line-buffered stream).

It writes JSON to ``benchmarks/results/client-cost.json``. It never asserts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, Measure, environment, print_table, write_json

#: path -> (what it measures, its floor's path or None, unit of an operation, small, large)
PATHS: dict[str, tuple[str, str | None, str, int, int]] = {
    "pg-put": ("postgresql: Queue.put one by one", "pg-floor", "put", 300, 1_300),
    "pg-put-async": ("postgresql: AsyncQueue.put one by one", "pg-floor", "put", 300, 1_300),
    "sqlite-put": ("sqlite: Queue.put one by one", None, "put", 300, 1_300),
    "sqlite-put-async": ("sqlite: AsyncQueue.put one by one", None, "put", 300, 1_300),
    "memory-put": ("memory: Queue.put one by one", None, "put", 1_000, 5_000),
    "memory-put-async": ("memory: AsyncQueue.put one by one", None, "put", 1_000, 5_000),
    "pg-floor": ("postgresql floor: psycopg prepared INSERT, autocommit", None, "put", 300, 1_300),
    "redis-put": ("redis: Queue.put one by one", "redis-put-floor", "put", 300, 1_300),
    "redis-put-floor": (
        "redis floor: one ZADD per call (redis-py, hiredis)",
        None,
        "put",
        300,
        1_300,
    ),
    "redis-send-many": (
        "redis: App.send_many, batches of 1000",
        "redis-floor",
        "message",
        2_000,
        7_000,
    ),
    "redis-put-many": (
        "redis: Queue.put_many raw items, batches of 1000",
        "redis-floor",
        "message",
        2_000,
        7_000,
    ),
    "redis-floor": (
        "redis floor: pipelined ZADD, 1000 per pipeline (redis-py, hiredis)",
        None,
        "message",
        2_000,
        7_000,
    ),
    "redis-worker-sync": ("redis: worker alone, sync no-op c8", "redis-fill", "job", 500, 2_500),
    "redis-worker-async": ("redis: worker alone, async no-op c32", "redis-fill", "job", 500, 2_500),
    "redis-queue-alone": (
        "redis: the queue alone, reserve 100 + ack_many",
        "redis-fill",
        "job",
        500,
        2_500,
    ),
    "redis-fill": ("redis: the worker's jobs put alone (send_many)", None, "job", 500, 2_500),
    "memory-worker-sync": ("memory: worker alone, sync no-op c8", "memory-fill", "job", 500, 2_500),
    "memory-worker-async": (
        "memory: worker alone, async no-op c32",
        "memory-fill",
        "job",
        500,
        2_500,
    ),
    "memory-queue-alone": (
        "memory: the queue alone, reserve 100 + ack_many",
        "memory-fill",
        "job",
        500,
        2_500,
    ),
    "memory-fill": ("memory: the worker's jobs put alone (send_many)", None, "job", 500, 2_500),
    "memory-worker-sync-metrics": (
        "memory: worker alone, sync no-op c8, metrics on",
        "memory-fill",
        "job",
        500,
        2_500,
    ),
    "memory-worker-sync-logged": (
        "memory: worker alone, sync no-op c8, logged as delayq worker logs",
        "memory-fill",
        "job",
        500,
        2_500,
    ),
    "memory-worker-async-logged": (
        "memory: worker alone, async no-op c32, logged as delayq worker logs",
        "memory-fill",
        "job",
        500,
        2_500,
    ),
    "memory-worker-async-metrics": (
        "memory: worker alone, async no-op c32, metrics on",
        "memory-fill",
        "job",
        500,
        2_500,
    ),
}
#: The OpenTelemetry set-ups of the ``*-otel-*`` paths (see the docstring).
OTEL_MODES = ("api", "disabled", "sampled-out", "spans", "metrics")
for _kind, _concurrency in (("sync", 8), ("async", 32)):
    for _mode in OTEL_MODES:
        PATHS[f"memory-worker-{_kind}-otel-{_mode}"] = (
            f"memory: worker alone, {_kind} no-op c{_concurrency}, otel {_mode}",
            "memory-fill",
            "job",
            500,
            2_500,
        )
#: The worker paths: their cost is theirs less their fill's (the puts they start with).
WORKER_PATHS = {name for name in PATHS if "-worker-" in name or "-queue-" in name}
BATCH = 1_000
WARMUP = 200
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


# -- the children: set up, warm up, then ``count`` operations --------------------------


def _puts(url: str, count: int, **options: str) -> None:
    """``Queue.put`` one by one: the warm-up, then ``count``."""
    from delayq.durable import Queue  # noqa: PLC0415

    with Queue(url, **options) as q:
        try:
            for i in range(WARMUP + count):
                q.put({"n": i})
        finally:
            q.purge()


def _put(url: str, count: int) -> None:
    _puts(url, count, name=f"cost-{uuid.uuid4().hex[:8]}")


def _put_async(url: str, count: int) -> None:
    import asyncio  # noqa: PLC0415

    from delayq.durable import AsyncQueue  # noqa: PLC0415

    async def run() -> None:
        async with AsyncQueue(url, name=f"cost-{uuid.uuid4().hex[:8]}") as q:
            try:
                for i in range(WARMUP):
                    await q.put({"n": i})
                for i in range(count):
                    await q.put({"n": i})
            finally:
                await q.purge()

    asyncio.run(run())


def _pg_floor(url: str, count: int) -> None:
    import psycopg  # noqa: PLC0415

    from delayq.backends.postgres._url import parse_url  # noqa: PLC0415

    settings = parse_url(url)
    table = f'"{settings.schema}".cost_floor_{uuid.uuid4().hex[:8]}'
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{settings.schema}"')
        conn.execute(f"CREATE TABLE {table} (n integer, payload bytea)")
        insert = f"INSERT INTO {table} VALUES (%s, %s)"
        try:
            for i in range(WARMUP):
                conn.execute(insert, (i, b'{"n":1}'), prepare=True)
            for i in range(count):
                conn.execute(insert, (i, b'{"n":1}'), prepare=True)
        finally:
            conn.execute(f"DROP TABLE {table}")


def _redis_put(url: str, count: int) -> None:
    _puts(url, count, name="cost", prefix=f"cost-{uuid.uuid4().hex[:8]}")


def _redis_put_floor(url: str, count: int) -> None:
    import redis  # noqa: PLC0415

    key = f"cost-floor-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    try:
        for i in range(WARMUP + count):
            client.zadd(key, {b"%032x" % i: i})
    finally:
        client.delete(key)
        client.close()


def _redis_send_many(url: str, count: int) -> None:
    from delayq import App  # noqa: PLC0415

    prefix = f"cost-{uuid.uuid4().hex[:8]}"
    with App(url, prefix=prefix) as app:

        @app.task(name="job", queue="cost")
        def job(n: int) -> None:
            del n

        try:
            for start in range(0, WARMUP + count, BATCH):
                app.send_many(job.message(i) for i in range(start, start + BATCH))
        finally:
            app.queue("cost").purge()


def _redis_put_many(url: str, count: int) -> None:
    from delayq.durable import Queue  # noqa: PLC0415

    with Queue(url, name="cost", prefix=f"cost-{uuid.uuid4().hex[:8]}") as q:
        try:
            for start in range(0, WARMUP + count, BATCH):
                q.put_many([{"payload": {"n": i}} for i in range(start, start + BATCH)])
        finally:
            q.purge()


def _redis_floor(url: str, count: int) -> None:
    import redis  # noqa: PLC0415

    key = f"cost-floor-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    try:
        for start in range(0, WARMUP + count, BATCH):
            pipe = client.pipeline(transaction=False)
            for i in range(start, start + BATCH):
                pipe.zadd(key, {b"%032x" % i: i})
            pipe.execute()
    finally:
        client.delete(key)
        client.close()


def _otel_setup(mode: str) -> None:
    """Configure OpenTelemetry in this child as ``mode`` (:data:`OTEL_MODES`) says."""
    from opentelemetry import metrics, trace  # noqa: PLC0415

    from delayq.durable.tracing import provider_set  # noqa: PLC0415

    if mode == "api":
        return
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        ConsoleSpanExporter,
    )
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF  # noqa: PLC0415

    out = tempfile.TemporaryFile("w")  # noqa: SIM115 (the exporters', for the process's life)
    if mode == "disabled":
        os.environ["OTEL_SDK_DISABLED"] = "true"
        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())
    elif mode == "sampled-out":
        trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_OFF))
    elif mode == "spans":
        provider = TracerProvider()
        exporter = ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    else:
        reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=out))
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    provider_set()


def _worker_child(
    kind: str,
    drain: bool,
    metrics: bool = False,
    otel: str | None = None,
    logged: bool = False,
) -> Callable[[str, int], None]:
    """A child that sends ``count`` due calls of a no-op task (``kind`` "sync",
    "async", or "queue": no worker, the queue alone), then (``drain``) runs a Worker
    (its Prometheus metrics counted with ``metrics``; OpenTelemetry set up as ``otel``
    says after the puts; with ``logged``, delayq's log lines at the level and in the
    format ``delayq worker`` writes them by default, to a line-buffered stream as its
    stderr is, here into ``os.devnull``)
    until they ended (the last one stops it, so no poll adds instructions that grow
    with the time taken), or for "queue" reserves 100 at a time and acks them with
    one ``ack_many``: what any worker of the queue does for its jobs."""

    def child(url: str, count: int) -> None:
        import asyncio  # noqa: PLC0415

        from delayq import App, Worker  # noqa: PLC0415

        prefix = f"cost-{uuid.uuid4().hex[:8]}"
        with App(url, prefix=prefix) if url.startswith("redis") else App(url) as app:
            worker: Worker | None = None
            ended = itertools.count(1)  # next() of it is one step: no thread loses one
            total = WARMUP + count if drain else 0

            def one() -> None:
                if next(ended) == total and worker is not None:
                    worker.stop()

            if kind == "async":

                @app.task(name="job", queue="cost", max_attempts=1)
                async def job_async() -> None:
                    one()

                task: Any = job_async
            else:

                @app.task(name="job", queue="cost", max_attempts=1)
                def job_sync() -> None:
                    one()

                task = job_sync
            try:
                for start in range(0, WARMUP + count, BATCH):
                    stop = min(WARMUP + count, start + BATCH)
                    app.send_many(task.message() for _ in range(start, stop))
                if kind == "queue":
                    asyncio.run(_queue_alone(app.open_queue_async("cost"), total))
                elif drain:
                    if otel is not None:
                        _otel_setup(otel)
                    if logged:
                        _cli_logging()
                    concurrency = 8 if kind == "sync" else 32
                    options = {"metrics": True} if metrics else {}
                    worker = Worker(app, concurrency=concurrency, **options)
                    asyncio.run(_serve(worker, total))
            finally:
                app.queue("cost").purge()

    return child


def _cli_logging() -> None:
    """delayq's log lines as ``delayq worker`` sets them up (INFO, text), written to
    ``os.devnull`` through a line-buffered text stream, like a redirected stderr."""
    from delayq.cli._worker import configure_logging  # noqa: PLC0415

    sys.stderr = open(os.devnull, "w", buffering=1)  # noqa: SIM115 (the child's whole life)
    configure_logging("info")


async def _queue_alone(queue: Any, total: int) -> None:
    try:
        got = 0
        while got < total:
            msgs = await queue.reserve(max=100, wait=0)
            got += len(msgs)
            await queue.ack_many(msgs)
    finally:
        await queue.close()


async def _serve(worker: Any, total: int) -> None:
    await worker.serve()  # until the last job stops it
    if worker.counts["succeeded"] != total:
        raise SystemExit(f"{worker.counts['succeeded']} of {total} jobs succeeded")


CHILDREN: dict[str, Callable[[str, int], None]] = {
    "pg-put": _put,
    "pg-put-async": _put_async,
    "sqlite-put": _put,
    "sqlite-put-async": _put_async,
    "memory-put": _put,
    "memory-put-async": _put_async,
    "pg-floor": _pg_floor,
    "redis-put": _redis_put,
    "redis-put-floor": _redis_put_floor,
    "redis-send-many": _redis_send_many,
    "redis-put-many": _redis_put_many,
    "redis-floor": _redis_floor,
    "redis-worker-sync": _worker_child("sync", drain=True),
    "redis-worker-async": _worker_child("async", drain=True),
    "redis-queue-alone": _worker_child("queue", drain=True),
    "redis-fill": _worker_child("sync", drain=False),
    "memory-worker-sync": _worker_child("sync", drain=True),
    "memory-worker-async": _worker_child("async", drain=True),
    "memory-queue-alone": _worker_child("queue", drain=True),
    "memory-fill": _worker_child("sync", drain=False),
    "memory-worker-sync-metrics": _worker_child("sync", drain=True, metrics=True),
    "memory-worker-sync-logged": _worker_child("sync", drain=True, logged=True),
    "memory-worker-async-logged": _worker_child("async", drain=True, logged=True),
    "memory-worker-async-metrics": _worker_child("async", drain=True, metrics=True),
    **{
        f"memory-worker-{kind}-otel-{mode}": _worker_child(kind, drain=True, otel=mode)
        for kind in ("sync", "async")
        for mode in OTEL_MODES
    },
}


# -- the parent: callgrind runs and the table -----------------------------------------


def instructions(path: str, url: str, count: int) -> int:
    """The instructions (callgrind's total ``Ir``) of a child running ``path``."""
    with tempfile.TemporaryDirectory(prefix="delayq-cost-") as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            path,
            "--url",
            url,
            "--count",
            str(count),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(command, check=True, env=env, capture_output=True)
        match = re.search(r"^totals:\s*(\d+)", out.read_text(), re.MULTILINE)
        if match is None:
            raise SystemExit(f"no totals in callgrind's output for {path}")
        return int(match.group(1))


def per_operation(path: str, url: str, scale: int = 1) -> float:
    """Instructions of one operation of ``path``: the difference of a large and a
    small run (each ``scale`` times its operations) over the difference of their
    operations."""
    _, _, _, small, large = PATHS[path]
    small, large = small * scale, large * scale
    return (instructions(path, url, large) - instructions(path, url, small)) / (large - small)


def _url(path: str, pg: str, redis: str, scratch: str) -> str:
    """The URL a child of ``path`` runs on (SQLite: a new file in ``scratch``)."""
    if path.startswith("sqlite"):
        return f"sqlite:///{scratch}/{path}-{uuid.uuid4().hex[:8]}.db"
    if path.startswith("memory"):
        return "memory://"
    return pg if path.startswith("pg") else redis


def main(argv: list[str] | None = None) -> int:
    """Parse arguments; a child runs its path, the parent measures and reports."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--paths", default=",".join(PATHS), help=f"among {', '.join(PATHS)}")
    parser.add_argument("--pg", default=os.environ.get("DELAYQ_BENCH_PG", DEFAULT_PG))
    parser.add_argument("--redis", default=os.environ.get("DELAYQ_BENCH_REDIS", DEFAULT_REDIS))
    parser.add_argument("--json", type=Path, help="where to write the JSON results")
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="times the operations of each run: what happens a few times a run (a "
        "collection of the garbage collector's older generations) weighs that much "
        "less a job",
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        CHILDREN[args.child](args.url, args.count)
        return 0

    chosen = [name.strip() for name in args.paths.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in PATHS]
    if unknown:
        raise SystemExit(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    # A floor is measured with every path held to it.
    wanted = list(dict.fromkeys(chosen + [PATHS[n][1] for n in chosen if PATHS[n][1]]))
    env = environment()
    started = time.perf_counter()
    costs: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="delayq-cost-") as scratch:
        for name in wanted:
            url = _url(name, args.pg, args.redis, scratch)
            print(f"{name} ...", file=sys.stderr, flush=True)
            costs[name] = per_operation(name, url, args.scale)
    measures: list[Measure] = []
    for name in wanted:
        about, floor, unit, _, _ = PATHS[name]
        note, cost = "", costs[name]
        if name in WORKER_PATHS:
            assert floor is not None
            cost -= costs[floor]
            note = f"{costs[name]:,.0f} less its puts' {costs[floor]:,.0f}"
        elif floor is not None:
            note = f"{cost / costs[floor]:.2f}x the floor's"
        measures.append(Measure(name, about, cost, f"instructions/{unit}", note=note))
    total = time.perf_counter() - started
    print_table(
        f"delayq client cost, callgrind instructions per operation, scale {args.scale} "
        f"({total:.0f} s)",
        measures,
    )
    write_json(
        args.json or RESULTS_DIR / "client-cost.json",
        {
            "benchmark": "client_cost",
            "environment": env,
            "total_seconds": total,
            "scale": args.scale,
        },
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
