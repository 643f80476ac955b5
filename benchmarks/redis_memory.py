"""Memory per scheduled message on ``redis://`` (issue 4).

Run ``.venv/bin/python benchmarks/redis_memory.py [--url redis://127.0.0.1:6379/0]
[--count 100000]``. It puts ``count`` messages due in an hour, each with a 100-byte
payload (once as JSON, once as raw bytes), under a fresh key prefix, and reports bytes
per message two ways: ``MEMORY USAGE ... SAMPLES 0`` (exact) over the queue's keys,
and the growth of ``INFO memory`` ``used_memory`` (which other clients of the server
can disturb). It prints a table, writes JSON and deletes its keys; it never asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import redis

from _common import RESULTS_DIR, Measure, environment, print_table, write_json
from delayq.durable import Queue

GOAL = 300.0
BATCH = 1000


def measure(url: str, count: int, payload: object, label: str) -> list[Measure]:
    """Put ``count`` scheduled messages of ``payload``; bytes per message both ways."""
    prefix = f"bench-mem-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    before = int(client.info("memory")["used_memory"])
    try:
        with Queue(f"{url}?prefix={prefix}", name="mem") as q:
            for start in range(0, count, BATCH):
                q.put_many([{"payload": payload, "delay": 3600}] * min(BATCH, count - start))
            time.sleep(0.2)
            grown = int(client.info("memory")["used_memory"]) - before
            keys = list(client.scan_iter(match=f"{prefix}:*"))
            exact = sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)
            q.purge()
    finally:
        leftover = list(client.scan_iter(match=f"{prefix}:*"))
        if leftover:
            client.delete(*leftover)
        client.close()
    per, grown_per = exact / count, grown / count
    return [
        Measure("m", f"{label}: MEMORY USAGE / message", per, "B", f"<= {GOAL:g} B", per <= GOAL),
        Measure("m", f"{label}: used_memory growth / message", grown_per, "B"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, measure, print, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "redis-memory.json")
    args = parser.parse_args(argv)
    env = environment()
    # A JSON string of 98 characters serializes to 100 bytes.
    measures = measure(args.url, args.count, "x" * 98, "100-byte JSON payload")
    measures += measure(args.url, args.count, b"x" * 100, "100-byte raw payload")
    print_table(f"delayq redis memory: {args.count:,} scheduled messages", measures)
    write_json(
        args.json,
        {"benchmark": "redis-memory", "url": args.url, "count": args.count, "environment": env},
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
