"""``delayq bench``: jobs per second through the :class:`~delayq.Worker`, not the raw queue.

For each ``--concurrency`` value: an :class:`~delayq.App` with one async no-op task
on a fresh queue (``bench-<pid>-<time>-c<concurrency>``), ``--jobs`` calls of it put
with ``put_many`` (batches of 1000, due now), then a Worker of that app runs in this
process until every job succeeded. jobs/s is measured from the first completion
(ack) to the last: ``(jobs - 1) / seconds``. The queue is purged afterwards, also
when the run fails. A rich progress bar (stderr, on a terminal) shows the run; the
result is a rich table, or with ``--json`` one JSON object on stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from ..durable.registry import redact_url
from ..runtime import App, Worker
from ._common import (
    CliError,
    err_console,
    open_queue,
    resolve_url,
    translate_errors,
    url_option,
)

__all__ = ["BenchRun", "bench", "parse_concurrency", "run_one"]

#: Messages per ``put_many`` call while filling the queue.
PUT_BATCH = 1000
#: A run fails when no job completes for this long (seconds).
STALL_SECONDS = 30.0
#: How often the progress bar is refreshed (seconds).
POLL_SECONDS = 0.05
#: The name of the no-op task in the benchmark's app.
TASK_NAME = "delayq.bench.noop"


@dataclass
class BenchRun:
    """The result of one concurrency value."""

    url: str
    queue: str
    concurrency: int
    jobs: int
    succeeded: int
    failed: int
    seconds: float
    jobs_per_second: float
    put_seconds: float


class _TimedCounts(Counter[str]):
    """The worker's ``counts``, which also note when the first and the last job
    succeeded and stop the worker once ``target`` jobs ended (succeeded or dead)."""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target
        self.first: float | None = None
        self.last: float | None = None
        self.worker: Worker | None = None

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        if key == "succeeded":
            now = time.perf_counter()
            if self.first is None:
                self.first = now
            self.last = now
        ended = self.get("succeeded", 0) + self.get("dead", 0)
        if key in ("succeeded", "dead") and self.worker is not None and ended >= self.target:
            self.worker.stop(graceful=True)


def parse_concurrency(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """Option callback: ``"1,32"`` -> ``[1, 32]``; a usage error unless every part is
    an integer >= 1."""
    parts = [part.strip() for part in value.split(",")]
    values: list[int] = []
    for part in parts:
        try:
            number = int(part)
        except ValueError:
            number = 0
        if number < 1:
            raise click.BadParameter(
                f"expected integers >= 1 separated by commas, e.g. 1,32; got {value!r}",
                ctx=ctx,
                param=param,
            )
        values.append(number)
    return values


def _fresh_queue(concurrency: int) -> str:
    return f"bench-{os.getpid()}-{time.time_ns() // 1_000_000}-c{concurrency}"


def _make_app(url: str, queue: str) -> App:
    app = App(url)

    @app.task(name=TASK_NAME, queue=queue, max_attempts=1)
    async def noop() -> None:
        """Nothing: the benchmark measures the worker around it."""

    return app


async def _serve(
    worker: Worker, counts: _TimedCounts, progress: Progress | None, bar: TaskID | None
) -> None:
    """Run ``worker`` until ``counts`` stops it, refreshing ``bar`` of ``progress``;
    stop it when nothing completes for :data:`STALL_SECONDS`."""
    serving = asyncio.create_task(worker.serve())
    done, stall_since = -1, time.monotonic()
    while not serving.done():
        await asyncio.wait({serving}, timeout=POLL_SECONDS)
        ended = counts["succeeded"] + counts["dead"]
        if progress is not None and bar is not None:
            progress.update(bar, completed=ended)
        if ended != done:
            done, stall_since = ended, time.monotonic()
        elif time.monotonic() - stall_since > STALL_SECONDS:
            worker.stop(graceful=False)
    await serving


def run_one(
    url: str,
    *,
    jobs: int,
    concurrency: int,
    progress: Progress | None = None,
    bar: TaskID | None = None,
) -> BenchRun:
    """Put ``jobs`` no-op task calls on a fresh queue at ``url``, run a Worker with
    ``concurrency`` until they all ended, purge the queue; return the measures."""
    queue = _fresh_queue(concurrency)
    app = _make_app(url, queue)
    task = app.tasks[TASK_NAME]
    try:
        started = time.perf_counter()
        for start in range(0, jobs, PUT_BATCH):
            app.send_many(task.message() for _ in range(start, min(jobs, start + PUT_BATCH)))
        put_seconds = time.perf_counter() - started
        counts = _TimedCounts(jobs)
        worker = Worker(app, concurrency=concurrency)
        worker.counts = counts
        counts.worker = worker
        asyncio.run(_serve(worker, counts, progress, bar))
    finally:
        try:
            app.queue(queue).purge()
        finally:
            app.close()
    succeeded = counts["succeeded"]
    seconds = 0.0
    if counts.first is not None and counts.last is not None:
        seconds = counts.last - counts.first
    rate = (succeeded - 1) / seconds if succeeded > 1 and seconds > 0 else 0.0
    return BenchRun(
        url=redact_url(url),
        queue=queue,
        concurrency=concurrency,
        jobs=jobs,
        succeeded=succeeded,
        failed=jobs - succeeded,
        seconds=seconds,
        jobs_per_second=rate,
        put_seconds=put_seconds,
    )


def _table(runs: list[BenchRun]) -> Table:
    table = Table(
        title="delayq bench: an async no-op task through the Worker",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("url")
    for column in ("concurrency", "jobs", "seconds", "jobs/s"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            run.url,
            str(run.concurrency),
            f"{run.jobs:,}",
            f"{run.seconds:.3f}",
            f"{run.jobs_per_second:,.0f}",
        )
    table.caption = "jobs/s = (jobs - 1) / seconds from the first completion to the last"
    return table


@click.command(short_help="Jobs per second of a no-op task through the Worker.")
@click.option(
    "--jobs",
    type=click.IntRange(min=2),
    default=2000,
    show_default=True,
    help="No-op jobs per concurrency value.",
)
@click.option(
    "--concurrency",
    "concurrencies",
    default="1,32",
    show_default=True,
    metavar="N,M",
    callback=parse_concurrency,
    help="Worker concurrency values to measure, one run each.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
@url_option()
def bench(*, jobs: int, concurrencies: list[int], as_json: bool, url: str | None) -> None:
    """Measure jobs/s through the Worker: for each --concurrency value, put --jobs
    no-op task calls (due now) on a fresh queue, run a Worker in this process until
    all succeeded, and purge the queue."""
    target = resolve_url(url)
    with open_queue(target, _fresh_queue(0), create=True) as probe:
        probe.stats()  # fail fast when the store cannot be reached
    runs: list[BenchRun] = []
    console = err_console()
    with (
        translate_errors(target),
        Progress(
            TextColumn("[bold]concurrency {task.fields[concurrency]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        ) as progress,
    ):
        for concurrency in concurrencies:
            bar = progress.add_task("", total=jobs, concurrency=concurrency)
            runs.append(
                run_one(target, jobs=jobs, concurrency=concurrency, progress=progress, bar=bar)
            )
    failed = [run for run in runs if run.failed]
    if as_json:
        data: dict[str, Any] = {
            "url": redact_url(target),
            "task": "async no-op",
            "jobs": jobs,
            "runs": [asdict(run) for run in runs],
        }
        click.echo(json.dumps(data))
    else:
        Console(highlight=False, soft_wrap=True).print(_table(runs))
    if failed:
        run = failed[0]
        raise CliError(
            f"{run.failed} of {run.jobs} jobs did not succeed at concurrency {run.concurrency}"
        )
