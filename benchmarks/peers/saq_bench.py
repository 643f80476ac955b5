"""saq on Redis, defaults and tuned (see ``_harness`` for what is measured).

Run by ``run.py`` inside ``benchmarks/peers/.venv-saq``; by hand::

    benchmarks/peers/.venv-saq/bin/python benchmarks/peers/saq_bench.py \\
        --url redis://127.0.0.1:6379/6 [--variant tuned] [--quick] [--json out.json]

The worker is saq's own CLI, ``saq saq_bench.settings`` (``tuned_settings``), one
process (``--workers 1``, its default). Jobs go through ``Queue.enqueue`` (due now)
and ``Queue.enqueue(..., scheduled=...)`` (delayed: saq's due times are whole epoch
seconds, so a job is asked for the first whole second at or after its due time, the
only way not to run it early; a timer moves due jobs to the queue every
``timers["schedule"]`` = 1 s, the least it takes: it is also the lock's lifetime in
whole seconds). saq has no batch enqueue.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

from _harness import DONE_KEY, RECORD_KEY, URL_ENV, Peer, main, record_line
from saq import Queue

# -- the jobs (run in the worker) --------------------------------------------------------


async def noop(ctx: dict[str, Any]) -> None:
    """The drain job: one INCR."""
    await ctx["worker"].queue.redis.incr(DONE_KEY)


async def record(ctx: dict[str, Any], seq: int) -> None:
    """The lateness job: push its sequence number and start time."""
    started = time.time()
    await ctx["worker"].queue.redis.rpush(RECORD_KEY, record_line(seq, started))


def settings() -> dict[str, Any]:
    """What ``saq saq_bench.settings`` runs: saq's defaults (concurrency 10)."""
    queue = Queue.from_url(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/6"))
    return {"queue": queue, "functions": [noop, record]}


def tuned_settings() -> dict[str, Any]:
    """saq's throughput knob: ``concurrency``, jobs run at once (default 10)."""
    return {**settings(), "concurrency": 100}


# -- the producer (runs here) -------------------------------------------------------------


class Saq(Peer):
    name = "saq"
    version = version("saq")
    defaults: ClassVar[dict[str, Any]] = {
        "concurrency": 10,
        "timers": "schedule 1 s (the least), sweep 60 s, abort 1 s",
        "scheduled": "whole epoch seconds",
        "workers": 1,
    }
    variants: ClassVar[dict[str, dict[str, Any]]] = {
        "defaults": {},
        "tuned": {"concurrency": 100},
    }

    def open(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue = Queue.from_url(self.url)

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.disconnect())
        self.loop.close()

    def enqueue_noops(self, count: int) -> None:
        async def many() -> None:
            for _ in range(count):
                await self.queue.enqueue("noop")

        self.loop.run_until_complete(many())

    def enqueue_record(self, seq: int, delay: float) -> float:
        due = time.time() + delay
        if delay:
            job = self.queue.enqueue("record", seq=seq, scheduled=math.ceil(due))
        else:
            job = self.queue.enqueue("record", seq=seq)
        self.loop.run_until_complete(job)
        return due

    def worker(self) -> tuple[list[str], dict[str, str], str]:
        saq = str(Path(sys.executable).with_name("saq"))
        name = "tuned_settings" if self.variant == "tuned" else "settings"
        return [saq, f"saq_bench.{name}"], {URL_ENV: self.url}, f"saq saq_bench.{name}"


if __name__ == "__main__":
    sys.exit(main(Saq))
