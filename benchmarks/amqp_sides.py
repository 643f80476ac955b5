"""``amqp://``'s client cost, two versions of delayq side by side in one run.

Each row is the CPU the client process spends (every thread of it: ``process_time``)
per item, medians over rounds; in each round the two versions run alternately (the
order flipped every round), each case in a fresh child process whose ``PYTHONPATH``
is that version's ``src``. One ``delayq scheduler`` (of this checkout) serves both, in
a namespace of the run's own, deleted at the end. Rows:

a. sync fast put: ``Queue.put`` one by one (``fast_put=on``, the URL's default);
b. sync plain put: the same with ``fast_put=off`` (a request to the scheduler);
c. async put: ``AsyncQueue.put`` one by one from one task (the default);
d. reserve/ack: ``reserve(max=100, wait=0)`` + ``ack_many`` until the queue is empty
   (the messages put first with ``put_many``, not counted).

Wall time per item is shown too (it moves with the machine's load; the CPU much less)::

    git -C <main checkout> archive HEAD src | tar -x -C /tmp/old
    python benchmarks/amqp_sides.py --old /tmp/old/src [--items 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

NEW_SRC = Path(__file__).resolve().parent.parent / "src"
CASES = {
    "a": "sync fast put",
    "b": "sync plain put",
    "c": "async put",
    "d": "reserve/ack",
}


def child(case: str, url: str, items: int) -> dict[str, float]:
    """Run ``case`` in this process; its CPU and wall time per item in microseconds."""
    from delayq.durable import AsyncQueue, Queue  # noqa: PLC0415 (the side's own delayq)

    queue_name = f"bench-{uuid.uuid4().hex[:8]}"
    if case in ("a", "b"):
        with Queue(f"{url}&fast_put={'on' if case == 'a' else 'off'}", name=queue_name) as q:
            q.put(0, delay=3600)  # connected, the intake declared
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(items):
                q.put(i, delay=3600)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            q.purge()
    elif case == "c":

        async def run() -> tuple[float, float]:
            async with AsyncQueue(url, name=queue_name) as q:
                await q.put(0, delay=3600)
                cpu, wall = time.process_time(), time.perf_counter()
                for i in range(items):
                    await q.put(i, delay=3600)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                await q.purge()
                return cpu, wall

        cpu, wall = asyncio.run(run())
    else:
        with Queue(url, name=queue_name) as q:
            for at in range(0, items, 1000):
                q.put_many({"payload": i} for i in range(at, min(at + 1000, items)))
            q.stats()  # folded
            got = 0
            cpu, wall = time.process_time(), time.perf_counter()
            while messages := q.reserve(max=100, wait=0):
                q.ack_many(messages)
                got += len(messages)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if got != items:
                raise SystemExit(f"reserve/ack: {got} messages of {items}")
    return {"cpu_us": cpu / items * 1e6, "wall_us": wall / items * 1e6}


def run_side(src: Path, case: str, url: str, items: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, "--url", url, "--items", str(items)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--old", type=Path, help="the old version's src directory")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="abcd")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.url, args.items)))
        return
    if args.old is None:
        parser.error("--old is required (the old version's src directory)")
    from delayq.backends.amqp import _url  # noqa: PLC0415, F401 (this checkout's delayq)

    prefix = f"delayq-bench-sides-{uuid.uuid4().hex[:8]}"
    separator = "&" if "?" in args.url else "?"
    base = f"{args.url}{separator}prefix={prefix}"
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "scheduler", "--url", f"{base}&scheduler=on"],
        env=dict(os.environ, PYTHONPATH=str(NEW_SRC)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client_url = f"{base}&scheduler=off"
    sides = {"old": args.old.resolve(), "new": NEW_SRC}
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        case: {"old": [], "new": []} for case in args.cases
    }
    try:
        wait_for_scheduler(client_url)
        for round_ in range(args.rounds):
            order = ["old", "new"] if round_ % 2 == 0 else ["new", "old"]
            for case in args.cases:
                for side in order:
                    results[case][side].append(run_side(sides[side], case, client_url, args.items))
            print(f"round {round_ + 1}/{args.rounds} done, load {os.getloadavg()[0]:.1f}")
    finally:
        scheduler.terminate()
        scheduler.wait(30)
        delete_namespace(args.url, prefix)
    print_rows(results, args.items, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def wait_for_scheduler(url: str) -> None:
    from delayq.durable import Queue  # noqa: PLC0415
    from delayq.errors import SchedulerNotRunning  # noqa: PLC0415

    deadline = time.monotonic() + 60
    with Queue(url, name="ready") as q:
        while True:
            try:
                q.stats()
                return
            except SchedulerNotRunning:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def delete_namespace(url: str, prefix: str) -> None:
    import pika  # noqa: PLC0415 (a dev dependency, as the tests use)

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    for queue in ("log", "meta", "lock", "intake"):
        channel.queue_delete(f"{prefix}.{queue}")
    for exchange in ("rpc", "events"):
        channel.exchange_delete(f"{prefix}.{exchange}")
    connection.close()


def print_rows(results: dict[str, Any], items: int, rounds: int) -> None:
    print(f"\n{items} items a case, medians of {rounds} rounds (old and new alternated)")
    print(
        f"{'row':<18} {'CPU old':>9} {'CPU new':>9} {'new/old':>8}"
        f"   {'wall old':>9} {'wall new':>9}"
    )
    for case, sides in results.items():
        cpu = {side: statistics.median(r["cpu_us"] for r in runs) for side, runs in sides.items()}
        wall = {side: statistics.median(r["wall_us"] for r in runs) for side, runs in sides.items()}
        print(
            f"{CASES[case]:<18} {cpu['old']:>7.1f}us {cpu['new']:>7.1f}us "
            f"{cpu['new'] / cpu['old']:>8.3f}   {wall['old']:>7.1f}us {wall['new']:>7.1f}us"
        )


if __name__ == "__main__":
    main()
