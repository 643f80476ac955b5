"""Lateness on ``amqp://`` while a backlog mostly held far falls due (issue 41, point 1:
"with the RabbitMQ backend's lateness and throughput targets still met").

Run ``.venv/bin/python benchmarks/far_lateness.py [--count 300000] [--seconds 60]``.
On a private single RabbitMQ node (``_amqp_node.py``), ``delayq scheduler`` in a process
of its own; this process (``scheduler=off``) puts ``count`` messages of 100 B with
``put_many`` in batches of 1000, due one after the other at an even pace over
``seconds`` from ``--lead`` seconds (LEAD_SECONDS) after the first put: past the first
50,000 waiting they go to the scheduler's far records, and come back 250 at a time as
their time nears, while they fall due (300,000 over 60 s: 5,000 a second). CONSUMERS
threads, each with a queue object of its own, loop on ``reserve(max=100, wait=1)`` and
one ``ack_many`` of what they got. Lateness = the consumer's wall clock when reserve
returns minus the message's ``due_at``: p50 / p99 / max in ms, with lost, duplicated and
early (which must be 0), held to docs/rabbitmq.md's targets for the firing path (p99 <=
10 ms, max <= 50 ms). Before far records every message was in the scheduler's memory:
run the same with an older ``src`` on ``PYTHONPATH`` (the scheduler process inherits it)
for the comparison. It prints a table and writes JSON to
``benchmarks/results/far-lateness.json``; it never asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from _amqp_node import RabbitNodes, start_scheduler, stop
from _common import RESULTS_DIR, Measure, environment, print_table, write_json
from delayq.durable import Queue

BATCH = 1000
PAYLOAD = b"x" * 100
#: Seconds from the first put to the first due time (``--lead``): the puts of
#: 300,000 end before it.
LEAD_SECONDS = 30.0
CONSUMERS = 2
#: docs/rabbitmq.md's targets for the firing path.
P99_MS, MAX_MS = 10.0, 50.0


def consume(url: str, count: int, late: list[float], ids: list[str], until: float) -> None:
    """Reserve and ack until ``count`` messages came (counted over every consumer) or
    ``until`` (``time.monotonic()``) passed; each lateness and id appended."""
    with Queue(url, name="far") as queue:
        while len(ids) < count and time.monotonic() < until:
            got = queue.reserve(max=100, wait=1, lease=60)
            now_ms = time.time() * 1000
            for message in got:
                late.append(now_ms - message.due_at)
                ids.append(message.id)
            if got:
                queue.ack_many(got)


def run(count: int, seconds: float, lead: float) -> dict[str, float]:
    with TemporaryDirectory(prefix="delayq-far-lateness-") as work:
        nodes = RabbitNodes(Path(work) / "rabbit", 1)
        nodes.start()
        try:
            url = nodes.url(0, "?prefix=delayq-bench-far-lateness")
            scheduler = start_scheduler(url, Path(work) / "scheduler.log")
            client = f"{url}&scheduler=off&request_timeout=120"
            try:
                with Queue(client, name="far") as queue:
                    first = time.time() * 1000 + lead * 1000
                    step = seconds * 1000 / count
                    started = time.perf_counter()
                    for at in range(0, count, BATCH):
                        queue.put_many(
                            [
                                {"payload": PAYLOAD, "at": (first + n * step) / 1000}
                                for n in range(at, min(at + BATCH, count))
                            ]
                        )
                    put_seconds = time.perf_counter() - started
                    late: list[float] = []
                    ids: list[str] = []
                    until = time.monotonic() + lead + seconds + 60
                    threads = [
                        threading.Thread(target=consume, args=(client, count, late, ids, until))
                        for _ in range(CONSUMERS)
                    ]
                    for thread in threads:
                        thread.start()
                    for thread in threads:
                        thread.join()
                    queue.purge()
            finally:
                stop(scheduler)
        finally:
            nodes.stop()
    late.sort()
    return {
        "put_per_second": count / put_seconds,
        "put_seconds": put_seconds,
        "received": len(ids),
        "lost": count - len(set(ids)),
        "duplicated": len(ids) - len(set(ids)),
        "early": sum(1 for value in late if value < 0),
        "p50_ms": statistics.median(late) if late else float("nan"),
        "p99_ms": late[min(len(late) - 1, int(len(late) * 0.99))] if late else float("nan"),
        "max_ms": late[-1] if late else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--lead", type=float, default=LEAD_SECONDS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    env = environment()
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    found = run(args.count, args.seconds, args.lead)
    load += " -> " + " ".join(f"{value:.1f}" for value in os.getloadavg())
    rate = args.count / args.seconds
    what = f"{args.count:,} falling due over {args.seconds:g} s ({rate:,.0f}/s)"
    faults = f"{found['lost']:.0f} lost, {found['duplicated']:.0f} doubled, "
    faults += f"{found['early']:.0f} early of {found['received']:,.0f} received"
    measures = [Measure("l", f"lateness p50, {what}", found["p50_ms"], "ms", note=faults)]
    for name, most in (("p99", P99_MS), ("max", MAX_MS)):
        value = found[f"{name}_ms"]
        target = f"<= {most:g} ms"
        measures.append(Measure("l", f"lateness {name}", value, "ms", target, value <= most))
    measures += [
        Measure(
            "l",
            "put_many before they fell due",
            found["put_per_second"],
            "msg/s",
            note=f"{found['put_seconds']:.1f} s",
        ),
    ]
    path = args.json or RESULTS_DIR / "far-lateness.json"
    print_table(f"delayq amqp:// lateness over far records (load average {load})", measures)
    document = {"benchmark": "far_lateness", "count": args.count, "seconds": args.seconds}
    write_json(path, {**document, "load": load, "raw": found, "environment": env}, measures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
