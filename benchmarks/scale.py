"""Scale of every durable backend (issue 41, point 3): bytes per scheduled message in
the store, and what the puts, the drain, cancel and reschedule cost as the backlog grows.

    .venv/bin/python benchmarks/scale.py --url URL [--sizes 100000,300000,1000000] [--quick]

``URL`` is ``sqlite:///...`` (a temporary file is used whatever the path: its size is
measured), ``redis://...`` (a unique ``prefix``; its keys are deleted afterwards),
``postgresql://...`` (a unique ``schema``, dropped afterwards; ``--private``: on a
server of its own, with PostgreSQL's default autovacuum) or ``amqp://...`` (the
URL only names the scheme: a private node is started, with ``delayq scheduler`` in a
process of its own, as ``amqp_memory.py`` does, through ``_amqp_node.py``).

For each size N, on a fresh store, this process (not a scheduler: ``scheduler=off`` on
amqp) puts N messages with a 100-byte payload due in an hour, with ``put_many`` in
batches of 1000, then reports:

- the store's bytes per message: Redis ``MEMORY USAGE`` of the queue's keys (and the
  ``INFO memory`` growth); PostgreSQL ``pg_total_relation_size`` of the table and each
  index's size; the SQLite file (with its WAL); RabbitMQ the node's data directory (the
  log stream's bytes, one replica) and the ``delayq scheduler``'s RSS growth;
- the put rate of the first and the last tenth of the fill (the empty store's against
  that size's);
- the drain: ``--drain`` messages due now, put at that size, drained by ``--consumers``
  (4) consumer processes (``reserve(max=100)`` + ``ack_many``), against the same drain on
  an empty queue of the same store; the time from the start to the last delivery;
- cancel and reschedule (to two hours) of ``--sample`` messages of the backlog, one call
  each: p50 / p99 latency;
- PostgreSQL only, churn: cancel and reschedule a tenth of the backlog each, then dead
  tuples, whether autovacuum runs within ``--vacuum-wait`` (90 s) and the dead tuples
  it leaves (``pg_stat_user_tables``), the index sizes' growth and, when
  the ``pgstattuple`` extension is installed in the database, the indexes' leaf density.

The last rows extrapolate the store's bytes (and the amqp scheduler's RSS) per message
to 10M linearly from the sizes measured (a least-squares line through them; said in the
table). Rates and latencies are not extrapolated: on a few small sizes a line through
them says more about the machine's load than about 10M. ``--quick``: sizes 5,000,
15,000, 50,000 and a drain of 5,000. It prints a table per backend and writes
``benchmarks/results/scale-<scheme>[-quick].json``; it never asserts.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _common import (
    Measure,
    console,
    environment,
    fresh_heap,
    load_average,
    percentile,
    print_table,
    result_path,
    spawn_ready,
    write_json,
)
from delayq.durable import Queue

BATCH = 1_000
#: A JSON string of 98 characters serializes to 100 bytes.
PAYLOAD = "x" * 98
DUE_IN = 3600.0
TARGET_N = 10_000_000
DEFAULT_SIZES = (100_000, 300_000, 1_000_000)
QUICK_SIZES = (5_000, 15_000, 50_000)
#: A consumer stops after this long without a delivery (everything drained is due).
IDLE_STOP_S = 3.0
SCHEMES = ("sqlite", "redis", "postgresql", "amqp")


def _join(url: str, query: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{query}"


# -- the stores -------------------------------------------------------------------------


@dataclass
class Store:
    """One fresh store of a size: the URL clients use and how to read its bytes."""

    url: str
    #: Bytes in the store now, by part (a key, a relation, the file, the node's disk).
    parts: Callable[[], dict[str, int]]
    #: Extra readings (INFO memory, the scheduler's RSS), informative.
    extras: Callable[[], dict[str, int]] = field(default=lambda: {})
    #: The store's own delayq processes by name (the amqp scheduler), for soak.py.
    pids: Callable[[], dict[str, int]] = field(default=lambda: {})
    #: The bytes while clients write (``parts`` may stop them: SQLite's checkpoint).
    live: Callable[[], int] | None = None

    def live_bytes(self) -> int:
        return self.live() if self.live is not None else sum(self.parts().values())


@contextmanager
def sqlite_store(_: str) -> Iterator[Store]:
    with tempfile.TemporaryDirectory(prefix="delayq-scale-") as tmp:
        path = Path(tmp) / "scale.db"

        def parts() -> dict[str, int]:
            # Fold the WAL into the file first: what is left is what the rows take.
            with sqlite3.connect(path) as db:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return {
                p.name: p.stat().st_size
                for p in Path(tmp).iterdir()
                if p.name.startswith("scale.db")
            }

        def live() -> int:  # the file and its WAL as they stand, no checkpoint
            return sum(
                p.stat().st_size for p in Path(tmp).iterdir() if p.name.startswith("scale.db")
            )

        yield Store(f"sqlite:///{path}", parts, live=live)


@contextmanager
def redis_store(url: str) -> Iterator[Store]:
    import redis  # noqa: PLC0415

    prefix = f"delayq-scale-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    base = int(client.info("memory")["used_memory"])

    def parts() -> dict[str, int]:
        return {
            key.decode()[len(prefix) + 1 :]: int(client.memory_usage(key, samples=10_000) or 0)
            for key in client.scan_iter(match=f"{prefix}:*", count=1000)
        }

    def extras() -> dict[str, int]:
        return {"used_memory_growth": int(client.info("memory")["used_memory"]) - base}

    try:
        yield Store(_join(url, f"prefix={prefix}"), parts, extras)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for first in range(0, len(keys), 1000):
            client.unlink(*keys[first : first + 1000])
        client.close()


@contextmanager
def postgres_store(url: str) -> Iterator[Store]:
    import psycopg  # noqa: PLC0415

    schema = f"delayq_scale_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(url, autocommit=True)

    def parts() -> dict[str, int]:
        rows = admin.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'i')",
            (schema,),
        ).fetchall()
        table = dict(rows)
        # The table's total counts its indexes (and TOAST): show the heap apart.
        heap = admin.execute(
            "SELECT pg_relation_size(%s::regclass)", (f"{schema}.messages",)
        ).fetchone()
        out = {
            f"index {name}": size for name, size in table.items() if name.startswith("messages_")
        }
        out["heap messages"] = int(heap[0]) if heap else 0
        rest = sum(size for name, size in table.items() if not name.startswith("messages"))
        out["other relations"] = rest
        return out

    try:
        yield Store(_join(url, f"schema={schema}"), parts)
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()


@contextmanager
def private_postgres(private: bool, url: str) -> Iterator[str]:
    """``url``, or a private server's (``initdb`` + ``postgres`` on a free port,
    tests/backends/_postgres_server.py) with ``pgstattuple`` created in it."""
    if not private:
        yield url
        return
    import psycopg  # noqa: PLC0415

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from backends._postgres_server import PrivatePostgres  # noqa: PLC0415

    server = PrivatePostgres()
    try:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        yield server.url
    finally:
        server.stop()


@contextmanager
def amqp_store(given: str) -> Iterator[Store]:
    """A private RabbitMQ node; the given URL's query (``retention_bytes=``...) is kept."""
    from _amqp_node import Node, RabbitNodes, rss, start_scheduler, stop  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="delayq-scale-amqp-") as tmp:
        nodes = RabbitNodes(Path(tmp) / "rabbit", 1)
        nodes.start()
        node = Node(nodes)
        query = urlsplit(given).query
        url = nodes.url(0, "?prefix=delayq-scale" + (f"&{query}" if query else ""))
        try:
            scheduler = start_scheduler(url, Path(tmp) / "scheduler.log")
            base = rss(scheduler.pid)
            try:
                yield Store(
                    _join(url, "scheduler=off"),
                    lambda: {"node data directory": node.disk()},
                    lambda: {"scheduler_rss_growth": rss(scheduler.pid) - base},
                    lambda: {"scheduler": scheduler.pid},
                )
            finally:
                stop(scheduler)
        finally:
            nodes.stop()


