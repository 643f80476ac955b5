"""delayq on Redis through its Worker: defaults, quiet, ``--processes 2``, and tuned
(see ``_harness`` for what is measured).

Run by ``run.py`` with the repository's own ``.venv``; by hand::

    .venv/bin/python benchmarks/peers/delayq_bench.py \\
        --url redis://127.0.0.1:6379/2 [--variant processes-2] [--quick] [--json out.json]

The worker is delayq's own CLI, ``delayq worker delayq_bench:app`` with its
defaults (``--concurrency 8`` handler threads for these sync jobs, prefetch up to
16x for quick sync handlers, lease 30 s), with ``--processes 2`` for that variant.
``tuned`` uses the knobs delayq documents for handlers that wait on the network: the
jobs are ``async def`` (one awaited ``redis.asyncio`` INCR, as arq's, saq's and
bullmq's jobs), so they run on the worker's event loop with no thread hand-off, and
``--concurrency`` is raised to :data:`TUNED_CONCURRENCY` handlers in flight per
process (bullmq's tuned row runs 50), in ``--processes 2``:
``delayq worker delayq_bench:tuned_app --concurrency 50 --processes 2 --log-level
warning``. ``quiet`` is the defaults with ``--log-level warning``: ``delayq worker``
logs a ``job.succeeded`` line a job at its default level (info), which costs the
worker about 13 us of CPU a job; celery's worker, among others, logs none by
default (its level is warning), and the tuned row of each peer drops it too.
Jobs go through ``Task.send`` (one by one; ``delay=`` for the deferred ones) and
``App.send_many`` (the batch API, 1,000 messages a call).
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

from _harness import (
    URL_ENV,
    Peer,
    main,
    noop_job,
    noop_job_async,
    record_job,
    record_job_async,
)

from delayq import App

QUEUE = "peers-bench"
app = App(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/2"))
noop = app.task(name="noop", queue=QUEUE)(noop_job)
record = app.task(name="record", queue=QUEUE)(record_job)
#: The tuned variant's app: the same tasks as ``async def`` (what its worker imports).
tuned_app = App(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/2"))
tuned_app.task(name="noop", queue=QUEUE)(noop_job_async)
tuned_app.task(name="record", queue=QUEUE)(record_job_async)
#: Async handlers in flight per process in the tuned variant (bullmq's tuned: 50).
TUNED_CONCURRENCY = 50


class Delayq(Peer):
    name = "delayq"
    version = version("delayq")
    defaults: ClassVar[dict[str, Any]] = {
        "concurrency": 8,
        "prefetch": "4 x concurrency, up to 16 x for quick sync handlers",
        "lease": "30 s",
        "processes": 1,
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "defaults": {},
        "quiet": {"log_level": "warning: no job.succeeded line a job"},
        "processes-2": {"processes": 2},
        "tuned": {
            "handlers": "async def (redis.asyncio INCR)",
            "concurrency": TUNED_CONCURRENCY,
            "processes": 2,
            "log_level": "warning",
        },
    }
    batch_api = "App.send_many"

    def open(self) -> None:
        self.app = App(self.url)
        self.noop = self.app.task(name="noop", queue=QUEUE)(noop_job)
        self.record = self.app.task(name="record", queue=QUEUE)(record_job)

    def close(self) -> None:
        self.app.close()

    def enqueue_noops(self, count: int) -> None:
        for _ in range(count):
            self.noop.send()

    def enqueue_noop_batch(self, count: int) -> None:
        self.app.send_many(self.noop.message() for _ in range(count))

    def enqueue_record(self, seq: int, delay: float) -> float:
        due = time.time() + delay
        if delay:
            self.record.send(seq, delay=delay)
        else:
            self.record.send(seq)
        return due

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        delayq = str(Path(sys.executable).with_name("delayq"))
        command = [delayq, "worker", "delayq_bench:app", "--url", self.url]
        described = "delayq worker (defaults, one process)"
        if self.variant == "quiet":
            command += ["--log-level", "warning"]
            described = "delayq worker --log-level warning (no line a job)"
        elif self.variant == "processes-2":
            command += ["--processes", "2"]
            described = "delayq worker --processes 2"
        elif self.variant == "tuned":
            command[2] = "delayq_bench:tuned_app"
            command += ["--concurrency", str(TUNED_CONCURRENCY), "--processes", "2"]
            command += ["--log-level", "warning"]
            described = (
                f"delayq worker, async handlers, --concurrency {TUNED_CONCURRENCY} --processes 2 "
                "--log-level warning"
            )
        return command, {URL_ENV: self.url}, described


if __name__ == "__main__":
    sys.exit(main(Delayq))
