"""Where a ``kafka://`` firing's time goes (issue 40): a timeline of each message.

Run ``.venv/bin/python benchmarks/kafka_timeline.py [--messages N] [--fetch-wait-ms
5]``. It starts a private Tansu broker (tests/backends/_tansu.py), ``delayq scheduler``
in a process of its own (this script, ``--scheduler``: the same command with the
timeline's probes added), then durable.py section d's load in this process: a thread
puts ``--messages`` messages one every 5 ms, each delayed by 0, 1 ms, 10 ms, 50 ms,
200 ms or 1 s, and one consumer loops on ``reserve(max=100)`` and ``ack_many``.

Both processes stamp, with their wall clock (one machine, one clock), each step of a
message's way: the scheduler its claim (and for which reserve), the reply's departure
once the claim is appended and read back (the fence), its produce acknowledged, every
log append's produce and read-back, and its event loop's stalls (a 1 ms sleep that took
over 15 ms, with the CPU its thread used meanwhile); the client each reply its inbox
reader takes (the messages it carries) and each request it produces. Then one table:
per segment of the way of a message answered ``ok`` (due when claimed), its median,
90th and 99th percentile; the held path's lateness (claimed ahead); the stalls. It
writes ``benchmarks/results/kafka-timeline.json``; it never asserts.

The probes wrap delayq's own methods (the transport's and the scheduler's), never
another package's: a benchmark's instrument, which the timeline's figures in
docs/kafka.md ("Where a firing's time goes") come from.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import RESULTS_DIR, Measure, console, environment, print_table, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

#: durable.py section d's delays (s).
DELAYS = (0.0, 0.001, 0.01, 0.05, 0.2, 1.0)
#: A loop stall shown: a 1 ms sleep that took longer than this (ms).
STALL_MS = 15.0


class _Trace:
    """Events as JSON lines ``[epoch ms, kind, ...]`` in a file of the process's own."""

    def __init__(self, path: str) -> None:
        self._out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process

    def __call__(self, *event: Any) -> None:
        self._out.write(json.dumps([time.time() * 1000.0, *event]) + "\n")


def _ids(kind: str, body: bytes) -> list[str]:
    """The ids of the messages a reply carries (a reserve's ``ok`` or ``held``)."""
    from delayq.backends._replicated._codec import (  # noqa: PLC0415
        decode_record,
        reserve_items,
        unpack,
    )

    try:
        if kind == "batch":
            return [mid for _, k, b in unpack(body) for mid in _ids(k, b)]
        items = reserve_items(kind, body)
    except Exception:  # not a reserve's reply
        return []
    return [decode_record(item).id for item in items] if isinstance(items, list) else []


def _watch_loop(trace: _Trace) -> None:
    """Every event loop of the process stamps its stalls (wall and thread CPU, ms)."""
    run_forever = asyncio.BaseEventLoop.run_forever

    async def watch() -> None:
        while True:
            wall, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.001)
            took = (time.perf_counter() - wall) * 1000.0
            if took > STALL_MS:
                trace("stall", took, (time.thread_time() - cpu) * 1000.0)

    def patched(self: asyncio.BaseEventLoop) -> None:
        self.create_task(watch())
        run_forever(self)

    asyncio.BaseEventLoop.run_forever = patched  # type: ignore[method-assign]


def _probe_scheduler(trace: _Trace) -> None:
    from delayq.backends._replicated._scheduler._group_commit import GroupCommit  # noqa: PLC0415
    from delayq.backends.kafka._transport import KafkaTransport  # noqa: PLC0415

    produce, append, commit, send = (
        KafkaTransport._produce,
        KafkaTransport.append,
        GroupCommit._commit,
        GroupCommit._send,
    )

    async def produce_(
        self: Any, what: str, topic: str, value: bytes, headers: Any, **kw: Any
    ) -> int:
        started = time.time() * 1000.0
        offset = await produce(self, what, topic, value, headers, **kw)
        trace("produced", what, headers.get("rid", ""), started)
        return offset

    async def append_(self: Any, kind: str, reign: str, body: bytes, mark: str = "") -> None:
        started = time.time() * 1000.0
        await append(self, kind, reign, body, mark)
        trace("appended", kind, started)

    def commit_(self: Any, entry: Any, reply: Any, *, folded: bool = False) -> None:
        if reply is not None and reply.claimed:
            trace("claim", reply.request_id, reply.kind, [r.id for r in reply.claimed])
        commit(self, entry, reply, folded=folded)

    def send_(self: Any, replies: list[Any]) -> None:
        trace("send", [reply.request_id for reply in replies])
        send(self, replies)

    KafkaTransport._produce = produce_  # type: ignore[method-assign]
    KafkaTransport.append = append_  # type: ignore[method-assign]
    GroupCommit._commit = commit_  # type: ignore[method-assign]
    GroupCommit._send = send_  # type: ignore[method-assign]


def _probe_client(trace: _Trace) -> None:
    from delayq.backends.kafka._transport import KafkaTransport  # noqa: PLC0415

    open_ = KafkaTransport._open

    async def opened(self: Any, on_reply: Any, on_elected: Any) -> None:
        def took(request_id: str, kind: str, body: bytes) -> None:
            trace("reply_in", request_id, kind, _ids(kind, body))
            on_reply(request_id, kind, body)

        await open_(self, took, on_elected)

    KafkaTransport._open = opened  # type: ignore[method-assign]


def _run_scheduler(url: str, trace_path: str) -> None:
    trace = _Trace(trace_path)
    _watch_loop(trace)
    _probe_scheduler(trace)
    from delayq.cli._main import main  # noqa: PLC0415

    sys.argv = ["delayq", "scheduler", "--url", url]
    main()


