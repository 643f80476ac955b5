"""arq on Redis, defaults and tuned (see ``_harness`` for what is measured).

Run by ``run.py`` inside ``benchmarks/peers/.venv``; by hand::

    benchmarks/peers/.venv/bin/python benchmarks/peers/arq_bench.py \\
        --url redis://127.0.0.1:6379/12 [--variant tuned] [--quick] [--json out.json]

The worker is arq's own CLI, ``arq arq_bench.WorkerSettings`` (``TunedSettings``
for ``tuned``). Jobs go through ``ArqRedis.enqueue_job`` to ``arq:queue``; delayed
ones with ``_defer_by`` (arq scores them in whole milliseconds of the client's
clock). arq has no batch enqueue.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

from _harness import DONE_KEY, RECORD_KEY, URL_ENV, Peer, main, record_line
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

# -- the jobs (run in the worker) --------------------------------------------------------


async def noop(ctx: dict[str, Any]) -> None:
    """The drain job: one INCR."""
    await ctx["redis"].incr(DONE_KEY)


async def record(ctx: dict[str, Any], seq: int) -> None:
    """The lateness job: push its sequence number and start time."""
    started = time.time()
    await ctx["redis"].rpush(RECORD_KEY, record_line(seq, started))


class WorkerSettings:
    """What ``arq arq_bench.WorkerSettings`` runs: the two jobs and the connection;
    every other setting is arq's default."""

    functions: ClassVar[list[Any]] = [noop, record]
    redis_settings = RedisSettings.from_dsn(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/12"))


class TunedSettings:
    """arq's latency and throughput knobs (docs: ``Worker``): ``poll_delay``, the
    "duration between polling the queue for new jobs", bounds its lateness;
    ``max_jobs`` (and ``queue_read_limit``, 5x it) the jobs it runs at once. (arq
    reads a settings class's own attributes only, not inherited ones.)"""

    functions: ClassVar[list[Any]] = WorkerSettings.functions
    redis_settings = WorkerSettings.redis_settings
    poll_delay = 0.005
    max_jobs = 100


# -- the producer (runs here) -------------------------------------------------------------


class Arq(Peer):
    name = "arq"
    version = version("arq")
    defaults: ClassVar[dict[str, Any]] = {
        "poll_delay": "0.5 s",
        "max_jobs": 10,
        "queue_read_limit": "max(max_jobs * 5, 100)",
        "job_timeout": "300 s",
        "keep_result": "3600 s",
        "max_tries": 5,
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "defaults": {},
        "tuned": {"poll_delay": "0.005 s", "max_jobs": 100},
    }

    def open(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool: ArqRedis = self.loop.run_until_complete(
            create_pool(RedisSettings.from_dsn(self.url))
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()

    def enqueue_noops(self, count: int) -> None:
        async def many() -> None:
            for _ in range(count):
                await self.pool.enqueue_job("noop")

        self.loop.run_until_complete(many())

    def enqueue_record(self, seq: int, delay: float) -> float:
        due = time.time() + delay
        if delay:
            job = self.pool.enqueue_job("record", seq, _defer_by=timedelta(seconds=delay))
        else:
            job = self.pool.enqueue_job("record", seq)
        self.loop.run_until_complete(job)
        return due

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        settings = "TunedSettings" if self.variant == "tuned" else "WorkerSettings"
        arq = str(Path(sys.executable).with_name("arq"))
        return [arq, f"arq_bench.{settings}"], {URL_ENV: self.url}, f"arq arq_bench.{settings}"


if __name__ == "__main__":
    sys.exit(main(Arq))
