"""dramatiq with its Redis broker, defaults and tuned (see ``_harness`` for what is
measured).

Run by ``run.py`` inside ``benchmarks/peers/.venv-dramatiq``; by hand::

    benchmarks/peers/.venv-dramatiq/bin/python benchmarks/peers/dramatiq_bench.py \\
        --url redis://127.0.0.1:6379/4 [--variant tuned] [--quick] [--json out.json]

The worker is dramatiq's own CLI, ``dramatiq dramatiq_bench --processes 1`` (its
default is one process per CPU; every peer here gets one worker process), 8 threads
(its default). Jobs go through ``Actor.send`` (due now) and
``Actor.send_with_options(delay=ms)`` (delayed: the message goes to the ``.DQ``
queue; the worker's consumer of that queue holds it in memory and moves it to the
work queue once its eta, whole milliseconds of the producer's clock, has passed,
looking each time its idle consumer wakes up). dramatiq has no batch enqueue
(``group`` sends each message on its own).
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import dramatiq
from _harness import URL_ENV, Peer, main, noop_job, record_job
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ.get(URL_ENV, "redis://127.0.0.1:6379/4"))
dramatiq.set_broker(broker)
noop = dramatiq.actor(noop_job, actor_name="noop", max_retries=0)
record = dramatiq.actor(record_job, actor_name="record", max_retries=0)

#: The tuned variant's settings, read by dramatiq from the environment at start.
TUNED_ENV = {
    # How long an idle consumer backs off at most between looks at its queue (and
    # so at the delayed messages it holds): "the number of milliseconds workers
    # should wake up after if the queue is idle", default 1000.
    "dramatiq_worker_timeout": "5",
    # Messages each consumer fetches per round trip (default: 2 x threads).
    "dramatiq_queue_prefetch": "128",
}


class Dramatiq(Peer):
    name = "dramatiq"
    version = version("dramatiq")
    defaults: ClassVar[dict[str, Any]] = {
        "processes": "one per CPU (here: --processes 1, as every peer)",
        "threads": 8,
        "worker_timeout": "1000 ms (idle consumer back-off: 5 ms doubling up to it)",
        "queue_prefetch": "2 x threads",
        "delay_queue_prefetch": "min(threads x 1000, 65535)",
        "max_retries": "20 (0 here: no job fails)",
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "defaults": {},
        "tuned": {"worker_timeout": "5 ms", "queue_prefetch": 128},
    }

    def open(self) -> None:
        self.broker = RedisBroker(url=self.url)
        dramatiq.set_broker(self.broker)
        self.noop = dramatiq.actor(noop_job, actor_name="noop", max_retries=0, broker=self.broker)
        self.record = dramatiq.actor(
            record_job, actor_name="record", max_retries=0, broker=self.broker
        )

    def close(self) -> None:
        self.broker.close()

    def enqueue_noops(self, count: int) -> None:
        for _ in range(count):
            self.noop.send()

    def enqueue_record(self, seq: int, delay: float) -> float:
        due = time.time() + delay
        if delay:
            self.record.send_with_options(args=(seq,), delay=round(delay * 1000))
        else:
            self.record.send(seq)
        return due

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        dramatiq_cli = str(Path(sys.executable).with_name("dramatiq"))
        command = [dramatiq_cli, "dramatiq_bench", "--processes", "1", "--threads", "8"]
        env = {URL_ENV: self.url, **(TUNED_ENV if self.variant == "tuned" else {})}
        return command, env, "dramatiq dramatiq_bench --processes 1 --threads 8"


if __name__ == "__main__":
    sys.exit(main(Dramatiq))
