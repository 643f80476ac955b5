"""What a NOTIFY costs concurrent commits on PostgreSQL, and what delayq's puts do about it
(issue 19).

    .venv/bin/python benchmarks/postgres_notify.py --url postgresql://... [--rows 4000]

PostgreSQL serializes the commits of transactions that notified: each takes a
cluster-wide lock (an AccessExclusiveLock on the ``pg_database`` object, seen in
``pg_locks``) in its pre-commit and holds it through its WAL flush, so concurrent
notifying transactions cannot share a flush (no group commit). Rows, each one
committed single-row INSERT into a scratch table of the URL's schema, by one
connection and by ``--threads`` connections at once:

* plain: the INSERT alone (the floor);
* notify in the transaction: ``INSERT ... RETURNING`` + ``pg_notify`` in one
  statement, as every put did before;
* notify after commit: the INSERT, then ``pg_notify`` as a second statement (its
  own transaction: a second round trip, and a put whose process dies between the two
  is never announced);
* delayq put: ``Queue.put`` (notifies only when a consumer sleeps past the message;
  none does here).

For the concurrent rows the note says how many sessions were seen waiting for the
notify lock (``pg_locks`` sampled every 5 ms). Prints a table, writes JSON to
``benchmarks/results/postgres-notify.json``. Never asserts.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from _common import RESULTS_DIR, Measure, environment, print_table, write_json
from delayq.backends.postgres._url import parse_url
from delayq.durable import Queue

_WAITING = """SELECT count(*) FROM pg_locks
WHERE locktype = 'object' AND classid = 'pg_database'::regclass AND NOT granted"""


def rate(
    conninfo: str, threads: int, rows: int, step: Callable[[Any, int], None]
) -> tuple[float, int]:
    """Rows per second of ``step`` over ``threads`` connections; the most sessions seen
    waiting for the notify lock meanwhile."""
    conns = [psycopg.connect(conninfo, autocommit=True) for _ in range(threads)]
    most = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal most
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while not done.wait(0.005):
                row = conn.execute(_WAITING).fetchone()
                most = max(most, row[0] if row else 0)

    def work(conn: Any) -> None:
        for i in range(rows // threads):
            step(conn, i)

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [threading.Thread(target=work, args=(conn,)) for conn in conns]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    for conn in conns:
        conn.close()
    return rows // threads * threads / elapsed, most


def main(argv: list[str] | None = None) -> int:
    """Run every case alternately ``--rounds`` times; report the best of each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "postgres-notify.json")
    args = parser.parse_args(argv)
    settings = parse_url(args.url)
    schema = f'"{settings.schema}"'
    table = f"{schema}.bench_notify_{uuid.uuid4().hex[:8]}"
    channel = f"bench_notify_{uuid.uuid4().hex[:8]}"
    env = environment()
    with psycopg.connect(settings.conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(f"CREATE TABLE {table} (n integer, payload bytea)")
    insert = f"INSERT INTO {table} VALUES (%s, %s)"
    payload = b'{"n": 1}'
    queue = Queue(args.url, name=f"bench-notify-{uuid.uuid4().hex[:8]}")

    def plain(conn: Any, i: int) -> None:
        conn.execute(insert, (i, payload))

    def notify_in(conn: Any, i: int) -> None:
        conn.execute(
            f"WITH i AS ({insert} RETURNING n) SELECT pg_notify('{channel}', n::text) FROM i",
            (i, payload),
        )

    def notify_after(conn: Any, i: int) -> None:
        conn.execute(insert, (i, payload))
        conn.execute(f"SELECT pg_notify('{channel}', %s::text)", (i,))

    def put(conn: Any, i: int) -> None:
        queue.put({"n": i})

    cases = {
        "plain INSERT": plain,
        "INSERT + NOTIFY in the transaction": notify_in,
        "INSERT, then NOTIFY after commit": notify_after,
        "delayq put (Queue.put)": put,
    }
    best: dict[tuple[str, int], tuple[float, int]] = {}
    try:
        queue.put({"n": -1})  # schema created, pool open
        for _ in range(args.rounds):
            for name, step in cases.items():
                for threads in (1, args.threads):
                    got = rate(settings.conninfo, threads, args.rows, step)
                    key = (name, threads)
                    best[key] = max(best.get(key, got), got)
    finally:
        queue.purge()
        queue.close()
        with psycopg.connect(settings.conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    measures = []
    for (name, threads), (value, waiting) in best.items():
        label = "one connection" if threads == 1 else f"{threads} connections at once"
        note = "" if threads == 1 else f"up to {waiting} sessions seen waiting for the notify lock"
        measures.append(Measure("a", f"{name}, {label}", value, "items/s", note=note))
    print_table(f"PostgreSQL commits with and without NOTIFY: {args.url}", measures)
    write_json(
        args.json,
        {"benchmark": "postgres-notify", "url": args.url, "environment": env, "rows": args.rows},
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
