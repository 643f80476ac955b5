"""Benchmark of the Worker with real handlers (issue 20): drain rate against the
handler's own floor, lateness through the worker, and ``--processes``.

Run ``.venv/bin/python benchmarks/worker.py`` (redis on ``$DELAYQ_BENCH_REDIS``,
default ``redis://127.0.0.1:6379/0``, under a unique key prefix removed afterwards,
and sqlite in a temporary directory), or ``--url URL`` for one backend; ``--quick``
makes every section smaller. The handlers' own Redis work goes to that same Redis,
to a key of their own (deleted afterwards). Sections:

a. Drain: ``jobs`` due tasks of an :class:`~delayq.App`, drained by one in-process
   :class:`~delayq.Worker`, for each handler and concurrency: ``sync-rpush`` (one
   ``redis.Redis.rpush``), ``async-rpush`` (one ``await redis.asyncio.Redis.rpush``)
   and ``cpu`` (about 1 ms of pure Python, sync). jobs/s = (completions - 1) /
   seconds from the first handler completion to the last; CPU/job, the process's CPU
   time (every thread) per job from the start of ``serve`` to the last job's end (the
   least noisy measure on a loaded machine); and the CPU time of the worker's
   event-loop thread per job (the one thread every message goes through).
b. Floor, in the same run: the same handler in a bare loop without any queue, at
   the same concurrency (threads sharing one redis-py client; asyncio tasks sharing
   one redis.asyncio client; a lone thread; cpu: a lone thread, the GIL's bound).
   The drain's ratio to its floor is what issue 20 holds to >= 70% on redis://
   (sync-rpush at 8 threads, async-rpush at 32 tasks). With ``--repeat N`` the
   floor and the drain alternate N times and the best of each is shown. Also the
   sync-rpush handler from a lone thread, the queue alone (reserve 100 + ack_many, no
   handler) and the two added up: where both are CPU-bound (one process, the GIL),
   a worker cannot beat that sum. And the worker alone: the same drain with a
   handler that does nothing (sync at concurrency 8, async at 32), whose CPU/job is
   the Worker's own cost per job, the queue's included (the least noisy measure of
   it: no handler threads contend for the GIL). The floor's CPU/job is its process's
   CPU time per call. "CPU bound / floor" is 1 / (the worker's CPU/job) over the floor's rate: the
   most the worker could reach with a whole CPU to itself (one process runs its
   Python one thread at a time), so a worker whose CPU/job is above 1 / (0.70 x
   floor) cannot reach 0.70x, whatever the load.
c. Lateness: 2000 jobs due one every 5 ms over 10 s, put ahead of time, handler =
   one sync ``rpush`` (concurrency 8): handler start minus the message's due time,
   p50/p99/max in ms; lost, duplicated and early must be 0. In the same run, the
   queue alone: the same jobs and handler in a bare loop without a Worker (``await
   reserve(max=8, wait=...)``, the handler called inline for each, then ``ack_many``),
   so the table shows what the Worker adds over what the queue's wake-up costs.
d. Processes: the cpu handler drained by ``delayq worker --processes N`` (a
   subprocess) for N = 1 and 2; "n/a" when this tree's ``delayq worker`` has no
   ``--processes`` option. jobs/s from the first job gone from the queue to the last,
   and over the middle 80% of the jobs (no start-up, no tail of one process ending
   its prefetched jobs while the other is done). Its floor, in the same run: the
   same handler in a bare loop (no queue, no worker) in 1 process, then in 2
   processes at once sharing the jobs, while this process polls the queue's stats as
   it does during a drain; jobs/s from the first process's start to the last one's
   end. The floor's "2 processes / 1 process" is what this machine allows the
   Worker's ratio (its cores also run Redis and the other servers); with
   ``--repeat N`` the floor and the drain alternate N times, the best of each shown.

t. Tracing (issue 42): the worker alone (sync-noop c8, async-noop c32) with tracing
   off (the OpenTelemetry API imported, no provider set), with a no-op SDK (the SDK's
   provider with ``OTEL_SDK_DISABLED=true``: its tracers make no span), with the SDK
   sampling nothing (``ALWAYS_OFF``: spans not recorded, the context still carried)
   and with the SDK exporting every span to a file (BatchSpanProcessor, one JSON
   span a line). Each run is a process of its own (the global provider is set once a
   process), the modes alternated ``--repeat`` times, the best of each shown with
   its ratio to "off" in the same run; the target is no-op within 5% of off. The
   messages are put by the same process before the drain (the drain's clock starts at
   the first handler's end), so the put's own span is not in the figure. Two more
   modes hold the metrics to "off" alike: ``prometheus`` (``Worker(metrics=True)``)
   and ``otel-metrics`` (the SDK's meter provider, a periodic reader exporting to a
   file: the Worker's metrics reported through OpenTelemetry). With
   ``--trace-baseline SRC`` (another tree's ``src/``, e.g. main's), that tree's worker
   runs too ("before"), and "off" is held to 5% of it.
m. Metrics: the worker alone (sync no-op c8, async no-op c32) and sync-rpush c8
   drained with ``Worker(metrics=True)`` (the Prometheus metrics of ``delayq worker
   --metrics-port``, counted, not scraped) and without, alternated ``--repeat`` times
   (3 at least) in one run; jobs/s (best) and CPU/job (least) of each, and on / off.
   The CPU/job ratio is held to within 5% (the least noisy figure on a loaded box).

It prints a table (measure, target, PASS/MISS) and writes JSON to
``benchmarks/results/worker[-<scheme>][-quick].json``. It never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio

from _common import (
    Measure,
    bench_urls,
    console,
    environment,
    gc_frozen,
    parse_sections,
    percentile,
    print_table,
    result_path,
    shown,
    write_json,
)
from delayq import App, Worker, current_message
from delayq.durable.message import Message
from delayq.durable.queue import AsyncQueue

REDIS = os.environ.get("DELAYQ_BENCH_REDIS", "redis://127.0.0.1:6379/0")
#: (handler, concurrency) pairs of sections a and b; the two held to a target first.
CASES = [("sync-rpush", 8), ("async-rpush", 32), ("sync-rpush", 32), ("async-rpush", 8), ("cpu", 8)]
TARGETS = {("sync-rpush", 8), ("async-rpush", 32)}
#: Least share of the floor the drain must reach (issue 20).
FLOOR_SHARE = 0.70
#: The sections: a (drain, with b, the floors), c (lateness), d (processes), m (metrics),
#: t (tracing).
SECTIONS = ("a", "c", "d", "m", "t")
#: Most CPU/job the Worker's metrics may add (m).
METRICS_CPU_SHARE = 1.05
#: A drain fails when nothing completes for this long (seconds).
STALL_SECONDS = 30.0


@dataclass
class Sizes:
    """How much each section does."""

    jobs: int = 20_000
    cpu_jobs: int = 4_000
    late_jobs: int = 2_000
    late_every_ms: int = 5
    processes_jobs: int = 6_000


QUICK = Sizes(jobs=4_000, cpu_jobs=1_000, late_jobs=400, processes_jobs=1_500)


# -- the handlers' work ----------------------------------------------------------------
def calibrate_cpu(target: float = 0.001) -> int:
    """Loop count of :func:`burn` that takes about ``target`` seconds here."""
    loops = 10_000
    while True:
        took = min(_timed(loops) for _ in range(5))  # the least disturbed of five
        if took > 0.02:
            return max(1, int(loops * target / took))
        loops *= 2


def _timed(loops: int) -> float:
    started = time.perf_counter()
    burn(loops)
    return time.perf_counter() - started


def burn(loops: int) -> int:
    """Pure Python work: ``loops`` additions."""
    total = 0
    for i in range(loops):
        total += i
    return total


class Sink:
    """A Redis list of the handlers' own (one per run), deleted afterwards."""

    def __init__(self) -> None:
        self.key = f"delayq-bench-worker-sink-{uuid.uuid4().hex[:8]}"
        self.client = redis.Redis.from_url(REDIS)

    def delete(self) -> None:
        self.client.delete(self.key)

    def close(self) -> None:
        self.delete()
        self.client.close()


