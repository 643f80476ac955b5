"""Where the replicated scheduler's memory goes, per scheduled message (issue 41, point 1).

Run ``.venv/bin/python benchmarks/scheduler_memory.py [--counts 200000,1000000]
[--payloads 100,1000] [--tracemalloc]``. No broker: each measurement runs in a process of
its own, which fills one queue's :class:`Journal` (the elected scheduler's state, over
``backends/_records.py``'s ``Records``) the way the scheduler does, with ``count``
messages due in an hour, each with a raw payload of the given size and no headers:

- ``elected``: put requests of 1000 (``put_many``) encoded as a client sends them,
  unpacked and decoded as the scheduler receives them, put, and their log entry's images
  taken and packed (then dropped, as once the broker confirmed them);
- ``standby``: the same messages' images packed as log entries, unpacked and folded with
  ``Journal.restore``, as a hot standby (or a replay) does.

It reports per message: the process's resident set growth, the growth tracemalloc
counts (with ``--tracemalloc``: slower), and the live objects split by kind (the
``Record``, its id, payload, encoding, headers dict, its int fields, the records dict's
slot, the heap entries and the heap's slot, the due buckets' slots, anything else the
journal holds), each object counted once. It prints a table and writes JSON to
``benchmarks/results/scheduler-memory.json``; it never asserts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, Measure, environment, print_table, write_json

BATCH = 1000
HOUR_MS = 3_600_000
#: The issue's target: bytes per scheduled message beyond a fixed base.
GOAL = 150.0


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _batches(count: int, size: int) -> Iterator[list[Any]]:
    """The encoded put requests of ``count`` messages, BATCH a request, each made when
    it is taken (so that what the measurement holds is the journal alone)."""
    from delayq._fork import new_ids  # noqa: PLC0415
    from delayq.backends._replicated._codec import encode_requests  # noqa: PLC0415
    from delayq.durable.message import put_request  # noqa: PLC0415

    for start in range(0, count, BATCH):
        n = min(BATCH, count - start)
        # As the facade makes them for bytes put_many'd an hour ahead (in field order).
        requests = [
            put_request(id, os.urandom(size), "bytes", 5, {}, HOUR_MS, None, "ignore", True)
            for id in new_ids(n)
        ]
        yield encode_requests(requests)


def _fill(path: str, count: int, size: int, trace: bool) -> dict[str, Any]:
    """Fill a Journal as ``path`` does; what it took."""
    from delayq.backends._replicated._codec import decode_requests, pack, unpack  # noqa: PLC0415
    from delayq.backends._replicated._scheduler._journal import Journal  # noqa: PLC0415
    from delayq.durable.message import Now  # noqa: PLC0415

    now = Now.of_seconds(time.time())
    gc.collect()
    base = _rss()
    if trace:
        tracemalloc.start()
    journal = Journal()
    for batch in _batches(count, size):
        body = pack(batch)
        if path == "standby":  # the entry the elected scheduler logged, folded
            scratch = Journal()
            scratch.last_seq = journal.last_seq
            scratch.put(decode_requests(unpack(body)), now)
            images, deletes = scratch.take_changes()
            body = pack(["put", "q", "r", now.floor, scratch.last_seq, images, deletes, "ok", b""])
            del scratch, images, deletes
            entry = unpack(body)
            journal.restore(entry[5], entry[6], entry[4])
            del entry
        else:
            journal.put(decode_requests(unpack(body)), now)
            images, deletes = journal.take_changes()
            pack(["put", "q", "r", now.floor, journal.last_seq, images, deletes, "ok", b""])
            del images, deletes
        del body
    del batch
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] if trace else None
    if trace:
        tracemalloc.stop()
    grown = None if trace else _rss() - base  # tracemalloc's own traces would count
    return {"rss": grown, "traced": traced, "kinds": _kinds(journal)}


def _kinds(journal: Any) -> dict[str, int]:
    """The bytes of the objects ``journal`` holds, by kind, each object counted once
    (small ints and other shared objects once in all)."""
    seen: set[int] = set()
    kinds: dict[str, int] = {}

    def add(kind: str, obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        kinds[kind] = kinds.get(kind, 0) + sys.getsizeof(obj)

    add("records dict (table, per slot)", journal.records)
    for record in journal.records.values():
        add("Record (slotted dataclass)", record)
        add("id str", record.id)
        add("payload bytes", record.payload)
        add("encoding str", record.encoding)
        add("headers dict", record.headers)
        for key, value in record.headers.items():
            add("headers' strs", key)
            add("headers' strs", value)
        for number in (record.due_at, record.seq, record.attempts, record.max_attempts):
            add("int fields (due_at, seq, ...)", number)
        for other in (record.state, record.last_error, record.lease, record.lease_until):
            add("state, last_error, lease", other)
    for name in ("due", "ripe", "leases", "graves"):
        heap = getattr(journal, name)
        add("heap lists (per slot)", heap)
        for entry in heap:
            add("heap entry tuple", entry)
            for item in entry:
                add("heap entries' own objects", item)
    later = getattr(journal, "later", {})  # the buckets of later seconds (none before)
    add("due buckets (dict, lists, per slot)", later)
    add("due buckets (dict, lists, per slot)", getattr(journal, "buckets", []))
    for held in later.values():
        if isinstance(held, list):
            add("due buckets (dict, lists, per slot)", held)
    add("changed dict (Journal)", journal.changed)
    return kinds


def _child(args: argparse.Namespace) -> int:
    result = _fill(args.path, args.count, args.payload, args.tracemalloc)
    print(json.dumps(result))
    return 0


def _measure(path: str, count: int, payload: int, trace: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", path, "--count", str(count)]
    command += ["--payload", str(payload)] + (["--tracemalloc"] if trace else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, measure each size in a process of its own, print, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--counts", default="200000,1000000")
    parser.add_argument("--payloads", default="100,1000")
    parser.add_argument("--paths", default="elected,standby")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "scheduler-memory.json")
    parser.add_argument("--child", choices=("elected", "standby"), help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--payload", type=int, default=100, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.path = args.child
        return _child(args)
    counts = [int(c) for c in args.counts.split(",")]
    payloads = [int(p) for p in args.payloads.split(",")]
    measures: list[Measure] = []
    for path in args.paths.split(","):
        for payload in payloads:
            for count in counts:
                r = _measure(path, count, payload, args.tracemalloc)
                section = f"{path}, {payload} B"
                label = f"{count:,} msgs"
                if r["rss"] is not None:
                    rss = r["rss"] / count
                    measures.append(
                        Measure(
                            section,
                            f"{label}: RSS growth / message",
                            rss,
                            "B",
                            f"<= {GOAL:g} B",
                            rss <= GOAL,
                            extra=r,
                        )
                    )
                if r["traced"] is not None:
                    measures.append(
                        Measure(
                            section, f"{label}: tracemalloc / message", r["traced"] / count, "B"
                        )
                    )
                kinds = sorted(r["kinds"].items(), key=lambda kv: -kv[1])
                total = sum(v for _, v in kinds)
                measures.append(Measure(section, f"{label}: objects / message", total / count, "B"))
                measures += [
                    Measure(section, f"{label}:   {kind}", value / count, "B")
                    for kind, value in kinds
                ]
    print_table("delayq replicated scheduler: memory per scheduled message", measures)
    write_json(
        args.json,
        {"benchmark": "scheduler-memory", "counts": counts, "environment": environment()},
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
