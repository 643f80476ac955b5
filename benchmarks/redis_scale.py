"""Scale benchmark of ``redis://`` (issue 4): a million scheduled messages, and a burst
of messages all due in the same second.

Run ``.venv/bin/python benchmarks/redis_scale.py [--url redis://127.0.0.1:6379/9]``.
The database of the URL must be empty (the run refuses otherwise, so it never mixes
with anyone's data) and is flushed at the end, whatever happens. It prints a table
(measure, target, PASS/MISS) and writes JSON to ``benchmarks/results/redis-scale.json``;
it never asserts.

Sections

a. ``--count`` (1,000,000) messages with a 100-byte payload (a JSON string that
   serializes to 100 bytes), due over the next day, put with ``put_many`` in batches of
   1000: the put_many rate (time spent inside ``put_many``), the growth of ``INFO
   memory`` ``used_memory`` per message (which other clients of the server can
   disturb), and ``MEMORY USAGE`` of the queue's keys per message.
b. ``--burst`` (100,000) messages due at random instants of one and the same second,
   put before that second comes, drained by ``--consumers`` (4) consumer processes
   that loop on ``reserve(max=100)`` and ``ack_many`` each batch. How late the last one
   is delivered (its receive time minus its ``due_at``; target: within 5 s), the
   lateness percentiles, the rate from the first delivery to the last, and lost,
   duplicate and early deliveries (all must be 0). Consumers and Redis share this
   machine's CPUs.
c. An idle consumer: another process loops on ``reserve()`` (no ``wait``: until a
   message is due) on an empty queue, on a queue whose only message is due in an hour,
   and on a queue of 4 shards (``?shards=4``) with the same message. The commands it
   sends per second over ``IDLE_SECONDS`` (target: at most 5), read from ``MONITOR``
   (clients other than the consumer must leave the server alone meanwhile; the
   commands its scripts run are listed in the note, not counted); then a message put
   due now must reach it, and how late it came is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

from _common import (
    RESULTS_DIR,
    Measure,
    console,
    environment,
    fresh_heap,
    parse_sections,
    print_table,
    spawn_ready,
    write_json,
)
from delayq.durable import Queue

DEFAULT_URL = "redis://127.0.0.1:6379/9"
SECTIONS = ("a", "b", "c")
BATCH = 1_000
#: A JSON string of 98 characters serializes to 100 bytes.
PAYLOAD = "x" * 98
MEMORY_GOAL = 300.0
PUT_MANY_TARGET = 60_000.0
BURST_TARGET_S = 5.0
#: ``MEMORY USAGE ... SAMPLES``: enough for uniform messages, and a short call on a
#: shared server (0, exact, walks every field of a million-field hash).
MEMORY_SAMPLES = 10_000
#: A consumer gives up this long after the burst's second, whatever happened.
GIVE_UP_S = 90.0
IDLE_TARGET = 5.0
IDLE_SECONDS = 20.0
#: What the benchmark ECHOes to end its MONITOR.
STOP_MONITOR = "delayq-bench-stop"
#: Section c's cases: label, shards, whether a message waits due in an hour.
IDLE_CASES = (
    ("empty queue", 1, False),
    ("a message due in an hour", 1, True),
    ("4 shards, a message due in an hour", 4, True),
)


def database_of(url: str) -> int:
    """The database number of a ``redis://`` URL (0 when absent)."""
    path = urlsplit(url).path.strip("/")
    return int(path) if path else 0


def check_empty(client: redis.Redis, url: str) -> None:
    """Refuse to run on a database that holds anything."""
    size = int(client.dbsize())
    if size:
        raise SystemExit(
            f"{url}: database {database_of(url)} holds {size} keys; this benchmark needs an "
            "empty database (it flushes it at the end). Pick another with --url."
        )


def used_memory(client: redis.Redis) -> int:
    """``used_memory`` of ``INFO memory``, in bytes."""
    return int(client.info("memory")["used_memory"])


# -- a: a million scheduled messages -----------------------------------------------------


