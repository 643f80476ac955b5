"""What a NOTIFY costs concurrent commits on PostgreSQL, and what delayq's puts do about it;
what an idle consumer sends (issue 19).

    .venv/bin/python benchmarks/postgres_notify.py --url postgresql://... [--rows 4000]
        [--sections notify,idle] [--idle-seconds 20]

Section ``notify``:

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
notify lock (``pg_locks`` sampled every 5 ms).

Section ``idle`` (issue 19: an idle consumer sends <= 1 query/s): on a private server
(``tests/backends/_postgres_server.py``, so that nobody else's statements are
counted; ``--url`` is not used), a consumer loops on ``reserve(wait=5)`` as a Worker
does, for ``--idle-seconds``, on an empty queue and then on a queue whose one message
is due in an hour. Its statements per second are read from ``pg_stat_statements``
(loaded by ``shared_preload_libraries``), less the measurement's own; its
transactions per second from ``pg_stat_database.xact_commit`` deltas, less the
measurement's own. A consumer that has just started claims once and LISTENs: the
count starts after its first second.

Prints a table, writes JSON to ``benchmarks/results/postgres-notify.json``. Never
asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from _common import RESULTS_DIR, Measure, environment, parse_sections, print_table, write_json
from delayq import QueueClosed
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


ROOT = Path(__file__).resolve().parent.parent
#: A Worker's wait in each reserve when nothing is due (runtime: WORKER_IDLE_WAIT).
IDLE_WAIT = 5.0
#: The statements that read the counters (their own calls are not the consumer's).
_OWN = "query LIKE '%%pg_stat%%'"


def idle_consumer(seconds: float) -> list[Measure]:
    """Section idle: the statements and transactions per second of an idle consumer on
    a private server, on an empty queue and on one whose message is due in an hour."""
    sys.path.insert(0, str(ROOT / "tests"))
    from backends._postgres_server import PrivatePostgres  # noqa: PLC0415

    server = PrivatePostgres(settings={"shared_preload_libraries": "pg_stat_statements"})
    measures = []
    try:
        admin = psycopg.connect(server.url, autocommit=True)
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for case, delay in (("an empty queue", None), ("one message due in an hour", 3600.0)):
            url = f"{server.url}?schema=idle_{uuid.uuid4().hex[:8]}"
            with Queue(url, name="idle") as producer:
                if delay is not None:
                    producer.put("later", delay=delay)
            consumer = Queue(url, name="idle")
            stop = threading.Event()

            def consume(q: Queue = consumer, stop: threading.Event = stop) -> None:
                with contextlib.suppress(QueueClosed):  # closed at the end
                    while not stop.is_set():
                        if q.reserve(wait=IDLE_WAIT):
                            raise AssertionError("an idle consumer got a message")

            thread = threading.Thread(target=consume, daemon=True)
            thread.start()
            time.sleep(1.0)  # its first claim, its listener's LISTEN
            statements, commits, own = _counters(admin)
            time.sleep(seconds)
            statements_after, commits_after, own_after = _counters(admin)
            stop.set()
            consumer.close()
            thread.join(IDLE_WAIT + 5)
            # Each reading is one statement and one transaction of the admin's, and
            # pg_stat_statements counts its own reset/reads in ``own``.
            sent = statements_after - statements
            xacts = commits_after - commits - (own_after - own)
            measures.append(
                Measure("idle", f"idle consumer, {case}: statements", sent / seconds, "/s",
                        "<= 1/s", sent / seconds <= 1.0,
                        note=f"{sent} in {seconds:.0f} s (pg_stat_statements), "
                        f"reserve(wait={IDLE_WAIT:g}) in a loop, as a Worker")
            )  # fmt: skip
            measures.append(
                Measure("idle", f"idle consumer, {case}: transactions", xacts / seconds, "/s",
                        note=f"{xacts} in {seconds:.0f} s (pg_stat_database.xact_commit, "
                        "less the measurement's own)")
            )  # fmt: skip
        admin.close()
    finally:
        server.stop()
    return measures


def _counters(admin: Any) -> tuple[int, int, int]:
    """The consumer's statements so far (pg_stat_statements, less the readings), the
    database's committed transactions, and the readings' own statements so far."""
    stats = admin.execute(
        f"SELECT coalesce(sum(calls) FILTER (WHERE NOT ({_OWN})), 0),"
        f" coalesce(sum(calls) FILTER (WHERE {_OWN}), 0) FROM pg_stat_statements"
    ).fetchone()
    admin.execute("SELECT pg_stat_clear_snapshot()")
    commits = admin.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(stats[0]), int(commits[0]), int(stats[1])


def main(argv: list[str] | None = None) -> int:
    """Run every case alternately ``--rounds`` times; report the best of each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "postgres-notify.json")
    parser.add_argument("--sections", help="notify, idle; default both")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    chosen = parse_sections(args.sections, ("notify", "idle"))
    env = environment()
    measures = notify_costs(args) if "notify" in chosen else []
    if "idle" in chosen:
        measures += idle_consumer(args.idle_seconds)
    print_table(f"PostgreSQL commits with and without NOTIFY, idle consumers: {args.url}", measures)
    write_json(
        args.json,
        {"benchmark": "postgres-notify", "url": args.url, "environment": env, "rows": args.rows,
         "sections": chosen},
        measures,
    )  # fmt: skip
    return 0


def notify_costs(args: argparse.Namespace) -> list[Measure]:
    """Section notify: the cases, alternately ``--rounds`` times, the best of each."""
    settings = parse_url(args.url)
    schema = f'"{settings.schema}"'
    table = f"{schema}.bench_notify_{uuid.uuid4().hex[:8]}"
    channel = f"bench_notify_{uuid.uuid4().hex[:8]}"
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
    return measures


if __name__ == "__main__":
    sys.exit(main())
