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
   (the messages put first with ``put_many`` by another child process, of this checkout);
e. first put: a new ``Queue``'s first put (the object made, its connections opened, the
   put confirmed; its close after it not counted), up to 20 objects one after another
   (not in the default ``--cases``: its items are objects, not puts);
f. consumer loop: a sequential consumer's ``reserve(max=1, wait=5)`` + ``ack_many``
   one message at a time (each ``ack_many`` sends the next reserve ahead, which the
   next ``reserve`` takes; filled as for ``d``; not in the default ``--cases``).

Wall time per item is shown too (it moves with the machine's load; the CPU much less).
With ``--callgrind SMALL,LARGE`` each case runs instead under ``valgrind
--tool=callgrind`` with SMALL and then LARGE items, once a side: the difference of the
two runs' instruction counts over the difference of the items is the client's
instructions per item (start-up, connecting and warm-up cancel out), which hardly
depends on the machine's load::

    git -C <main checkout> archive HEAD src | tar -x -C /tmp/old
    python benchmarks/amqp_sides.py --old /tmp/old/src [--items 2000] [--rounds 5]
    python benchmarks/amqp_sides.py --old /tmp/old/src --callgrind 100,400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
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
    "e": "first put",
    "f": "consumer loop",
}
#: The most objects case ``e`` makes (each opens connections to the broker).
FIRST_PUTS = 20


def child(case: str, url: str, items: int, queue_name: str) -> dict[str, float]:
    """Run ``case`` in this process; its CPU and wall time per item in microseconds."""
    from delayq.durable import AsyncQueue, Queue  # noqa: PLC0415 (the side's own delayq)

    if case == "fill":
        with Queue(url, name=queue_name) as q:
            for at in range(0, items, 1000):
                q.put_many({"payload": i} for i in range(at, min(at + 1000, items)))
            q.stats()  # folded
        return {}
    if case in ("a", "b"):
        with Queue(f"{url}&fast_put={'on' if case == 'a' else 'off'}", name=queue_name) as q:
            q.put(0, delay=3600)  # connected, the intake declared
            cpu, wall = time.process_time(), time.perf_counter()
            for i in range(items):
                q.put(i, delay=3600)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            q.purge()
    elif case == "e":
        items = min(items, FIRST_PUTS)
        cpu = wall = 0.0
        for i in range(items):
            cpu_at, wall_at = time.process_time(), time.perf_counter()
            q = Queue(url, name=queue_name)
            q.put(i, delay=3600)
            cpu += time.process_time() - cpu_at
            wall += time.perf_counter() - wall_at
            q.close()
        with Queue(url, name=queue_name) as q:
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
        most, wait = (100, 0.0) if case == "d" else (1, 5.0)
        with Queue(url, name=queue_name) as q:
            got = 0
            cpu, wall = time.process_time(), time.perf_counter()
            while got < items and (messages := q.reserve(max=most, wait=wait)):
                q.ack_many(messages)
                got += len(messages)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if got != items:
                raise SystemExit(f"reserve/ack: {got} messages of {items}")
    return {"cpu_us": cpu / items * 1e6, "wall_us": wall / items * 1e6}


def command(case: str, url: str, items: int) -> list[str]:
    """The arguments of a child of ``case`` on a queue of its own; that of the
    reserve/ack once another child (of this checkout) filled its queue."""
    line = [__file__, "--url", url, "--items", str(items), "--queue", uuid.uuid4().hex[:8]]
    if case in ("d", "f"):
        run_side(NEW_SRC, [*line, "--child", "fill"])
    return [*line, "--child", case]


def run_side(src: Path, line: list[str]) -> dict[str, float]:
    """Run the child ``line`` on ``src``'s delayq; what it printed."""
    out = subprocess.run(
        [sys.executable, *line],
        env=dict(os.environ, PYTHONPATH=str(src)),
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def instructions(src: Path, case: str, url: str, items: int) -> int:
    """The instructions a child of ``case`` with ``items`` ran, as callgrind counts."""
    env = dict(os.environ, PYTHONPATH=str(src))
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={scratch}/out",
                sys.executable,
                *command(case, url, items),
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def callgrind_rows(
    sides: dict[str, Path], cases: str, url: str, small: int, large: int
) -> dict[str, dict[str, float]]:
    """Per case and side, the instructions per item (old and new alternated)."""
    rows: dict[str, dict[str, float]] = {}
    for case in cases:
        rows[case] = {}
        for side, src in sides.items():
            counts = [instructions(src, case, url, n) for n in (small, large)]
            rows[case][side] = (counts[1] - counts[0]) / (large - small)
        print(f"{CASES[case]}: done", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--old", type=Path, help="the old version's src directory")
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="abcd")
    parser.add_argument("--callgrind", help="SMALL,LARGE: instructions per item instead")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--queue", default="bench", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.url, args.items, args.queue)))
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
        if args.callgrind:
            small, large = (int(n) for n in args.callgrind.split(","))
            rows = callgrind_rows(sides, args.cases, client_url, small, large)
            print(f"\ninstructions per item, callgrind ({large} - {small} items)")
            print(f"{'row':<18} {'old':>10} {'new':>10} {'new/old':>8}")
            for case, by_side in rows.items():
                old, new = by_side["old"], by_side["new"]
                print(f"{CASES[case]:<18} {old:>10,.0f} {new:>10,.0f} {new / old:>8.3f}")
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2) + "\n")
            return
        for round_ in range(args.rounds):
            order = ["old", "new"] if round_ % 2 == 0 else ["new", "old"]
            for case in args.cases:
                for side in order:
                    line = command(case, client_url, args.items)
                    results[case][side].append(run_side(sides[side], line))
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