def _load(url: str, count: int) -> dict[str, list[float]]:
    """durable.py section d, shortened: {id: [received epoch ms, due_at]}."""
    from delayq.durable import Queue  # noqa: PLC0415

    with Queue(url, name=f"late-{uuid.uuid4().hex[:6]}") as q:
        got: dict[str, list[float]] = {}

        def consume() -> None:
            give_up = time.monotonic() + count * 0.005 + 15
            while len(got) < count and time.monotonic() < give_up:
                messages = q.reserve(max=100, wait=1.0, lease=60)
                now = time.time() * 1000.0
                for message in messages:
                    got.setdefault(message.id, [now, message.due_at])
                if messages:
                    q.ack_many(messages)

        gc.freeze()
        consumer = threading.Thread(target=consume)
        consumer.start()
        rng = random.Random(7)
        started = time.monotonic()
        for i in range(count):
            pause = started + i * 0.005 - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            q.put(i, delay=rng.choice(DELAYS))
        consumer.join()
        return got


def _wait_elected(scheduler: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Return once the scheduler logged its election (its log read on by a thread)."""
    assert scheduler.stderr is not None
    stream = scheduler.stderr
    lines: list[str] = []
    elected = threading.Event()

    def read() -> None:
        for line in stream:
            lines.append(line)
            if "scheduler_elected" in line:
                elected.set()

    threading.Thread(target=read, daemon=True).start()
    if not elected.wait(timeout):
        raise SystemExit("the scheduler was not elected:\n" + "".join(lines))


def _events(path: Path) -> list[list[Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _q(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] if ordered else float("nan")


def _measures(
    got: dict[str, list[float]], sched: list[list[Any]], client: list[list[Any]]
) -> list[Measure]:
    claim: dict[str, tuple[float, str, str]] = {}
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    for at, kind, *rest in sched:
        if kind == "claim":
            for mid in rest[2]:
                claim.setdefault(mid, (at, rest[0], rest[1]))
        elif kind == "send":
            for rid in rest[0]:
                sent.setdefault(rid, at)
        elif kind == "produced" and rest[0] == "reply":
            acked.setdefault(rest[1], at)
    came: dict[str, float] = {}
    for at, kind, *rest in client:
        if kind == "reply_in":
            for mid in rest[2]:
                came.setdefault(mid, at)
    segments: dict[str, list[float]] = {
        "due -> claimed": [],
        "claimed -> appended and read back": [],
        "-> reply produced": [],
        "-> the client's inbox reader": [],
        "-> the caller's thread": [],
        "lateness, answered ok": [],
    }
    held: list[float] = []
    for mid, (now, due) in got.items():
        if mid not in claim or mid not in came:
            continue
        at, rid, kind = claim[mid]
        if kind == "held":
            held.append(now - due)
            continue
        if rid not in sent or rid not in acked:
            continue
        steps = [due, at, sent[rid], acked[rid], came[mid], now]
        for name, (a, b) in zip(segments, itertools.pairwise(steps), strict=False):
            segments[name].append(b - a)
        segments["lateness, answered ok"].append(now - due)
    appends = [
        at - rest[1] for at, kind, *rest in sched if kind == "appended" and rest[0] == "entry"
    ]
    measures = []
    for name, values in [
        *segments.items(),
        ("lateness, claimed ahead (held)", held),
        ("a log append", appends),
    ]:
        note = f"p90 {_q(values, 0.9):.1f}, p99 {_q(values, 0.99):.1f}, n {len(values)}"
        measures.append(Measure("t", f"{name}: p50", _q(values, 0.5), "ms", note=note))
    for who, events in (("the scheduler's", sched), ("the client's", client)):
        stalls = [(rest[0], rest[1]) for _, kind, *rest in events if kind == "stall"]
        worst = max(stalls, default=(0.0, 0.0))
        measures.append(
            Measure(
                "t",
                f"{who} loop: stalls over {STALL_MS:g} ms",
                len(stalls),
                "",
                note=f"worst {worst[0]:.0f} ms, its thread's CPU in it {worst[1]:.1f} ms",
            )
        )
    return measures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--fetch-wait-ms", type=int, default=5)
    parser.add_argument("--scheduler", nargs=2, metavar=("URL", "TRACE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scheduler:
        _run_scheduler(*args.scheduler)
        return
    from backends._tansu import tansu_broker  # noqa: PLC0415

    folder = Path(tempfile.mkdtemp(prefix="delayq-timeline-"))
    sched_path, client_path = folder / "scheduler.jsonl", folder / "client.jsonl"
    load = os.getloadavg()
    with tansu_broker() as broker:
        url = (
            f"kafka://{broker.bootstrap}?prefix=t{uuid.uuid4().hex[:8]}"
            f"&idempotence=off&fetch_wait_ms={args.fetch_wait_ms}"
        )
        scheduler = subprocess.Popen(
            [sys.executable, __file__, "--scheduler", url, str(sched_path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait_elected(scheduler)
            trace = _Trace(str(client_path))
            _watch_loop(trace)
            _probe_client(trace)
            got = _load(f"{url}&scheduler=off", args.messages)
        finally:
            scheduler.terminate()
            scheduler.wait(30)
    measures = _measures(got, _events(sched_path), _events(client_path))
    title = (
        f"a kafka:// firing's timeline: {len(got)}/{args.messages} messages, Tansu "
        f"memory, fetch_wait_ms={args.fetch_wait_ms}, load average {load[0]:.1f} before"
    )
    print_table(title, measures)
    out = RESULTS_DIR / "kafka-timeline.json"
    write_json(
        out, {"environment": environment(), "load_before": load, "traces": str(folder)}, measures
    )
    console.print(f"the traces: {folder}")


if __name__ == "__main__":
    main()