STORES = {
    "sqlite": sqlite_store,
    "redis": redis_store,
    "postgresql": postgres_store,
    "amqp": amqp_store,
}


# -- what is measured -------------------------------------------------------------------


def fill(q: Queue, count: int, *, due_in: float) -> tuple[list[str], list[float]]:
    """Put ``count`` messages due in ``due_in`` s; the ids and each batch's seconds."""
    ids: list[str] = []
    seconds: list[float] = []
    for first in range(0, count, BATCH):
        batch = [{"payload": PAYLOAD, "delay": due_in}] * min(BATCH, count - first)
        t0 = time.perf_counter()
        ids += q.put_many(batch)
        seconds.append(time.perf_counter() - t0)
    return ids, seconds


def run_consumer(url: str, name: str) -> int:
    """The ``--consumer`` mode: wait for a line on stdin, then drain ``name`` until
    nothing comes for ``IDLE_STOP_S``; print the count and the last delivery's time."""
    count, last = 0, 0.0
    with Queue(url, name=name) as q:
        q.stats()
        print("ready", flush=True)
        sys.stdin.readline()
        while True:
            messages = q.reserve(max=100, wait=IDLE_STOP_S)
            if not messages:
                break
            q.ack_many(messages)
            count += len(messages)
            last = time.time()
    print(json.dumps({"count": count, "last": last}), flush=True)
    return 0