@contextmanager
def bench_app(url: str, queue: str) -> Iterator[tuple[App, Sink]]:
    """An App on ``url`` and a Sink; the queue purged and both closed afterwards."""
    app, sink = App(url), Sink()
    try:
        yield app, sink
    finally:
        try:
            app.queue(queue).purge()
        finally:
            app.close()
            sink.close()


# -- a, b: drain and floor -------------------------------------------------------------
def drain(
    url: str, kind: str, concurrency: int, jobs: int, loops: int, *, metrics: bool = False
) -> dict[str, Any]:
    """``jobs`` due calls of a ``kind`` task drained by one Worker (its metrics on with
    ``metrics``); its measures."""
    queue = f"delayq-bench-worker-{uuid.uuid4().hex[:8]}"
    with bench_app(url, queue) as (app, sink):
        return _drain(app, sink, queue, kind, concurrency, jobs, loops, metrics)


def _drain(
    app: App,
    sink: Sink,
    queue: str,
    kind: str,
    concurrency: int,
    jobs: int,
    loops: int,
    metrics: bool = False,
) -> dict[str, Any]:
    ends: list[float] = []
    holder: dict[str, redis.asyncio.Redis] = {}
    if kind == "async-rpush":

        @app.task(name="job", queue=queue, max_attempts=1)
        async def async_job() -> None:
            await holder["client"].rpush(sink.key, b"x")
            ends.append(time.perf_counter())

        task: Any = async_job
    elif kind == "sync-rpush":

        @app.task(name="job", queue=queue, max_attempts=1)
        def sync_job() -> None:
            sink.client.rpush(sink.key, b"x")
            ends.append(time.perf_counter())

        task = sync_job
    elif kind == "sync-noop":

        @app.task(name="job", queue=queue, max_attempts=1)
        def sync_noop() -> None:
            ends.append(time.perf_counter())

        task = sync_noop
    elif kind == "async-noop":

        @app.task(name="job", queue=queue, max_attempts=1)
        async def async_noop() -> None:
            ends.append(time.perf_counter())

        task = async_noop
    else:

        @app.task(name="job", queue=queue, max_attempts=1)
        def cpu_job() -> None:
            burn(loops)
            ends.append(time.perf_counter())

        task = cpu_job
    for start in range(0, jobs, 1000):
        app.send_many(task.message() for _ in range(start, min(jobs, start + 1000)))
    worker = Worker(app, concurrency=concurrency, metrics=metrics)
    loop_cpu, process_cpu = asyncio.run(_serve_until(worker, jobs, holder))
    seconds = ends[-1] - ends[0] if len(ends) > 1 else 0.0
    rate = (len(ends) - 1) / seconds if seconds > 0 else 0.0
    return {
        "jobs": jobs,
        "completed": len(ends),
        "seconds": seconds,
        "rate": rate,
        "loop_cpu_us": loop_cpu * 1e6 / max(len(ends), 1),
        "cpu_us": process_cpu * 1e6 / max(len(ends), 1),
    }


