"""Shards on ``amqp://``: what N schedulers in N processes decide against one.

Run ``.venv/bin/python benchmarks/amqp_shards.py [--shards 1,2] [--seconds 10]``.
On a private single RabbitMQ node (``_amqp_node.py``), for each count of shards: a
namespace of its own, one ``delayq scheduler`` process a shard (``scheduler_shards=k``),
then CLIENTS client processes (``scheduler=off``) of THREADS threads each, every
thread putting with its outcome (``put_outcome``: a request its shard's scheduler
decides and logs, not a fast put) one message at a time, due in an hour, on queues
spread evenly over the shards, for ``--seconds``. It reports the requests decided a
second, and the scheduler processes' CPU a request (their user and system time over
the run, from ``/proc``). It prints a table and writes JSON to
``benchmarks/results/amqp_shards.json``; it never asserts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from _amqp_node import RabbitNodes, cpu_seconds, stop
from _common import RESULTS_DIR, Measure, environment, print_table, write_json
from delayq.backends._replicated._options import shard_of

#: Client processes, and threads in each.
CLIENTS = 2
THREADS = 8

_CLIENT = """
import sys, threading, time
from delayq import Queue
url, names, seconds = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
counts = []
warm, start = threading.Barrier(len(names) + 1), threading.Barrier(len(names) + 1)
def work(name):
    with Queue(url, name=name) as q:
        q.put_outcome(b"warm", delay=3600)
        warm.wait()
        start.wait()
        done, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            q.put_outcome(b"x" * 100, delay=3600)
            done += 1
        counts.append(done)
threads = [threading.Thread(target=work, args=(name,)) for name in names]
for thread in threads:
    thread.start()
warm.wait()
print("ready", flush=True)
sys.stdin.readline()
start.wait()
for thread in threads:
    thread.join()
print(sum(counts), flush=True)
"""


def start_shard(url: str, shard: int, log: Path) -> subprocess.Popen[bytes]:
    """``delayq scheduler`` standing for ``shard`` alone, once elected."""
    command = [str(Path(sys.executable).with_name("delayq")), "scheduler", "--url"]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*command, f"{url}&scheduler_shards={shard}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while not re.search(r"scheduler_elected .*namespace=", log.read_text(errors="replace")):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"delayq scheduler did not lead shard {shard}: see {log}")
        time.sleep(0.05)
    return process


def names_for(shards: int, count: int) -> list[str]:
    """``count`` queue names (a multiple of ``shards``), as many on each shard, in
    turn: shard 0's first, shard 1's first..."""
    each: dict[int, list[str]] = {k: [] for k in range(shards)}
    for i in itertools.count():
        name = f"q{i}"
        mine = each[shard_of(name, shards)]
        if len(mine) < count // shards:
            mine.append(name)
        if sum(map(len, each.values())) == count:
            break
    return [each[k][j] for j in range(count // shards) for k in range(shards)]


def measure(nodes: RabbitNodes, work: Path, shards: int, seconds: float) -> dict[str, float]:
    url = nodes.url(0, f"?prefix=delayq-bench-shards-{shards}&shards={shards}")
    schedulers = [start_shard(url, k, work / f"shards-{shards}-{k}.log") for k in range(shards)]
    clients: list[subprocess.Popen[str]] = []
    try:
        names = names_for(shards, CLIENTS * THREADS)
        for c in range(CLIENTS):
            mine = ",".join(names[c * THREADS : (c + 1) * THREADS])
            command = [sys.executable, "-c", _CLIENT, f"{url}&scheduler=off", mine, str(seconds)]
            clients.append(
                subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            )
        for client in clients:
            assert client.stdout is not None
            assert client.stdout.readline().strip() == "ready"
        before = [cpu_seconds(process.pid) for process in schedulers]
        started = time.monotonic()
        for client in clients:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
        done = 0
        for client in clients:
            assert client.stdout is not None
            done += int(client.stdout.readline())
        took = time.monotonic() - started
        spent = [cpu_seconds(p.pid) - b for p, b in zip(schedulers, before, strict=True)]
        return {
            "requests": done,
            "rate": done / took,
            "scheduler_cpu_us": sum(spent) / done * 1e6,
            "busiest_scheduler_cpu": max(spent) / took,
        }
    finally:
        for client in clients:
            if client.poll() is None:
                client.kill()
            client.communicate()
        for process in schedulers:
            stop(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", default="1,2", help="counts of shards, default 1,2")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    counts = [int(count) for count in args.shards.split(",")]
    env = environment()
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    measures: list[Measure] = []
    raw: dict[str, dict[str, float]] = {}
    with TemporaryDirectory(prefix="delayq-shards-") as work:
        nodes = RabbitNodes(Path(work) / "rabbit", 1)
        nodes.start()
        try:
            for shards in counts:
                found = measure(nodes, Path(work), shards, args.seconds)
                raw[str(shards)] = found
                print(f"{shards} shard(s): {found}", flush=True)
                measures.append(
                    Measure(
                        "s",
                        f"put_outcome, {CLIENTS}x{THREADS} threads, {shards} shard(s)",
                        found["rate"],
                        "req/s",
                        note=f"{shards} scheduler process(es); their CPU "
                        f"{found['scheduler_cpu_us']:.0f} us a request, the busiest at "
                        f"{found['busiest_scheduler_cpu']:.0%} of a core",
                    )
                )
        finally:
            nodes.stop()
    load += " -> " + " ".join(f"{value:.1f}" for value in os.getloadavg())
    path = args.json or RESULTS_DIR / "amqp_shards.json"
    title = f"delayq amqp:// shards (private node, {os.cpu_count()} CPUs; load {load})"
    print_table(title, measures)
    document = {"benchmark": "amqp_shards", "shards": counts, "load": load, "raw": raw}
    write_json(path, {**document, "environment": env}, measures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
