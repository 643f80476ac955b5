"""delayq's ``amqp://`` backend against Celery on the same RabbitMQ, with the broker's
floors, in one run and one table (issue 18).

    .venv/bin/python benchmarks/peers/celery_vs.py \\
        [--url amqp://guest:guest@127.0.0.1:5672/%2F] [--redis redis://127.0.0.1:6379/14] [--quick]

Run with delayq's own environment (``make lint`` makes it). In order, on the broker of
``--url``:

1. ``benchmarks/amqp_floors.py --sections abc``: floor 1 (publish one by one to a quorum
   queue, each confirm awaited), floor 2 (1000 confirms in flight), floor 3 (consume
   with prefetch 1000, ack every 100);
2. ``benchmarks/durable.py`` on a namespace of its own (``prefix=delayq-test-vs-<hex>``,
   ``scheduler=off``) with the scheduler alone in a process of its own
   (``delayq scheduler``, the deployment docs/rabbitmq.md measures); the namespace's
   queues and exchanges are deleted afterwards;
3. ``celery_bench.py`` (Celery with quorum queues and native delayed delivery) in
   ``benchmarks/peers/.venv-celery``, made from ``celery-requirements.txt`` when it is
   missing or the file changed; it records job starts in the empty Redis database
   ``--redis`` and deletes what it declared.

It prints one table and writes every report to
``benchmarks/results/peers-amqp.json`` (``-quick`` with ``--quick``). Never asserts.
The two columns measure each library through its own API: delayq's drain is
``reserve(max=100)`` + ``ack_many`` with no worker, Celery's runs each job through its
worker (see README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import _driver as driver

VENV = driver.HERE / ".venv-celery"
REQUIREMENTS = driver.HERE / "celery-requirements.txt"
FLOORS = {
    "floor 1": "quorum: publish one by one, wait each confirm",
    "floor 2": "quorum: 1000 publishes with confirms in flight",
    "floor 3": "quorum: consume, prefetch 1000, ack every 100",
}

ROWS: list[driver.Row] = [
    ("enqueue one by one (/s)", ("enqueue_per_second",)),
    ("put_many, batches of 1000 (/s)", ("put_many_per_second",)),
    ("16 producers at once (/s)", ("producers_16_per_second",)),
    ("drain (/s)", ("drain", "jobs_per_second")),
    *driver.LATENESS_ROWS,
]


def floors_run(url: str, quick: bool, suffix: str) -> dict[str, float | None]:
    """Floors 1-3 of issue 18 measured now, by ``benchmarks/amqp_floors.py``."""
    path = driver.RESULTS / f"amqp-floors-peers{suffix}.json"
    command = [sys.executable, str(driver.ROOT / "benchmarks" / "amqp_floors.py"), "--url", url]
    command += ["--sections", "abc", "--json", str(path), *(["--quick"] if quick else [])]
    subprocess.run(command, check=True)
    by_name = {m["name"]: m["value"] for m in json.loads(path.read_text())["measures"]}
    return {floor: by_name.get(name) for floor, name in FLOORS.items()}


def start_scheduler(url: str, log: Path) -> subprocess.Popen[bytes]:
    """``delayq scheduler`` on ``url``'s namespace, once it answers a request."""
    from delayq import Queue  # noqa: PLC0415 (delayq's venv; the peer's has none)

    command = [str(Path(sys.executable).with_name("delayq")), "scheduler", "--url", url]
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        with Queue(driver.with_params(url, scheduler="off"), name="ready") as probe:
            probe.stats()  # waits for a scheduler to answer (its request timeout)
    except BaseException:
        driver.stop(process)
        raise
    return process


async def delete_namespace(url: str, prefix: str) -> None:
    """Delete the queues and exchanges of the namespace ``prefix``."""
    import aiormq  # noqa: PLC0415 (delayq's amqp extra)

    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        for queue in (f"{prefix}.log", f"{prefix}.meta", f"{prefix}.lock", f"{prefix}.intake"):
            await channel.queue_delete(queue)
        for exchange in (f"{prefix}.rpc", f"{prefix}.events"):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()


def delayq_run(url: str, quick: bool, suffix: str) -> dict[str, Any]:
    prefix = f"delayq-test-vs-{uuid.uuid4().hex[:8]}"
    namespace = driver.with_params(url, prefix=prefix)
    work = driver.HERE / "results"
    work.mkdir(parents=True, exist_ok=True)
    try:
        scheduler = start_scheduler(namespace, work / "delayq-scheduler.log")
        try:
            path = driver.RESULTS / f"durable-amqp-peers{suffix}.json"
            plain = driver.with_params(namespace, scheduler="off")
            by_name = driver.run_durable(plain, quick, path)
        finally:
            driver.stop(scheduler)
    finally:
        asyncio.run(delete_namespace(url, prefix))
    return {
        "peer": "delayq",
        "enqueue_per_second": by_name.get("put one by one"),
        "floor_1_alternated": by_name.get("floor 1: quorum publish one by one, confirm awaited"),
        "put_many_per_second": by_name.get("put_many, batches of 1000"),
        "producers_16_per_second": by_name.get("put one by one, AsyncQueue, 16 tasks at once"),
        "drain": {"jobs_per_second": by_name.get("drain: reserve(max=100) + ack_many")},
        "lateness": driver.delayq_lateness(by_name),
        "scheduler": "delayq scheduler, a process of its own",
    }


def celery_run(url: str, redis_url: str, quick: bool, suffix: str) -> dict[str, Any]:
    python = driver.ensure_venv(VENV, REQUIREMENTS)
    path = driver.HERE / "results" / f"celery-vs{suffix}.json"
    command = [str(python), str(driver.HERE / "celery_bench.py"), "--broker", url]
    command += ["--redis", redis_url, "--json", str(path), *(["--quick"] if quick else [])]
    subprocess.run(command, check=True)
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14", help="an empty Redis db")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    args = parser.parse_args()
    suffix = "-quick" if args.quick else ""
    loads = {"start": load()}
    floors = floors_run(args.url, args.quick, suffix)
    loads["after floors"] = load()
    delayq = delayq_run(args.url, args.quick, suffix)
    loads["after delayq"] = load()
    celery = celery_run(args.url, args.redis, args.quick, suffix)
    loads["after celery"] = load()
    driver.RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"floors": floors, "load_average": loads, "reports": [delayq, celery]}
    (driver.RESULTS / f"peers-amqp{suffix}.json").write_text(json.dumps(out, indent=2))
    driver.print_table([delayq, celery], ROWS)
    print("\nthe broker's floors in this run (benchmarks/amqp_floors.py):")
    for floor, name in FLOORS.items():
        value = floors[floor]
        print(f"- {floor}, {name}: " + ("-" if value is None else f"{value:,.0f}/s"))
    put, alternated = delayq["enqueue_per_second"], delayq["floor_1_alternated"]
    if put and alternated:
        print(
            f"- floor 1 timed by durable.py in alternate rounds with delayq's puts one by "
            f"one: {alternated:,.0f}/s; the puts {put / alternated:.0%} of it"
        )
    print("load average (1/5/15 min): " + "; ".join(f"{k} {v}" for k, v in loads.items()))
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    sys.exit(code)
