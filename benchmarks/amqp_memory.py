"""The broker's memory and disk, and the scheduler's memory, per scheduled message on
``amqp://`` (issue 18: "report the broker's memory and disk per 1M scheduled messages").

Run ``.venv/bin/python benchmarks/amqp_memory.py [--count 1000000] [--quick]``. It starts
a private single RabbitMQ node from the machine's ``rabbitmq-server`` (``_amqp_node.py``,
over ``tests/backends/_rabbitmq_nodes.py``: its own ports, data directory and cookie, in
a temporary directory), so that the shared node is neither filled nor measured with other
work's queues; then ``delayq scheduler`` in a process of its own (the deployment
docs/rabbitmq.md measures). The benchmark's process (``scheduler=off``) puts ``count``
messages with a 100-byte payload, due in an hour, with ``put_many`` in batches of 1000,
and reports per message and per million:

- the broker's memory: the growth of ``erlang:memory(total)`` (``rabbitmqctl eval``),
  and of the node's resident set (VmRSS of its Erlang VM);
- the broker's disk: the growth of the node's data directory (the log stream's
  segments and indexes; one node, so one replica: a cluster stores this on each of the
  stream's replicas), with the scheduler's checkpoints (which roll live images forward
  into the log) as they happened during the puts: the note says how many, read from
  the log's ``mark`` headers, and the log's entries and body bytes;
- the scheduler's memory: the growth of its process's resident set.

Then it purges the queue, stops the scheduler and the node, and deletes the node's
directory. ``--quick``: 100,000 messages. It prints a table and writes JSON to
``benchmarks/results/amqp-memory.json``; it never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from _amqp_node import Node, RabbitNodes, rss, start_scheduler, stop
from _common import RESULTS_DIR, Measure, environment, print_table, write_json
from delayq.durable import Queue

BATCH = 1000
PREFIX = "delayq-bench-memory"
PAYLOAD = b"x" * 100
MIB = 1024 * 1024
#: How long the counts are let settle after the last put (a checkpoint in flight, the
#: broker's write-back of the last segment).
SETTLE_SECONDS = 5.0


async def read_log(url: str, stream: str) -> dict[str, int]:
    """What the log holds: its entries and their bytes, and the checkpoints begun and
    ended in it (the ``mark`` headers), read from its first offset until nothing more
    comes for 2 s."""
    import aiormq  # noqa: PLC0415 (delayq's amqp extra)

    counts = {"entries": 0, "body_bytes": 0, "checkpoints_begun": 0, "checkpoints_ended": 0}
    loop = asyncio.get_running_loop()
    last = loop.time()
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=1000)

        async def on_entry(message: aiormq.abc.DeliveredMessage) -> None:
            nonlocal last
            last = loop.time()
            counts["entries"] += 1
            counts["body_bytes"] += len(message.body)
            mark = (message.header.properties.headers or {}).get("mark", "")
            mark = mark.decode() if isinstance(mark, bytes) else str(mark)
            if mark.startswith("begin:"):
                counts["checkpoints_begun"] += 1
            elif mark.startswith("end:"):
                counts["checkpoints_ended"] += 1
            await channel.basic_ack(message.delivery.delivery_tag)

        await channel.basic_consume(stream, on_entry, arguments={"x-stream-offset": "first"})
        while loop.time() - last < 2.0:
            await asyncio.sleep(0.2)
    finally:
        await connection.close()
    return counts


def snapshot(node: Node, scheduler: int) -> dict[str, int | None]:
    return {
        "erlang_memory": node.erlang_memory(),
        "broker_rss": rss(node.beam()),
        "disk": node.disk(),
        "scheduler_rss": rss(scheduler),
    }


def per_message(count: int, name: str, grown: int | None, note: str = "") -> list[Measure]:
    """Two rows: bytes per message, MiB per million."""
    if grown is None:
        return [Measure("m", name, float("nan"), "B", note="not read")]
    each = grown / count
    return [
        Measure("m", f"{name} / message", each, "B", note=note, extra={"grown_bytes": grown}),
        Measure("m", f"{name} / 1M messages", each * 1_000_000 / MIB, "MiB"),
    ]


def measure(count: int, work: Path) -> tuple[list[Measure], dict[str, object]]:
    nodes = RabbitNodes(work / "rabbit", 1)
    nodes.start()
    node = Node(nodes)
    url = nodes.url(0, f"?prefix={PREFIX}")
    try:
        scheduler = start_scheduler(url, work / "scheduler.log")
        try:
            with Queue(f"{url}&scheduler=off", name="memory") as q:
                q.put_many([{"payload": PAYLOAD, "delay": 3600}])  # the queue exists
                q.purge()
                time.sleep(SETTLE_SECONDS)
                before = snapshot(node, scheduler.pid)
                started = time.perf_counter()
                for first in range(0, count, BATCH):
                    size = min(BATCH, count - first)
                    q.put_many([{"payload": PAYLOAD, "delay": 3600}] * size)
                seconds = time.perf_counter() - started
                time.sleep(SETTLE_SECONDS)
                after = snapshot(node, scheduler.pid)
                scheduled = q.stats().scheduled
                log = asyncio.run(read_log(nodes.url(0), f"{PREFIX}.log"))
                q.purge()
        finally:
            stop(scheduler)
    finally:
        nodes.stop()

    def grown(key: str) -> int | None:
        first, last = before[key], after[key]
        return None if first is None or last is None else last - first

    rate = f"{count:,} put in {seconds:.1f} s ({count / seconds:,.0f}/s), {scheduled:,} scheduled"
    measures = [
        *per_message(count, "broker memory (erlang:memory total)", grown("erlang_memory"), rate),
        *per_message(
            count,
            "broker memory (VmRSS of its VM)",
            grown("broker_rss"),
            "moves with the VM's allocator caches too",
        ),
        *per_message(
            count,
            "broker disk (data directory, one replica)",
            grown("disk"),
            f"the log: {log['entries']:,} entries, {log['body_bytes'] / count:.0f} B of "
            f"bodies a message, {log['checkpoints_ended']} checkpoints "
            f"({log['checkpoints_begun']} begun)",
        ),
        *per_message(count, "scheduler memory (VmRSS of delayq scheduler)", grown("scheduler_rss")),
    ]
    return measures, {"before": before, "after": after, "put_seconds": seconds, "log": log}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=None, help="default 1,000,000")
    parser.add_argument("--quick", action="store_true", help="100,000 messages")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    count = args.count or (100_000 if args.quick else 1_000_000)
    if count < 1:
        parser.error("--count must be at least 1")
    env = environment()
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    with TemporaryDirectory(prefix="delayq-amqp-memory-") as work:
        measures, raw = measure(count, Path(work))
    load += " -> " + " ".join(f"{value:.1f}" for value in os.getloadavg())
    print_table(
        f"delayq amqp:// memory and disk: {count:,} scheduled messages of 100 B "
        f"(private node; load average {load})",
        measures,
    )
    quick = "-quick" if args.quick else ""
    write_json(
        args.json or RESULTS_DIR / f"amqp-memory{quick}.json",
        {"benchmark": "amqp-memory", "count": count, "load": load, "raw": raw, "environment": env},
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