def process_cpu() -> float:
    """CPU seconds this process used so far, every thread (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _serve_until(worker: Worker, jobs: int, holder: dict[str, Any]) -> tuple[float, float]:
    """Serve until ``jobs`` ended; the CPU seconds of the loop's thread meanwhile, and
    of the process until the last job ended (its stop left out)."""
    holder["client"] = redis.asyncio.Redis.from_url(REDIS)
    await holder["client"].ping()  # connected before the count starts
    cpu, process = time.thread_time(), process_cpu()
    process_used = 0.0
    serving = asyncio.create_task(worker.serve())
    done, since = -1, time.monotonic()
    try:
        while not serving.done():
            await asyncio.wait({serving}, timeout=0.02)
            ended = worker.counts["succeeded"] + worker.counts["dead"]
            if ended >= jobs:
                process_used = process_used or process_cpu() - process
                worker.stop()
            elif ended != done:
                done, since = ended, time.monotonic()
            elif time.monotonic() - since > STALL_SECONDS:
                worker.stop(graceful=False)
        await serving
        return time.thread_time() - cpu, process_used or process_cpu() - process
    finally:
        await holder["client"].aclose()


def floor(kind: str, concurrency: int, jobs: int, loops: int) -> tuple[float, float]:
    """Calls per second of the ``kind`` handler in a bare loop, no queue, and the
    process's CPU time per call (microseconds)."""
    sink = Sink()
    try:
        if kind == "async-rpush":
            return asyncio.run(_async_floor(sink.key, concurrency, jobs))
        if kind == "cpu":
            return _thread_floor(lambda: burn(loops), 1, jobs)
        return _thread_floor(lambda: sink.client.rpush(sink.key, b"x"), concurrency, jobs)
    finally:
        sink.close()


def _thread_floor(call: Callable[[], object], threads: int, jobs: int) -> tuple[float, float]:
    each = jobs // threads
    start = threading.Barrier(threads + 1)

    def loop() -> None:
        start.wait()
        for _ in range(each):
            call()

    pool = [threading.Thread(target=loop) for _ in range(threads)]
    for thread in pool:
        thread.start()
    cpu = process_cpu()
    start.wait()
    started = time.perf_counter()
    for thread in pool:
        thread.join()
    calls = each * threads
    return calls / (time.perf_counter() - started), (process_cpu() - cpu) * 1e6 / calls


async def _async_floor(key: str, tasks: int, jobs: int) -> tuple[float, float]:
    client = redis.asyncio.Redis.from_url(REDIS)
    each = jobs // tasks

    async def loop() -> None:
        for _ in range(each):
            await client.rpush(key, b"x")

    try:
        await client.ping()
        cpu = process_cpu()
        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(tasks)))
        calls = each * tasks
        return calls / (time.perf_counter() - started), (process_cpu() - cpu) * 1e6 / calls
    finally:
        await client.aclose()


def section_drain(
    url: str, redis_url: bool, sizes: Sizes, loops: int, repeat: int
) -> list[Measure]:
    measures = []
    for kind, concurrency in CASES:
        jobs = sizes.cpu_jobs if kind == "cpu" else sizes.jobs
        label = f"{kind} c{concurrency}"
        console.print(f"  {label}: floor, worker (best of {repeat}) ...", style="dim")
        floors, runs = [], []
        for _ in range(repeat):  # alternated: a load that comes and goes hits both
            floors.append(floor(kind, concurrency, jobs, loops))
            runs.append(drain(url, kind, concurrency, jobs, loops))
        bare = max(rate for rate, _ in floors)
        floor_cpu = min(cpu for _, cpu in floors)
        run = max(runs, key=lambda r: r["rate"])
        run["all_rates"], run["all_floors"] = [r["rate"] for r in runs], floors
        worker_cpu = min(r["cpu_us"] for r in runs)
        run["all_cpu_us"] = [r["cpu_us"] for r in runs]
        bound = 1e6 / worker_cpu / bare if worker_cpu and bare else 0.0
        share = run["rate"] / bare if bare else 0.0
        held = redis_url and (kind, concurrency) in TARGETS
        lost = jobs - run["completed"]
        measures.append(
            Measure("b", f"floor {label} (bare loop)", bare, "items/s",
                    note=_floor_note(kind), cpu_per_job=floor_cpu)
        )  # fmt: skip
        measures.append(
            Measure(
                "a",
                f"worker {label}",
                run["rate"],
                "items/s",
                note=f"{share:.0%} of the floor" + (f", {lost} not completed" if lost else ""),
                extra=run,
                cpu_per_job=worker_cpu,
            )
        )
        measures.append(
            Measure(
                "a",
                f"worker {label}: the loop's CPU per job",
                run["loop_cpu_us"],
                "us",
                note="thread time of the event loop's thread / jobs (best run)",
            )
        )
        measures.append(
            Measure(
                "a",
                f"worker {label}: CPU bound / floor",
                bound,
                "x",
                note="(1e6 / worker CPU/job) / floor: the most one process's CPU allows",
            )
        )
        measures.append(
            Measure(
                "a",
                f"worker {label} / floor",
                share,
                "x",
                target=f">= {FLOOR_SHARE:.2f}x" if held else "",
                passed=(share >= FLOOR_SHARE and not lost) if held else None,
            )
        )
    return sorted(measures, key=lambda m: m.section)


