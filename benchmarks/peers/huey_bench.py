"""huey on Redis, defaults and tuned (see ``_harness`` for what is measured).

Run by ``run.py`` inside ``benchmarks/peers/.venv-huey``; by hand::

    benchmarks/peers/.venv-huey/bin/python benchmarks/peers/huey_bench.py \\
        --url redis://127.0.0.1:6379/5 [--variant tuned] [--quick] [--json out.json]

The worker is huey's own CLI, ``huey_consumer huey_bench.huey``: by default one
worker thread, and a scheduler that moves due scheduled tasks to the queue every
``--scheduler-interval`` = 1 s (its least value). ``RedisHuey`` reads its queue
with a blocking pop. Jobs go through calling the task (due now) and
``Task.schedule(delay=...)`` (delayed). huey has no batch enqueue.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

from _harness import URL_ENV, Peer, main, noop_job, record_job
from huey import RedisHuey

huey = RedisHuey("peers-bench", url=os.environ.get(URL_ENV, "redis://127.0.0.1:6379/5"))
noop = huey.task(name="noop")(noop_job)
record = huey.task(name="record")(record_job)

#: The tuned consumer's options (huey's consumer docs: more workers for I/O-bound
#: jobs, threads; the scheduler interval is already its least, 1 s).
TUNED_OPTIONS = ["--workers", "8", "--worker-type", "thread", "--scheduler-interval", "1"]


class Huey(Peer):
    name = "huey"
    version = version("huey")
    defaults: ClassVar[dict[str, Any]] = {
        "workers": 1,
        "worker type": "thread",
        "scheduler interval": "1 s (the least it takes)",
        "Redis read": "blocking pop (RedisHuey blocking=True)",
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "defaults": {},
        "tuned": {"options": " ".join(TUNED_OPTIONS)},
    }

    def open(self) -> None:
        self.huey = RedisHuey("peers-bench", url=self.url)
        self.noop = self.huey.task(name="noop")(noop_job)
        self.record = self.huey.task(name="record")(record_job)

    def close(self) -> None:
        self.huey.storage.conn.close()

    def enqueue_noops(self, count: int) -> None:
        for _ in range(count):
            self.noop()

    def enqueue_record(self, seq: int, delay: float) -> float:
        due = time.time() + delay
        if delay:
            self.record.schedule(args=(seq,), delay=delay)
        else:
            self.record(seq)
        return due

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        consumer = str(Path(sys.executable).with_name("huey_consumer"))
        command = [consumer, "huey_bench.huey"]
        described = "huey_consumer (1 worker thread)"
        if self.variant == "tuned":
            command += TUNED_OPTIONS
            described = "huey_consumer " + " ".join(TUNED_OPTIONS)
        return command, {URL_ENV: self.url}, described


if __name__ == "__main__":
    sys.exit(main(Huey))
