"""rq with its built-in scheduler, defaults (see ``_harness`` for what is measured).

Run by ``run.py`` inside ``benchmarks/peers/.venv``; by hand::

    benchmarks/peers/.venv/bin/python benchmarks/peers/rq_bench.py \\
        --url redis://127.0.0.1:6379/13 [--quick] [--json out.json]

The worker is rq's own CLI, ``rq worker --with-scheduler``: the flag is needed for
``enqueue_in``/``enqueue_at`` jobs to run at all, everything else is rq's default:
the ``rq.Worker`` class (forks a work horse per job), the scheduler
(``RQScheduler``, in a process the worker forks) moves due jobs to the queue every
``interval=1`` s and stores due times in whole seconds, ``result_ttl=500`` s, job
timeout 180 s, pickle serializer. Jobs go through ``Queue.enqueue`` (due now),
``Queue.enqueue_in`` (delayed) and ``Queue.enqueue_many`` (the batch API, one
pipeline), named by their dotted path.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import redis
from _harness import DONE_KEY, HERE, RECORD_KEY, Peer, main, record_line
from rq import Queue, get_current_job

QUEUE = "peers-bench"


# -- the jobs (run in the worker's work horse) -------------------------------------------


def noop() -> None:
    """The drain job: one INCR."""
    job = get_current_job()
    assert job is not None
    job.connection.incr(DONE_KEY)


def record(seq: int) -> None:
    """The lateness job: push its sequence number and start time."""
    started = time.time()
    job = get_current_job()
    assert job is not None
    job.connection.rpush(RECORD_KEY, record_line(seq, started))


# -- the producer (runs here) -------------------------------------------------------------


class Rq(Peer):
    name = "rq"
    version = version("rq")
    defaults: ClassVar[dict[str, Any]] = {
        "worker class": "rq.Worker (forks a work horse per job)",
        "scheduler": "rq worker --with-scheduler; RQScheduler interval = 1 s",
        "scheduled time resolution": "whole seconds (ScheduledJobRegistry score)",
        "result_ttl": "500 s",
        "job timeout": "180 s",
        "serializer": "pickle",
    }
    batch_api = "Queue.enqueue_many"

    def open(self) -> None:
        self.connection = redis.Redis.from_url(self.url)
        self.queue = Queue(QUEUE, connection=self.connection)

    def close(self) -> None:
        self.connection.close()

    def enqueue_noops(self, count: int) -> None:
        for _ in range(count):
            self.queue.enqueue("rq_bench.noop")

    def enqueue_noop_batch(self, count: int) -> None:
        self.queue.enqueue_many([Queue.prepare_data("rq_bench.noop") for _ in range(count)])

    def enqueue_record(self, seq: int, delay: float) -> float:
        due = time.time() + delay
        if delay:
            self.queue.enqueue_in(timedelta(seconds=delay), "rq_bench.record", seq)
        else:
            self.queue.enqueue("rq_bench.record", seq)
        return due

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        rq = str(Path(sys.executable).with_name("rq"))
        command = [rq, "worker", "--with-scheduler", "--url", self.url, "--path", str(HERE), QUEUE]
        return command, {}, "rq worker --with-scheduler (one worker process)"


if __name__ == "__main__":
    sys.exit(main(Rq))