def section_bound(url: str, sizes: Sizes) -> list[Measure]:
    """What one process can do at best with a sync rpush handler: the lone-thread
    floor, the queue alone (reserve 100 + ack_many, no handler), and both added up;
    and the worker alone (a handler that does nothing): the Worker's own CPU/job."""
    lone, lone_cpu = floor("sync-rpush", 1, sizes.jobs, 0)
    raw = asyncio.run(_queue_alone(url, sizes.jobs))
    both = 1.0 / (1.0 / lone + 1.0 / raw) if lone and raw else 0.0
    measures = [
        Measure("b", "floor sync-rpush c1 (a lone thread)", lone, "items/s",
                cpu_per_job=lone_cpu),
        Measure("b", "queue alone: reserve 100 + ack_many", raw, "items/s", note="no handler"),
        Measure("b", "both, one after the other", both, "items/s",
                note="1 / (1/lone thread + 1/queue alone): one process, one CPU's worth"),
    ]  # fmt: skip
    for kind, concurrency in (("sync-noop", 8), ("async-noop", 32)):
        run = drain(url, kind, concurrency, sizes.jobs, 0)
        measures.append(
            Measure("b", f"worker alone: {kind} c{concurrency}", run["rate"], "items/s",
                    note=f"no handler work: the Worker's own CPU/job (loop thread "
                    f"{run['loop_cpu_us']:.1f} us)", extra=run, cpu_per_job=run["cpu_us"])
        )  # fmt: skip
    return measures


async def _queue_alone(url: str, jobs: int) -> float:
    queue = AsyncQueue(url, name=f"delayq-bench-worker-raw-{uuid.uuid4().hex[:8]}")
    try:
        item = {"payload": {"task": "job", "args": [], "kwargs": {}}}
        for start in range(0, jobs, 1000):
            await queue.put_many([item] * (min(jobs, start + 1000) - start))
        started, got = time.perf_counter(), 0
        while got < jobs:
            msgs = await queue.reserve(max=100, wait=0)
            got += len(msgs)
            await queue.ack_many(msgs)
        return jobs / (time.perf_counter() - started)
    finally:
        await queue.purge()
        await queue.close()


def _floor_note(kind: str) -> str:
    if kind == "cpu":
        return "one thread (the GIL)"
    if kind == "async-rpush":
        return "asyncio tasks, one client"
    return "threads, one shared client"


# -- m: metrics on and off --------------------------------------------------------------
def section_metrics(url: str, sizes: Sizes, repeat: int) -> list[Measure]:
    """The Worker with its metrics off and on, alternated in one run."""
    measures = []
    for kind, concurrency in (("sync-noop", 8), ("async-noop", 32), ("sync-rpush", 8)):
        label = f"{kind} c{concurrency}"
        console.print(f"  {label}: metrics off, on (x{max(repeat, 3)}) ...", style="dim")
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(max(repeat, 3)):
            for metrics in (False, True):
                runs[metrics].append(drain(url, kind, concurrency, sizes.jobs, 0, metrics=metrics))
        rate = {on: max(r["rate"] for r in runs[on]) for on in runs}
        cpu = {on: min(r["cpu_us"] for r in runs[on]) for on in runs}
        for on in (False, True):
            measures.append(
                Measure("m", f"worker {label}, metrics {'on' if on else 'off'}", rate[on],
                        "items/s", cpu_per_job=cpu[on],
                        extra={"rates": [r["rate"] for r in runs[on]],
                               "cpu_us": [r["cpu_us"] for r in runs[on]]})
            )  # fmt: skip
        ratio = cpu[True] / cpu[False] if cpu[False] else 0.0
        measures.append(
            Measure("m", f"worker {label}: CPU/job on / off", ratio, "x",
                    target=f"<= {METRICS_CPU_SHARE:.2f}x", passed=0 < ratio <= METRICS_CPU_SHARE,
                    note=f"jobs/s on / off {rate[True] / rate[False]:.3f}x (best of each)"
                    if rate[False] else "")
        )  # fmt: skip
    return measures