def section_million(url: str, client: redis.Redis, count: int) -> tuple[list[Measure], float]:
    """Section a; also returns the put_many rate (section b sizes its head start on it)."""
    rng = random.Random(1)
    spent = 0.0
    with Queue(url, name="scale-million") as q:
        q.stats()  # connect and load the scripts outside the timing
        before = used_memory(client)
        wall = time.perf_counter()
        for start in range(0, count, BATCH):
            batch = [
                {"payload": PAYLOAD, "delay": 3600 + rng.random() * 86_400}
                for _ in range(min(BATCH, count - start))
            ]
            t0 = time.perf_counter()
            q.put_many(batch)
            spent += time.perf_counter() - t0
        wall = time.perf_counter() - wall
        stored = q.stats().scheduled
    time.sleep(0.2)
    grown = used_memory(client) - before
    sizes: dict[str, int] = {}
    started = time.perf_counter()
    for key in client.scan_iter(count=1000):
        sizes[key.decode(errors="replace")] = int(
            client.memory_usage(key, samples=MEMORY_SAMPLES) or 0
        )
    usage_seconds = time.perf_counter() - started
    rate = count / spent
    exact = sum(sizes.values()) / count
    per_key = {name: round(size / count, 1) for name, size in sorted(sizes.items())}
    note_keys = ", ".join(f"{name.rsplit(':', 1)[-1]} {size:g}" for name, size in per_key.items())
    return [
        Measure(
            "a",
            f"put_many, batches of {BATCH}, {count:,} messages",
            rate,
            "items/s",
            f">= {PUT_MANY_TARGET:,.0f}/s",
            rate >= PUT_MANY_TARGET,
            note=f"{wall:.1f} s wall with building the batches",
            extra={"seconds_in_put_many": spent, "wall_seconds": wall},
        ),
        Measure(
            "a",
            "messages stored",
            stored,
            "count",
            f"{count:,}",
            stored == count,
        ),
        Measure(
            "a",
            "MEMORY USAGE of the keys / message",
            exact,
            "B",
            f"<= {MEMORY_GOAL:g} B",
            exact <= MEMORY_GOAL,
            note=f"B/msg: {note_keys}",
            extra={"bytes_per_key": sizes, "samples": MEMORY_SAMPLES, "seconds": usage_seconds},
        ),
        Measure(
            "a",
            "used_memory growth / message",
            grown / count,
            "B",
            note="INFO memory; includes allocator overhead and other clients",
            extra={"used_memory_growth": grown},
        ),
    ], rate


# -- b: a burst due in one second ---------------------------------------------------------


def run_consumer(url: str, name: str, second: float) -> int:
    """The ``--consumer`` mode: drain ``name`` until nothing is left after the burst's
    second; print a JSON report of [id, receive epoch ms, due_at] per delivery."""
    received: list[tuple[str, float, int]] = []
    give_up = second + GIVE_UP_S
    cpu = 0.0
    with Queue(url, name=name) as q:
        q.stats()  # connected, scripts loaded
        print("ready", flush=True)
        cpu = time.process_time()
        while time.time() < give_up:
            messages = q.reserve(max=100, wait=max(0.0, min(1.0, give_up - time.time())))
            now_ms = time.time() * 1000.0
            if not messages:
                if time.time() > second + 1.0:  # everything is due: nothing left to claim
                    break
                continue
            for message in messages:
                received.append((message.id, now_ms, message.due_at))
            q.ack_many(messages)
    print(json.dumps({"received": received, "cpu_seconds": time.process_time() - cpu}))
    return 0


def section_burst(
    url: str, client: redis.Redis, burst: int, consumers: int, put_rate: float
) -> list[Measure]:
    """Section b: put ``burst`` messages due within one second, drain with consumers."""
    name = f"scale-burst-{random.getrandbits(32):08x}"
    # The second comes once every message is in (sized on the put_many rate), plus slack.
    head_start = max(3.0, 1.5 * burst / put_rate + 1.0)
    second = float(math.ceil(time.time() + head_start))
    script = str(Path(__file__).resolve())
    children = spawn_ready(
        [sys.executable, script, "--url", url, "--consumer", name, repr(second)], consumers
    )
    try:
        rng = random.Random(2)
        ids: list[str] = []
        with Queue(url, name=name) as q:
            for start in range(0, burst, BATCH):
                ids += q.put_many(
                    [
                        {"payload": PAYLOAD, "at": second + rng.randrange(1000) / 1000.0}
                        for _ in range(min(BATCH, burst - start))
                    ]
                )
            margin = second - time.time()
            time.sleep(max(0.0, margin))
            cpu_before = server_cpu(client)
            reports = [
                child.communicate(timeout=second - time.time() + GIVE_UP_S + 30)[0]
                for child in children
            ]
        redis_cpu = server_cpu(client) - cpu_before
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    parsed = [json.loads(report) for report in reports]
    deliveries = [row for report in parsed for row in report["received"]]
    per_consumer = [len(report["received"]) for report in parsed]
    consumer_cpu = sum(float(report["cpu_seconds"]) for report in parsed)
    return burst_measures(ids, deliveries, per_consumer, second, margin, (redis_cpu, consumer_cpu))