def drain(url: str, q: Queue, name: str, count: int, consumers: int) -> tuple[float, int]:
    """Put ``count`` messages due now on ``q``, drain them with ``consumers`` processes:
    the seconds from the start to the last delivery, and how many were delivered."""
    fill(q, count, due_in=0.0)
    script = str(Path(__file__).resolve())
    children = spawn_ready(
        [sys.executable, script, "--url", url, "--consumer", name], consumers, stdin=True
    )
    try:
        started = time.time()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = [json.loads(child.communicate(timeout=3600)[0]) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    delivered = sum(int(r["count"]) for r in reports)
    last = max(float(r["last"]) for r in reports)
    return max(last - started, 1e-9), delivered


def latencies(call: Callable[[str], object], ids: list[str]) -> list[float]:
    """The sorted seconds of ``call(id)`` for each of ``ids``."""
    out = []
    for id in ids:
        t0 = time.perf_counter()
        call(id)
        out.append(time.perf_counter() - t0)
    return sorted(out)


def churn(q: Queue, store_url: str, ids: list[str], wait: float) -> dict[str, Any]:
    """PostgreSQL: cancel and reschedule a tenth of the backlog each; what it leaves."""
    import psycopg  # noqa: PLC0415

    schema = dict(p.split("=", 1) for p in urlsplit(store_url).query.split("&"))["schema"]
    tenth = len(ids) // 10
    with psycopg.connect(store_url.split("?", 1)[0], autocommit=True) as admin:

        def reading() -> dict[str, Any]:
            row = admin.execute(
                "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count "
                "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'messages'",
                (schema,),
            ).fetchone()
            sizes = admin.execute(
                "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname LIKE 'messages%%'",
                (schema,),
            ).fetchall()
            out: dict[str, Any] = dict(
                zip(("live", "dead", "autovacuum", "autoanalyze"), row or (0, 0, 0, 0), strict=True)
            )
            out["sizes"] = {name: int(size) for name, size in sizes}
            return out

        has_stattuple = admin.execute(
            "SELECT 1 FROM pg_extension WHERE extname = 'pgstattuple'"
        ).fetchone()
        setting = admin.execute("SHOW autovacuum").fetchone()
        autovacuum = str(setting[0]) if setting else "?"
        before = reading()
        t0 = time.perf_counter()
        for id in ids[:tenth]:
            q.cancel(id)
        for id in ids[tenth : 2 * tenth]:
            q.reschedule(id, delay=2 * DUE_IN)
        seconds = time.perf_counter() - t0
        time.sleep(1.0)  # the statistics collector's flush
        after = reading()
        # Bounded or not: wait for autovacuum (its naptime is a minute by default),
        # unless it already ran since the churn began.
        deadline = time.monotonic() + wait
        vacuumed = after
        while time.monotonic() < deadline and vacuumed["autovacuum"] == before["autovacuum"]:
            time.sleep(2.0)
            vacuumed = reading()
        density: dict[str, float] = {}
        if has_stattuple:
            for name in after["sizes"]:
                if name != "messages":
                    row = admin.execute(
                        "SELECT avg_leaf_density FROM pgstatindex(%s)", (f"{schema}.{name}",)
                    ).fetchone()
                    density[name] = float(row[0]) if row else float("nan")
    return {
        "ops": 2 * tenth,
        "seconds": seconds,
        "before": before,
        "after": after,
        "vacuumed": vacuumed,
        "waited": wait,
        "autovacuum_setting": autovacuum,
        "avg_leaf_density": density,
    }


@dataclass
class Point:
    """What one size measured."""

    size: int
    bytes: dict[str, int]
    extras: dict[str, int]
    rate_first: float
    rate_last: float
    drain_seconds: float
    drain_empty_seconds: float
    drained: int
    cancel: list[float]
    reschedule: list[float]
    churn: dict[str, Any] | None


def measure_size(scheme: str, url: str, size: int, args: argparse.Namespace) -> Point:
    drain_count = min(args.drain, size)
    with STORES[scheme](url) as store:
        with Queue(store.url, name="empty") as empty:
            empty.stats()
            drain_empty, _ = drain(store.url, empty, "empty", drain_count, args.consumers)
        fresh_heap()
        with Queue(store.url, name="scale") as q:
            q.stats()
            ids, seconds = fill(q, size, due_in=DUE_IN)
            time.sleep(2.0)  # a checkpoint or a write-back in flight
            parts = store.parts()
            extras = store.extras()
            tenth = max(1, len(seconds) // 10)
            first = sum(seconds[:tenth])
            last = sum(seconds[-tenth:])
            in_tenth = min(size, tenth * BATCH)
            sample = ids[-2 * args.sample :]
            cancel = latencies(q.cancel, sample[: args.sample])
            reschedule = latencies(
                lambda id: q.reschedule(id, delay=2 * DUE_IN), sample[args.sample :]
            )
            drain_full, drained = drain(store.url, q, "scale", drain_count, args.consumers)
            churned = (
                churn(q, store.url, ids[: -2 * args.sample], args.vacuum_wait)
                if scheme == "postgresql"
                else None
            )
    return Point(
        size,
        parts,
        extras,
        in_tenth / first,
        in_tenth / last,
        drain_full,
        drain_empty,
        drained,
        cancel,
        reschedule,
        churned,
    )


def fit(xs: list[float], ys: list[float], at: float) -> float:
    """The least-squares line through (xs, ys), at ``at``."""
    n = len(xs)
    if n < 2:
        return ys[0] if ys else float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my + slope * (at - mx)


def measures_of(scheme: str, points: list[Point], drain_count: int) -> list[Measure]:
    out: list[Measure] = []
    for p in points:
        s = f"{p.size:,}"
        total = sum(p.bytes.values())
        parts = ", ".join(f"{k} {v / p.size:.0f}" for k, v in sorted(p.bytes.items()) if v)
        out.append(
            Measure(s, "store bytes / message", total / p.size, "B", note=parts, extra=p.bytes)
        )
        for key, value in p.extras.items():
            out.append(Measure(s, f"{key} / message", value / p.size, "B"))
        out.append(
            Measure(
                s,
                "put_many rate: first tenth -> last tenth",
                p.rate_last,
                "items/s",
                note=f"first tenth {p.rate_first:,.0f}/s; "
                f"last/first {p.rate_last / p.rate_first:.2f}",
                extra={"first": p.rate_first, "last": p.rate_last},
            )
        )
        n = min(drain_count, p.size)
        out.append(
            Measure(
                s,
                f"drain {n:,} due at once, 4 consumers",
                p.drain_seconds,
                "s",
                note=f"empty store {p.drain_empty_seconds:.2f} s; "
                f"{n / p.drain_seconds:,.0f}/s vs {n / p.drain_empty_seconds:,.0f}/s; "
                f"{p.drained:,} delivered",
                extra={"empty_seconds": p.drain_empty_seconds, "delivered": p.drained},
            )
        )
        for label, values in (("cancel", p.cancel), ("reschedule", p.reschedule)):
            out.append(
                Measure(
                    s,
                    f"{label} p50 / p99 ({len(values):,} calls)",
                    1000 * percentile(values, 0.5),
                    "ms",
                    note=f"p99 {1000 * percentile(values, 0.99):.2f} ms",
                    extra={"p99_ms": 1000 * percentile(values, 0.99)},
                )
            )
        if p.churn:
            c = p.churn
            before, after = c["before"], c["after"]
            grown = {
                name: after["sizes"].get(name, 0) - before["sizes"].get(name, 0)
                for name in after["sizes"]
            }
            density = ", ".join(f"{k} {v:.0f}%" for k, v in c["avg_leaf_density"].items())
            vac = c["vacuumed"]
            ran = vac["autovacuum"] - before["autovacuum"]
            out.append(
                Measure(
                    s,
                    f"churn {c['ops']:,} cancels+reschedules: dead tuples",
                    after["dead"],
                    "count",
                    note=f"{before['dead']:,} before it (the drains'), "
                    f"{after['dead'] - before['dead']:+,} over it (autovacuum ran "
                    f"{after['autovacuum'] - before['autovacuum']}x meanwhile); "
                    f"live {after['live']:,}; {c['ops'] / c['seconds']:,.0f} ops/s",
                    extra=c,
                )
            )
            out.append(
                Measure(
                    s,
                    "churn: dead tuples once autovacuum ran",
                    vac["dead"] if ran else float("nan"),
                    "count",
                    note=f"autovacuum ran {ran}x from the churn's start (to "
                    f"{c['waited']:.0f} s after its end)"
                    if ran
                    else f"autovacuum did not run within {c['waited']:.0f} s "
                    f"(autovacuum = {c['autovacuum_setting']} on this server)",
                )
            )
            out.append(
                Measure(
                    s,
                    "churn: relation growth / churned op",
                    sum(grown.values()) / max(1, c["ops"]),
                    "B",
                    note=", ".join(f"{k} +{v / 1024:.0f} KiB" for k, v in grown.items())
                    + (f"; leaf density {density}" if density else "; pgstattuple not installed"),
                )
            )
    if len(points) >= 2:
        xs = [float(p.size) for p in points]
        out.append(
            Measure(
                "10M",
                "store bytes / message (extrapolated)",
                fit(xs, [float(sum(p.bytes.values())) for p in points], TARGET_N) / TARGET_N,
                "B",
                note="linear least squares through the sizes above, not measured",
            )
        )
        for key in points[0].extras:
            out.append(
                Measure(
                    "10M",
                    f"{key} / message (extrapolated)",
                    fit(xs, [float(p.extras[key]) for p in points], TARGET_N) / TARGET_N,
                    "B",
                    note="linear, not measured",
                )
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="sqlite:, redis:, postgresql: or amqp:")
    parser.add_argument("--sizes", help="comma-separated; default 100000,300000,1000000")
    parser.add_argument("--drain", type=int, default=None, help="due messages drained; 100,000")
    parser.add_argument("--sample", type=int, default=1000, help="cancels and reschedules timed")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument(
        "--private",
        action="store_true",
        help="postgresql: a server of its own (default settings, autovacuum on, pgstattuple)",
    )
    parser.add_argument(
        "--vacuum-wait", type=float, default=90.0, help="postgresql: s to wait for autovacuum"
    )
    parser.add_argument("--quick", action="store_true", help="sizes 5,000,15,000,50,000")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--consumer", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.consumer:
        return run_consumer(args.url, args.consumer)
    scheme = urlsplit(args.url).scheme.lower()
    scheme = {"postgres": "postgresql", "amqps": "amqp", "rediss": "redis"}.get(scheme, scheme)
    if scheme not in SCHEMES:
        parser.error(f"--url: scheme {scheme!r}; choose from {', '.join(SCHEMES)}")
    try:
        sizes = (
            [int(x) for x in args.sizes.split(",")]
            if args.sizes
            else list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
        )
    except ValueError:
        parser.error("--sizes: comma-separated integers")
    if any(n < 2 * args.sample + 10 for n in sizes) or args.sample < 1:
        parser.error("--sizes: each size must exceed twice --sample (+10)")
    if args.drain is None:
        args.drain = 5_000 if args.quick else 100_000
    if args.drain < 1 or args.consumers < 1:
        parser.error("--drain and --consumers must be at least 1")
    env = environment()
    load = load_average()
    started = time.perf_counter()
    points: list[Point] = []
    with private_postgres(args.private and scheme == "postgresql", args.url) as url:
        for size in sizes:
            console.print(f"{scheme}: {size:,} scheduled ...", style="dim")
            points.append(measure_size(scheme, url, size, args))
            fresh_heap()
    total = time.perf_counter() - started
    measures = measures_of(scheme, points, args.drain)
    private = scheme == "amqp" or (args.private and scheme == "postgresql")
    where = "a private server" if private else args.url
    print_table(
        f"delayq scale: {scheme} ({where}), "
        f"100 B payloads due in an hour; {total:.0f} s; load {load} -> {load_average()}",
        measures,
    )
    write_json(
        args.json or result_path("scale", args.url, args.quick),
        {
            "benchmark": "scale",
            "scheme": scheme,
            "sizes": sizes,
            "drain": args.drain,
            "consumers": args.consumers,
            "sample": args.sample,
            "server": where,
            "payload_bytes": len(json.dumps(PAYLOAD)),
            "load": [load, load_average()],
            "environment": env,
            "total_seconds": total,
        },
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