# -- c: lateness -----------------------------------------------------------------------
def section_lateness(url: str, sizes: Sizes) -> list[Measure]:
    measures = []
    for name, run in (("queue alone", _bare_lateness_run), ("worker", _lateness_run)):
        queue = f"delayq-bench-worker-late-{uuid.uuid4().hex[:8]}"
        with bench_app(url, queue) as (app, sink):
            seen = run(app, sink, queue, sizes)
        measures += _lateness_measures(seen, sizes.late_jobs, sizes.late_every_ms, name)
    by_name = {measure.name: measure.value for measure in measures}
    added = [by_name[f"lateness {q} (worker)"] - by_name[f"lateness {q} (queue alone)"]
             for q in ("p50", "p99")]  # fmt: skip
    measures.append(
        Measure("c", "lateness p50 the worker adds", added[0], "ms",
                note=f"p99 {added[1]:+.2f} ms: the queue alone's p99 is the worker's floor")
    )  # fmt: skip
    return measures


LATE_LEAD_MS = 1500


def _late_jobs(
    app: App, sink: Sink, queue: str, sizes: Sizes
) -> tuple[list[tuple[str, float]], Callable[[Message], None]]:
    """Put the jobs of section c: the list each handler call adds (id, lateness ms)
    to, and the handler (what the task does with its message)."""
    seen: list[tuple[str, float]] = []

    def handler(msg: Message) -> None:
        seen.append((msg.id, time.time() * 1000.0 - msg.due_at))
        sink.client.rpush(sink.key, b"x")

    @app.task(name="late", queue=queue, max_attempts=1)
    def late() -> None:
        handler(current_message())

    n, every = sizes.late_jobs, sizes.late_every_ms
    app.send_many(late.message(delay=(LATE_LEAD_MS + i * every) / 1000.0) for i in range(n))
    return seen, handler


def _bare_lateness_run(app: App, sink: Sink, queue: str, sizes: Sizes) -> list[tuple[str, float]]:
    """The jobs of section c in a bare loop: reserve, the handler inline, ack_many."""
    seen, handler = _late_jobs(app, sink, queue, sizes)
    span = (LATE_LEAD_MS + sizes.late_jobs * sizes.late_every_ms) / 1000.0

    async def run() -> None:
        handle = app.open_queue_async(queue)
        try:
            deadline = time.monotonic() + span + 15.0
            while len(seen) < sizes.late_jobs and time.monotonic() < deadline:
                msgs = await handle.reserve(max=8, wait=1.0)
                for msg in msgs:
                    handler(msg)
                if msgs:
                    await handle.ack_many(msgs)
            for msg in await handle.reserve(max=100, wait=0.3):  # a duplicate would come now
                handler(msg)
        finally:
            await handle.close()

    asyncio.run(run())
    return seen


def _lateness_run(app: App, sink: Sink, queue: str, sizes: Sizes) -> list[tuple[str, float]]:
    seen, _ = _late_jobs(app, sink, queue, sizes)
    n = sizes.late_jobs
    worker = Worker(app, concurrency=8)
    span = (LATE_LEAD_MS + n * sizes.late_every_ms) / 1000.0

    async def run() -> None:
        serving = asyncio.create_task(worker.serve())
        deadline = time.monotonic() + span + 15.0
        while len(seen) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a duplicate would show up now
        worker.stop()
        await serving

    asyncio.run(run())
    return seen


def _lateness_measures(
    seen: list[tuple[str, float]], n: int, every: int, name: str
) -> list[Measure]:
    ids = [item[0] for item in seen]
    late_ms = sorted(item[1] for item in seen)
    unique = len(set(ids))
    lost, dup = n - unique, len(ids) - unique
    early = sum(1 for value in late_ms if value < 0)
    p50 = statistics.median(late_ms) if late_ms else float("nan")
    p99 = percentile(late_ms, 0.99)
    worst = late_ms[-1] if late_ms else float("nan")
    if name == "worker":
        note = f"{n} jobs due one every {every} ms, sync rpush, concurrency 8"
        return [
            Measure("c", "lateness p50 (worker)", p50, "ms", note=note),
            Measure("c", "lateness p99 (worker)", p99, "ms", "<= 3 ms", p99 <= 3.0),
            Measure("c", "lateness max (worker)", worst, "ms", "<= 15 ms", worst <= 15.0),
            Measure("c", "lost / duplicated / early (worker)", lost + dup + early, "count", "0",
                    lost + dup + early == 0, note=f"{lost} / {dup} / {early}"),
        ]  # fmt: skip
    note = "the same jobs and handler: reserve(max=8), handler inline, ack_many; no Worker"
    return [
        Measure("c", f"lateness p50 ({name})", p50, "ms", note=note),
        Measure("c", f"lateness p99 ({name})", p99, "ms"),
        Measure("c", f"lateness max ({name})", worst, "ms"),
        Measure("c", f"lost / duplicated / early ({name})", lost + dup + early, "count",
                note=f"{lost} / {dup} / {early}"),
    ]  # fmt: skip


