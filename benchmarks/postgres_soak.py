"""A soak of ``postgresql://``: a steady stream of puts drained as they fall due, with the
table's and indexes' sizes and the lateness sampled every minute (issue 19).

    .venv/bin/python benchmarks/postgres_soak.py --url postgresql://... [--minutes 10]
    .venv/bin/python benchmarks/postgres_soak.py --private [--minutes 10]

``--private`` runs it on a server of its own (``initdb`` + ``postgres`` on a free port,
tests/backends/_postgres_server.py), with PostgreSQL's default autovacuum: the sizes
stay bounded only where autovacuum runs. A producer thread puts ``--rate`` messages a
second (batches of 10 every 10 ms, delays drawn from 0 to 1 s); a consumer process
drains them with ``reserve(max=100)`` + ``ack_many`` and reports each minute's p50/p99/
max lateness (its receive time minus ``due_at``). Prints one row a minute, writes
JSON to ``benchmarks/results/postgres-soak.json``. Never asserts.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BATCH = 10


def consume(url: str, queue: str, seconds: float) -> None:
    """The consumer process: drain ``queue``; one JSON line a minute on stdout."""
    import gc  # noqa: PLC0415

    from delayq.durable import Queue  # noqa: PLC0415

    with Queue(url, name=queue) as q:
        q.stats()
        gc.freeze()
        end = time.monotonic() + seconds
        minute_end = time.monotonic() + 60.0
        late: list[float] = []
        while time.monotonic() < end:
            messages = q.reserve(max=100, wait=min(1.0, max(0.0, end - time.monotonic())))
            now_ms = time.time() * 1000.0
            late += [now_ms - m.due_at for m in messages]
            if messages:
                q.ack_many(messages)
            if time.monotonic() >= minute_end:
                late.sort()
                print(json.dumps(_summary(late)), flush=True)
                late, minute_end = [], minute_end + 60.0


def _summary(late: list[float]) -> dict[str, Any]:
    if not late:
        return {"count": 0}
    return {
        "count": len(late),
        "p50_ms": statistics.median(late),
        "p99_ms": late[min(len(late) - 1, int(len(late) * 0.99))],
        "max_ms": late[-1],
        "early": sum(1 for value in late if value < 0),
    }


def sizes(admin: Any, schema: str) -> dict[str, Any]:
    """The table's and each index's size (MB) and the row count."""
    rows = admin.execute(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
        "AND c.relkind IN ('r', 'i') ORDER BY c.relname",
        (schema,),
    ).fetchall()
    out: dict[str, Any] = {name: round(size / 1e6, 2) for name, size in rows}
    count = admin.execute(f'SELECT count(*) FROM "{schema}".messages').fetchone()
    out["rows"] = count[0] if count else None
    return out


def produce(url: str, queue: str, rate: float, stop: threading.Event) -> None:
    from delayq.durable import Queue  # noqa: PLC0415

    rng = random.Random(7)
    step = BATCH / rate
    with Queue(url, name=queue) as q:
        start = time.monotonic()
        i = 0
        while not stop.is_set():
            time.sleep(max(0.0, start + i * step - time.monotonic()))
            q.put_many([{"payload": i, "delay": rng.random()} for _ in range(BATCH)])
            i += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--private", action="store_true", help="a server of its own")
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--rate", type=float, default=1000.0, help="puts per second")
    parser.add_argument("--consume", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.consume:
        consume(args.consume[0], args.consume[1], float(args.consume[2]))
        return 0
    import psycopg  # noqa: PLC0415

    server = None
    if args.private:
        sys.path.insert(0, str(ROOT / "tests"))
        from backends._postgres_server import PrivatePostgres  # noqa: PLC0415

        server = PrivatePostgres()
        base = server.url
    else:
        base = args.url
    schema = f"delayq_soak_{uuid.uuid4().hex[:8]}"
    url = f"{base}{'&' if '?' in base else '?'}schema={schema}"
    queue = "soak"
    seconds = args.minutes * 60.0
    rows: list[dict[str, Any]] = []
    try:
        with psycopg.connect(base, autocommit=True) as admin:
            from delayq.durable import Queue  # noqa: PLC0415

            Queue(url, name=queue).close()  # the schema exists
            consumer = subprocess.Popen(
                [sys.executable, __file__, "--consume", url, queue, str(seconds + 2.0)],
                stdout=subprocess.PIPE,
                text=True,
            )
            stop = threading.Event()
            producer = threading.Thread(target=produce, args=(url, queue, args.rate, stop))
            producer.start()
            assert consumer.stdout is not None
            print("minute | rows | sizes (MB) | lateness p50 / p99 / max ms (early)")
            for minute in range(1, args.minutes + 1):
                line = consumer.stdout.readline()
                late = json.loads(line) if line else {}
                row = {"minute": minute, "sizes": sizes(admin, schema), "lateness": late}
                rows.append(row)
                size_text = ", ".join(
                    f"{name} {value}" for name, value in row["sizes"].items() if name != "rows"
                )
                print(
                    f"{minute} | {row['sizes']['rows']} | {size_text} | "
                    f"{late.get('p50_ms', 0):.2f} / {late.get('p99_ms', 0):.2f} / "
                    f"{late.get('max_ms', 0):.1f} ({late.get('early')})",
                    flush=True,
                )
            stop.set()
            producer.join()
            consumer.wait(30)
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        if server is not None:
            server.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "postgres-soak.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
