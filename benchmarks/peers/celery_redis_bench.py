"""Celery with its Redis broker, defaults and tuned (see ``_harness`` for what is
measured); ``celery_bench.py`` is Celery on RabbitMQ.

Run by ``run.py`` inside ``benchmarks/peers/.venv-celery``; by hand::

    benchmarks/peers/.venv-celery/bin/python benchmarks/peers/celery_redis_bench.py \\
        --url redis://127.0.0.1:6379/3 [--variant tuned] [--quick] [--json out.json]

The worker is Celery's own CLI, ``celery -A celery_redis_bench worker``: the
defaults are the prefork pool with one child per CPU (2 here), a prefetch multiplier
of 4, no result backend. Jobs go through ``Task.delay`` (due now) and
``Task.apply_async(countdown=...)`` (delayed: with the Redis broker the worker
reserves an ETA task at once and holds it in memory until its time, whatever the
prefetch). Celery has no batch enqueue (``group`` publishes each task on its own).
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

from _harness import URL_ENV, Peer, main, noop_job, record_job
from celery import Celery

app = Celery("celery_redis_bench", broker=os.environ.get(URL_ENV, "redis://127.0.0.1:6379/3"))
app.conf.task_ignore_result = True
noop = app.task(name="noop")(noop_job)
record = app.task(name="record")(record_job)

#: The tuned worker's options (Celery's "Optimizing" guide and worker docs).
TUNED_OPTIONS = [
    # Short I/O-bound jobs: threads instead of forked children (no IPC per job).
    "--pool",
    "threads",
    "--concurrency",
    "8",
    # "If you have many tasks with a short duration ... a high prefetch multiplier".
    "--prefetch-multiplier",
    "64",
    # No cluster chatter at start-up and during the run.
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
]


class CeleryRedis(Peer):
    name = "celery"
    version = version("celery")
    defaults: ClassVar[dict[str, Any]] = {
        "pool": "prefork, one child per CPU",
        "worker_prefetch_multiplier": 4,
        "result backend": "none (task_ignore_result = True here)",
        "ETA tasks": "held in the worker's memory (Redis broker)",
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "defaults": {},
        "tuned": {"options": " ".join(TUNED_OPTIONS)},
    }

    def open(self) -> None:
        app.conf.broker_url = self.url

    def close(self) -> None:
        app.close()

    def enqueue_noops(self, count: int) -> None:
        for _ in range(count):
            noop.delay()

    def enqueue_record(self, seq: int, delay: float) -> float:
        due = time.time() + delay
        if delay:
            record.apply_async((seq,), countdown=delay)
        else:
            record.delay(seq)
        return due

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        celery = str(Path(sys.executable).with_name("celery"))
        command = [celery, "-A", "celery_redis_bench", "worker", "--loglevel", "WARNING"]
        described = "celery worker (prefork, 2 children)"
        if self.variant == "tuned":
            command += TUNED_OPTIONS
            described = "celery worker " + " ".join(TUNED_OPTIONS)
        return command, {URL_ENV: self.url}, described


if __name__ == "__main__":
    sys.exit(main(CeleryRedis))