# -- d: processes ----------------------------------------------------------------------
APP_MODULE = """
import os
from delayq import App

app = App(os.environ["DELAYQ_BENCH_URL"])
LOOPS = int(os.environ["DELAYQ_BENCH_LOOPS"])


@app.task(name="cpu", queue=os.environ["DELAYQ_BENCH_QUEUE"], max_attempts=1)
def cpu() -> None:
    total = 0
    for i in range(LOOPS):
        total += i
"""


def delayq_command() -> list[str]:
    """How to run the ``delayq`` command of this interpreter's environment."""
    script = Path(sys.executable).parent / "delayq"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from delayq.cli import main; sys.exit(main())"]


def has_processes_option() -> bool:
    out = subprocess.run(
        [*delayq_command(), "worker", "--help"], capture_output=True, text=True, check=False
    )
    return "--processes" in out.stdout


def section_processes(url: str, sizes: Sizes, loops: int, repeat: int) -> list[Measure]:
    if not has_processes_option():
        note = "n/a: this tree's delayq worker has no --processes option"
        return [
            Measure("d", "cpu, --processes 1", float("nan"), "items/s", note=note),
            Measure("d", "cpu, --processes 2", float("nan"), "items/s", note=note),
            Measure("d", "--processes 2 / --processes 1", float("nan"), "x", ">= 1.80x", None,
                    note="n/a"),
        ]  # fmt: skip
    jobs = sizes.processes_jobs
    bare: dict[int, list[float]] = {1: [], 2: []}
    runs: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    for _ in range(repeat):  # alternated: a load that comes and goes hits both
        for n in (1, 2):
            bare[n].append(_bare_processes_rate(url, n, jobs, loops))
            runs[n].append(_processes_rate(url, n, jobs, loops))
    floor_ratio, floor_pairs = _ratio(bare[1], bare[2])
    whole = {n: [run[0] for run in runs[n]] for n in runs}
    steady = {n: [run[1] for run in runs[n]] for n in runs}
    ratio, pairs = _ratio(whole[1], whole[2])
    steady_ratio, steady_pairs = _ratio(steady[1], steady[2])
    share = f"{STEADY - (1 - STEADY):.0%}"
    return [
        Measure("d", "floor cpu, 1 process (bare loop)", max(bare[1]), "items/s",
                note="no queue, no worker", extra={"all": bare[1]}),
        Measure("d", "floor cpu, 2 processes (bare loop)", max(bare[2]), "items/s",
                note="at once, sharing the jobs", extra={"all": bare[2]}),
        Measure("d", "floor 2 processes / 1 process", floor_ratio, "x",
                note="what this machine allows; pairs " + floor_pairs),
        Measure("d", "cpu, --processes 1", max(whole[1]), "items/s",
                note=f"concurrency 8; the middle {share} of the jobs: {max(steady[1]):,.0f}/s",
                extra={"all": runs[1]}),
        Measure("d", "cpu, --processes 2", max(whole[2]), "items/s",
                note=f"concurrency 8 each; the middle {share}: {max(steady[2]):,.0f}/s",
                extra={"all": runs[2]}),
        Measure("d", "--processes 2 / --processes 1", ratio, "x", ">= 1.80x", ratio >= 1.8,
                note="first reserve to last ack; pairs " + pairs),
        Measure("d", f"the same, middle {share} of the jobs", steady_ratio, "x",
                note="pairs " + steady_pairs),
    ]  # fmt: skip


def _ratio(one: list[float], two: list[float]) -> tuple[float, str]:
    """The best of ``two`` over the best of ``one``, and the ratio of each pair."""
    pairs = ", ".join(f"{b / a:.2f}x" for a, b in zip(one, two, strict=True) if a)
    return (max(two) / max(one) if max(one) else 0.0), pairs


#: Section d's floor: the cpu handler's loop in a process of its own, started by a line
#: on stdin; it prints when it started and ended (time.monotonic(), system-wide).
BARE_CPU = """
import sys, time

loops, each = int(sys.argv[1]), int(sys.argv[2])


def burn(loops):
    total = 0
    for i in range(loops):
        total += i
    return total


print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
for _ in range(each):
    burn(loops)
print(started, time.monotonic(), flush=True)
"""


def _bare_processes_rate(url: str, processes: int, jobs: int, loops: int) -> float:
    """``jobs`` calls of the cpu handler shared by ``processes`` bare loops started at
    once, while this process polls a queue's stats as :func:`_processes_rate` does."""
    each = jobs // processes
    app = App(url)
    handle = app.queue(f"delayq-bench-worker-proc-{uuid.uuid4().hex[:8]}")
    command = [sys.executable, "-c", BARE_CPU, str(loops), str(each)]
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            child.stdout.readline()  # "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.close()
        while any(child.poll() is None for child in children):
            handle.stats()  # as during a drain: the same work for Redis and this process
            time.sleep(0.02)
        spans = []
        for child in children:
            assert child.stdout is not None
            started, ended = (float(word) for word in child.stdout.read().split())
            spans.append((started, ended))
        seconds = max(end for _, end in spans) - min(start for start, _ in spans)
        return each * processes / seconds if seconds > 0 else 0.0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
        app.close()


#: Section d's steady rate: from this share of the jobs left to 1 - this share.
STEADY = 0.9