def server_cpu(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (user + system, main thread and others)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def burst_measures(
    ids: list[str],
    deliveries: list[list[Any]],
    per_consumer: list[int],
    second: float,
    margin: float,
    cpu: tuple[float, float],
) -> list[Measure]:
    """The measures of section b from every consumer's deliveries; ``cpu`` holds the
    CPU seconds Redis and the consumers (together) spent from the second on."""
    seen: dict[str, int] = {}
    for id, _, _ in deliveries:
        seen[id] = seen.get(id, 0) + 1
    lost = sum(1 for id in ids if id not in seen)
    duplicates = sum(n - 1 for n in seen.values())
    late = sorted(now - due for _, now, due in deliveries)
    early = sum(1 for value in late if value < 0)
    received = sorted(now for _, now, _ in deliveries)
    worst = late[-1] / 1000.0 if late else math.nan
    span = (received[-1] - received[0]) / 1000.0 if received else math.nan
    rate = len(deliveries) / span if span and span > 0 else math.nan
    end_after = (received[-1] / 1000.0 - (second + 1.0)) if received else math.nan
    drain = max(received[-1] / 1000.0 - second, 1e-9) if received else math.nan
    p50 = statistics.median(late) / 1000.0 if late else math.nan
    p99 = late[min(len(late) - 1, int(len(late) * 0.99))] / 1000.0 if late else math.nan
    count = len(ids)
    return [
        Measure(
            "b",
            f"{count:,} due in one second: lateness of the last",
            worst,
            "s",
            f"<= {BURST_TARGET_S:g} s",
            worst <= BURST_TARGET_S and lost == 0,
            note=f"last delivery {end_after:.2f} s after the second ended",
        ),
        Measure("b", "lateness p50", p50, "s"),
        Measure("b", "lateness p99", p99, "s"),
        Measure(
            "b",
            f"drain rate, {len(per_consumer)} consumers",
            rate,
            "items/s",
            note="first to last delivery; per consumer " + "/".join(map(str, per_consumer)),
        ),
        Measure(
            "b",
            "CPU during the drain: Redis / consumers",
            100.0 * cpu[0] / drain,
            "%",
            note=f"consumers {100.0 * cpu[1] / drain:.0f}% (summed; 100% = one core)",
            extra={"redis_cpu_seconds": cpu[0], "consumer_cpu_seconds": cpu[1], "span": drain},
        ),
        Measure("b", "lost", lost, "count", "0", lost == 0),
        Measure("b", "duplicates", duplicates, "count", "0", duplicates == 0),
        Measure("b", "early", early, "count", "0", early == 0),
        Measure(
            "b",
            "head start: all put before the second",
            margin,
            "s",
            "> 0",
            margin > 0,
            note="time left between the last put_many and the burst's second",
        ),
    ]


# -- c: an idle consumer ----------------------------------------------------------------------


def run_idle_consumer(url: str, name: str) -> int:
    """The ``--idle-consumer`` mode: loop on ``reserve()`` until the message ``"stop"``
    comes; print a JSON report of how late it came (ms)."""
    with Queue(url, name=name) as q:
        q.stats()  # connected, scripts loaded
        print("ready", flush=True)
        while True:
            for message in q.reserve():
                q.ack(message)
                if message.payload == "stop":
                    late = time.time() * 1000.0 - message.due_at
                    print(json.dumps({"late_ms": late}), flush=True)
                    return 0


class CommandLog:
    """Every command the server runs, as ``MONITOR`` shows it, as (server time,
    whether a script ran it, the command's name), read by a thread while in its ``with`` block."""

    def __init__(self, url: str) -> None:
        self.entries: list[tuple[float, bool, str]] = []
        self._url = url
        self._client = redis.Redis.from_url(url)
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        with self._client.monitor() as monitor:
            for entry in monitor.listen():
                if entry["command"] == f"ECHO {STOP_MONITOR}":
                    return
                name = str(entry["command"]).split(" ", 1)[0].lower()
                self.entries.append((float(entry["time"]), entry["client_type"] == "lua", name))

    def __enter__(self) -> CommandLog:
        self._thread.start()
        time.sleep(0.1)  # MONITOR sent
        return self

    def __exit__(self, *exc: object) -> None:
        with redis.Redis.from_url(self._url) as client:
            client.echo(STOP_MONITOR)
        self._thread.join(5)
        self._client.close()

    def between(self, start: float, end: float, *, scripts: bool) -> dict[str, int]:
        """Calls per command from ``start`` to ``end`` (epoch s): those clients sent, or
        (``scripts``) those the scripts they called ran."""
        counts: dict[str, int] = {}
        for at, by_script, name in list(self.entries):
            if start <= at < end and by_script == scripts:
                counts[name] = counts.get(name, 0) + 1
        return counts


def with_shards(url: str, shards: int) -> str:
    """``url`` with ``shards=`` in its query (as is for one shard)."""
    if shards == 1:
        return url
    parts = urlsplit(url)
    query = f"{parts.query}&shards={shards}" if parts.query else f"shards={shards}"
    return parts._replace(query=query).geturl()


def section_idle(url: str) -> list[Measure]:
    """Section c: the command rate of an idle consumer, then its wake-up."""
    out: list[Measure] = []
    script = str(Path(__file__).resolve())
    for label, shards, later in IDLE_CASES:
        case_url = with_shards(url, shards)
        name = f"scale-idle-{random.getrandbits(32):08x}"
        log = CommandLog(url)
        with Queue(case_url, name=name) as q, log:
            if later:
                q.put("later", delay=3600)
            child = subprocess.Popen(
                [sys.executable, script, "--url", case_url, "--idle-consumer", name],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert child.stdout is not None
                if child.stdout.readline().strip() != "ready":
                    raise SystemExit("the idle consumer did not start")
                time.sleep(1.0)  # into its wait
                start = time.time()
                time.sleep(IDLE_SECONDS)
                end = time.time()
                q.put("stop")
                report = json.loads(child.communicate(timeout=30)[0])
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
        sent = log.between(start, end, scripts=False)
        inside = log.between(start, end, scripts=True)
        per_second = sum(sent.values()) / IDLE_SECONDS
        out.append(
            Measure(
                "c",
                f"idle consumer, {label}: commands it sends",
                per_second,
                "per s",
                f"<= {IDLE_TARGET:g}/s",
                per_second <= IDLE_TARGET,
                note=f"in {IDLE_SECONDS:g} s: {_counted(sent)}; in its scripts: {_counted(inside)}",
                extra={"sent": sent, "in_scripts": inside},
            )
        )
        out.append(
            Measure(
                "c",
                f"idle consumer, {label}: then a put due now, late by",
                float(report["late_ms"]),
                "ms",
                note="the message that ends its wait",
            )
        )
    return out


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items())) or "none"


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the sections on an empty database, flush it, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default=DEFAULT_URL, help="redis URL; its database must be empty")
    parser.add_argument("--sections", help=f"comma-separated, of {','.join(SECTIONS)}")
    parser.add_argument("--count", type=int, default=1_000_000, help="messages of section a")
    parser.add_argument("--burst", type=int, default=100_000, help="messages of section b")
    parser.add_argument("--consumers", type=int, default=4, help="consumer processes of b")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "redis-scale.json")
    parser.add_argument("--consumer", nargs=2, metavar=("NAME", "SECOND"), help=argparse.SUPPRESS)
    parser.add_argument("--idle-consumer", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.consumer:
        return run_consumer(args.url, args.consumer[0], float(args.consumer[1]))
    if args.idle_consumer:
        return run_idle_consumer(args.url, args.idle_consumer)

    sections = parse_sections(args.sections, SECTIONS)
    client = redis.Redis.from_url(args.url)
    check_empty(client, args.url)
    env = environment()
    measures: list[Measure] = []
    timings: dict[str, float] = {}
    started = time.perf_counter()
    put_rate = PUT_MANY_TARGET / 2
    try:
        if "a" in sections:
            console.print(f"section a: {args.count:,} scheduled messages ...", style="dim")
            t0 = time.perf_counter()
            found, put_rate = section_million(args.url, client, args.count)
            measures += found
            client.flushdb(asynchronous=True)
            timings["a"] = time.perf_counter() - t0
            fresh_heap()
        if "b" in sections:
            console.print(
                f"section b: {args.burst:,} due in one second, {args.consumers} consumers ...",
                style="dim",
            )
            t0 = time.perf_counter()
            measures += section_burst(args.url, client, args.burst, args.consumers, put_rate)
            timings["b"] = time.perf_counter() - t0
            client.flushdb(asynchronous=True)
        if "c" in sections:
            console.print(f"section c: an idle consumer, {len(IDLE_CASES)} cases ...", style="dim")
            t0 = time.perf_counter()
            measures += section_idle(args.url)
            timings["c"] = time.perf_counter() - t0
    finally:
        client.flushdb(asynchronous=True)
        client.close()
    total = time.perf_counter() - started
    print_table(f"delayq redis scale: {args.url} ({total:.0f} s)", measures)
    write_json(
        args.json,
        {
            "benchmark": "redis-scale",
            "url": args.url,
            "count": args.count,
            "burst": args.burst,
            "consumers": args.consumers,
            "payload_bytes": len(json.dumps(PAYLOAD)),
            "environment": env,
            "section_seconds": timings,
            "total_seconds": total,
        },
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