def _rate(seen: list[tuple[float, int]]) -> float:
    """Jobs/s between the first and the last of ``seen`` (when, jobs left)."""
    if len(seen) < 2 or seen[-1][0] <= seen[0][0]:
        return 0.0
    return (seen[0][1] - seen[-1][1]) / (seen[-1][0] - seen[0][0])


def _processes_rate(url: str, processes: int, jobs: int, loops: int) -> tuple[float, float]:
    """``jobs`` calls of the cpu task drained by ``delayq worker --processes N``: jobs/s
    from the first reserve to the last ack, and in the steady part (see :data:`STEADY`)."""
    queue = f"delayq-bench-worker-proc-{uuid.uuid4().hex[:8]}"
    app = App(url)

    @app.task(name="cpu", queue=queue, max_attempts=1)
    def cpu() -> None: ...

    handle = app.queue(queue)
    with tempfile.TemporaryDirectory(prefix="delayq-bench-worker-") as tmp:
        Path(tmp, "delayq_bench_app.py").write_text(textwrap.dedent(APP_MODULE))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]))
        env.update(DELAYQ_BENCH_URL=url, DELAYQ_BENCH_LOOPS=str(loops), DELAYQ_BENCH_QUEUE=queue)
        child = None
        try:
            for start in range(0, jobs, 1000):
                app.send_many(cpu.message() for _ in range(start, min(jobs, start + 1000)))
            child = subprocess.Popen(
                [*delayq_command(), "worker", "delayq_bench_app:app", "--processes",
                 str(processes), "--log-level", "warning"],
                env=env, cwd=tmp,
            )  # fmt: skip
            seen: list[tuple[float, int]] = []  # (when, jobs left) from the first reserve on
            deadline = time.monotonic() + jobs * 0.01 + 60
            while time.monotonic() < deadline and child.poll() is None:
                stats = handle.stats()
                left = stats.ready + stats.scheduled + stats.active
                if seen or stats.ready + stats.scheduled < jobs:
                    seen.append((time.perf_counter(), left))
                if left == 0:
                    break
                time.sleep(0.02)
            else:
                return 0.0, 0.0
            middle = [
                (when, left) for when, left in seen if (1 - STEADY) * jobs <= left <= STEADY * jobs
            ]
            return _rate(seen), _rate(middle)
        finally:
            if child is not None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            try:
                handle.purge()
            finally:
                app.close()


# -- t: tracing ------------------------------------------------------------------------
TRACE_MODES = ("off", "noop-sdk", "sdk-sampled-out", "sdk-file", "prometheus", "otel-metrics")
TRACE_CASES = (("sync-noop", 8), ("async-noop", 32))


def trace_setup(mode: str, spans_file: str) -> None:
    """Configure OpenTelemetry in this (child) process as ``mode`` says."""
    from opentelemetry import trace  # noqa: PLC0415 (only the tracing section uses it)

    if mode in ("off", "prometheus"):
        return  # the API imported, no provider: what delayq's check sees first
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
        BatchSpanProcessor,
        ConsoleSpanExporter,
    )
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF  # noqa: PLC0415

    if mode == "otel-metrics":
        from opentelemetry import metrics  # noqa: PLC0415
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )

        out = open(spans_file, "a")  # noqa: SIM115 (the exporter's for the process's life)
        reader = PeriodicExportingMetricReader(ConsoleMetricExporter(out=out))
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    elif mode == "noop-sdk":
        os.environ["OTEL_SDK_DISABLED"] = "true"
        trace.set_tracer_provider(TracerProvider())
    elif mode == "sdk-sampled-out":
        trace.set_tracer_provider(TracerProvider(sampler=ALWAYS_OFF))
    else:
        provider = TracerProvider()
        out = open(spans_file, "a")  # noqa: SIM115 (the exporter's for the process's life)
        exporter = ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)


def trace_child(url: str, mode: str, kind: str, concurrency: int, jobs: int) -> None:
    """One drain in this process under ``mode``: its measures as one JSON line."""
    with tempfile.TemporaryDirectory() as tmp:
        spans_file = str(Path(tmp) / "spans.jsonl")
        trace_setup(mode, spans_file)
        with gc_frozen():
            run = drain(url, kind, concurrency, jobs, 0, metrics=mode == "prometheus")
        if mode == "sdk-file":
            from opentelemetry import trace  # noqa: PLC0415

            trace.get_tracer_provider().shutdown()  # type: ignore[attr-defined]
            with open(spans_file) as spans:
                run["spans"] = sum(1 for _ in spans)
    print(json.dumps(run))


def section_tracing(
    url: str, sizes: Sizes, repeat: int, baseline: str | None = None
) -> list[Measure]:
    """The worker alone under each of TRACE_MODES, alternated in child processes; with
    ``baseline`` (the ``src`` directory of another delayq tree), that tree's worker too,
    tracing off ("before")."""
    best: dict[tuple[str, int, str], dict[str, Any]] = {}
    modes = (("before",) if baseline else ()) + TRACE_MODES
    for _ in range(max(repeat, 1)):
        for kind, concurrency in TRACE_CASES:
            for mode in modes:
                case = f"{kind}:{concurrency}"
                command = [sys.executable, __file__, "--trace-child",
                           "off" if mode == "before" else mode, "--url", url,
                           "--cases", case, "--jobs", str(sizes.jobs)]  # fmt: skip
                env = dict(os.environ)
                if mode == "before":
                    assert baseline is not None
                    env["PYTHONPATH"] = os.pathsep.join(
                        filter(None, [baseline, env.get("PYTHONPATH")])
                    )
                done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
                if done.returncode != 0:
                    console.print(done.stderr[-2000:], style="red")
                    continue
                run = json.loads(done.stdout.strip().splitlines()[-1])
                key = (kind, concurrency, mode)
                if key not in best or run["rate"] > best[key]["rate"]:
                    best[key] = run
    measures = []
    for kind, concurrency in TRACE_CASES:
        off = best.get((kind, concurrency, "off"))
        for mode in modes:
            run = best.get((kind, concurrency, mode))
            # each mode against "off"; "off" itself against "before" (another tree)
            against = "before" if mode == "off" else "off"
            reference = best.get((kind, concurrency, against))
            if run is None or off is None:
                continue
            target, passed, note = "", None, ""
            if reference is not None and reference is not run:
                ratio = run["rate"] / reference["rate"] if reference["rate"] else 0.0
                cpu = run["cpu_us"] / reference["cpu_us"] if reference["cpu_us"] else 0.0
                note = f"{ratio:.3f} x {against}, CPU/job {cpu:.3f} x {against}"
                if mode in ("noop-sdk", "off", "prometheus"):
                    target, passed = f">= 0.95 x {against}", ratio >= 0.95
            if "spans" in run:
                note += f"; {run['spans']} spans written"
            measures.append(
                Measure("t", f"worker alone {kind} c{concurrency}: {mode}", run["rate"],
                        "items/s", target=target, passed=passed, note=note, extra=run,
                        cpu_per_job=run["cpu_us"])
            )  # fmt: skip
    return measures


# -- main ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the sections per backend, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", help="one backend URL to measure (default: redis and sqlite)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--sections", help="a (with b), c, d; default all")
    parser.add_argument(
        "--repeat", type=int, default=1, help="drain and floor runs per case (best taken)"
    )
    parser.add_argument(
        "--cases", help="drain cases, e.g. sync-rpush:8,cpu:8 (default: all of CASES)"
    )
    parser.add_argument("--json", type=Path, help="where to write the JSON results")
    parser.add_argument(
        "--trace-baseline",
        metavar="SRC",
        help="section t: also the worker of the delayq package under SRC (another tree's "
        "src/), tracing off, as 'before'",
    )
    parser.add_argument("--trace-child", choices=TRACE_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trace_child:  # one run of section t, in a process of its own
        kind, concurrency = args.cases.split(":")
        trace_child(args.url, args.trace_child, kind, int(concurrency), args.jobs)
        return 0
    if args.cases:
        CASES[:] = [(kind, int(c)) for kind, c in (p.split(":") for p in args.cases.split(","))]
    sizes = QUICK if args.quick else Sizes()
    chosen = parse_sections(args.sections, SECTIONS)
    path: Path = args.json or result_path("worker", args.url, args.quick)
    env = environment()
    loops = calibrate_cpu()
    started = time.perf_counter()
    measures: list[Measure] = []
    runs: list[dict[str, Any]] = []
    # frozen as `delayq worker` freezes what it set up
    with gc_frozen(), bench_urls(args.url, "worker") as urls:
        for url in sorted(urls, key=lambda u: not u.startswith("redis")):
            scheme = urlsplit(url).scheme.lower()
            is_redis = scheme.startswith("redis")
            t0 = time.perf_counter()
            found: list[Measure] = []
            if "a" in chosen:
                console.print(f"{scheme}: a, b. drain and floor ...", style="dim")
                found += section_drain(url, is_redis, sizes, loops, args.repeat)
                found += section_bound(url, sizes)
            if "c" in chosen:
                console.print(f"{scheme}: c. lateness ...", style="dim")
                found += section_lateness(url, sizes)
                if not is_redis:
                    for measure in found:
                        measure.target, measure.passed = "", None
            if "t" in chosen:
                console.print(f"{scheme}: t. tracing ...", style="dim")
                found += section_tracing(url, sizes, args.repeat, args.trace_baseline)
            if "m" in chosen:
                console.print(f"{scheme}: m. metrics off and on ...", style="dim")
                found += section_metrics(url, sizes, args.repeat)
            if "d" in chosen and is_redis:
                console.print(f"{scheme}: d. processes ...", style="dim")
                found += section_processes(url, sizes, loops, args.repeat)
            for measure in found:
                measure.section = f"{measure.section} {scheme}"
            measures.extend(found)
            runs.append({"url": shown(url), "seconds": time.perf_counter() - t0})
    total = time.perf_counter() - started
    print_table(f"delayq worker benchmark ({total:.0f} s)", measures)
    write_json(
        path,
        {
            "benchmark": "worker",
            "runs": runs,
            "mode": "quick" if args.quick else "full",
            "sizes": asdict(sizes),
            "cpu_loops": loops,
            "environment": env,
            "total_seconds": total,
        },
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
