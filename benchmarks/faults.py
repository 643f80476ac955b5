"""A campaign of network faults on ``redis://``, ``postgresql://`` or ``amqp://``:
partitions and silent servers under a running workload, every call checked (issue 21).

Run as root: ``.venv/bin/python benchmarks/faults.py [--backend redis|postgres|amqp]
[--rounds 20] [--face both] [--slow 200]``. The server (Redis, or a private PostgreSQL
or RabbitMQ node) runs in a network namespace of its own (``tests/faults/_netns.py``),
reached by two links. On RabbitMQ the scheduler is a queue object of the benchmark's
own on the link that stays up, and the producer and consumers are not candidates
(``scheduler=off``), so a fault cuts clients from the broker, as on the other
backends. Each round, on a fresh queue, a producer puts messages due within 1.5 s and
two consumers reserve (lease 1 s) and ack them after a little work; one consumer and
its link are the victim. At a random moment the victim's link is cut (a partition) or
silenced (the server's packets dropped: it still runs what it is sent), for a random
0.3-2.5 s (often longer than the lease), then healed; the round ends once every stored
message was acked. Every call goes into a history (``tests/faults/_history.py``),
checked for lost, early, acked-back and phantom messages and for duplicates, each
explained or not by a lease that expired in between. The stall is the time from the
heal to the victim's first call that succeeds. URLs use short timeouts so that a round
is short (Redis: socket 1 s, connect 0.5 s; PostgreSQL: ``NsPostgres.SHORT``, user
timeout 1 s, connect and pool 2 s; RabbitMQ: request timeout 2 s, heartbeat 1 s).

Then the slow link (``--slow N``, 0 to skip): throughput of puts one by one, of
``put_many`` of 100 and of draining (reserve 100 + ``ack_many``), and the lateness of N
messages due at 50 a second, straight over a veth link and through a proxy that adds
20 ms +- 10 ms each way (``tests/faults/_delay.py``: this kernel has no ``netem``), then
both again with 1 % of the link's packets dropped each way (``Link.lose``, an ``nft``
table in the server's namespace), in the same run. It prints a table and writes JSON;
it never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import redis

from _common import RESULTS_DIR, Measure, environment, print_table, write_json

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from delayq.backends._replicated import NoScheduler  # noqa: E402
from delayq.errors import LeaseLost, OutcomeUnknown  # noqa: E402
from faults._delay import DelayProxy  # noqa: E402
from faults._faces import PG_OUTAGE, Face  # noqa: E402
from faults._history import History, Report, check  # noqa: E402
from faults._netns import (  # noqa: E402
    Link,
    NsPostgres,
    NsRabbit,
    NsRedis,
    ServerHost,
    namespaces_refused,
)

LEASE = 1.0
MESSAGES = 40
#: What a consumer rides out: the server lost, or a lease lost meanwhile.
EXPECTED = (
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
    LeaseLost,
    NoScheduler,
    OutcomeUnknown,
    *PG_OUTAGE,
)
#: What each backend's URLs timeouts are in the table.
TIMEOUTS = {
    "redis": "socket timeout 1 s, connect 0.5 s",
    "postgres": "tcp_user_timeout 1 s, connect and pool 2 s",
    "amqp": "request timeout 2 s, heartbeat 1 s",
}


class CampaignRabbit:
    """A private RabbitMQ node in a host, as the campaign uses it: one namespace
    (``prefix``) for the run; every URL a non-candidate (``scheduler=off``), with short
    timeouts from :meth:`short_url`; :func:`scheduling` runs the scheduler."""

    def __init__(self, host: ServerHost, directory: Path) -> None:
        self.node = NsRabbit(host, directory)
        self.prefix = f"delayq-faults-{secrets.token_hex(4)}"

    @property
    def port(self) -> int:
        return self.node.port

    def start(self, link: Link) -> None:
        self.node.start(link)

    def stop(self) -> None:
        self.node.stop()

    def url(self, link: Link, scheduler: str = "off", **params: object) -> str:
        return self.node.url(link, prefix=self.prefix, scheduler=scheduler, **params)

    def short_url(self, link: Link, scheduler: str = "off") -> str:
        return self.url(link, scheduler, request_timeout=2, heartbeat=1)


Server = NsRedis | NsPostgres | CampaignRabbit


@asynccontextmanager
async def scheduling(face: str, server: Server, link: Link) -> AsyncIterator[None]:
    """On RabbitMQ, a scheduler of the campaign's own through ``link`` for the block
    (elected before it starts); nothing elsewhere."""
    if not isinstance(server, CampaignRabbit):
        yield
        return
    async with Face(face, server.short_url(link, scheduler="on"), "scheduler") as scheduler:
        await scheduler.call("stats")  # elected, on the link that stays up
        yield


@contextmanager
def serving(backend: str, host: ServerHost, link: Link) -> Iterator[Server]:
    """``backend``'s server in ``host``, answering through ``link``; stopped at the end."""
    with TemporaryDirectory(prefix="delayq-faults-") as directory:
        server: Server
        if backend == "postgres":
            server = NsPostgres(host)
        elif backend == "amqp":
            server = CampaignRabbit(host, Path(directory))
            server.start(link)
        else:
            server = NsRedis(host, Path(directory))
            server.start(link)
        try:
            yield server
        finally:
            server.stop()


def proxied(server: Server, address: str) -> str:
    """The URL of ``server`` through a proxy at ``address`` (host:port)."""
    if isinstance(server, NsPostgres):
        return f"postgresql://postgres@{address}/postgres"
    if isinstance(server, CampaignRabbit):
        return f"amqp://guest:guest@{address}/%2F?prefix={server.prefix}&scheduler=off"
    return f"redis://{address}/0"


class Consumer:
    """A reserve-and-ack loop on one face, its calls recorded; ``successes``: when each
    call that succeeded returned."""

    def __init__(self, face: Face, history: History, rng: random.Random) -> None:
        self.face, self.history, self.rng = face, history, rng
        self.successes: list[float] = []
        self.stop = False

    async def run(self) -> None:
        while not self.stop:
            try:
                await self._turn()
            except EXPECTED:
                await asyncio.sleep(0.05)

    async def _turn(self) -> None:
        with self.history.call("reserve") as op:
            messages = await self.face.call("reserve", wait=0.2, lease=LEASE, max=4)
            op.deliver(messages)
        self.successes.append(time.time())
        for message in messages:
            await asyncio.sleep(self.rng.uniform(0.0, 0.03))  # the work
            with self.history.call("ack", message.id, token=message.lease):
                await self.face.call("ack", message)
            self.successes.append(time.time())


async def one_round(
    face: str, server: Server, victim_link: Link, other_link: Link, rng: random.Random, n: int
) -> tuple[Report, float, str, float]:
    """One round: its report, the stall after the heal (s), the fault and its length."""
    name = f"campaign-{n}"
    history = History(unknown=[OutcomeUnknown])
    producer = Face(face, server.short_url(other_link), name)
    victim = Consumer(Face(face, server.short_url(victim_link), name), history, rng)
    other = Consumer(Face(face, server.short_url(other_link), name), history, rng)
    fault = rng.choice(("cut", "silence"))
    length = rng.uniform(0.3, 2.5)
    tasks = [asyncio.ensure_future(c.run()) for c in (victim, other)]
    stored: list[str] = []
    try:
        for index in range(MESSAGES):
            id = f"m{index}"
            delay = rng.uniform(0.0, 1.5)
            with history.call("put", id, delay=delay):
                await producer.call("put", index, id=id, delay=delay)
            stored.append(id)
            await asyncio.sleep(rng.uniform(0.0, 0.03))
        await asyncio.sleep(rng.uniform(0.0, 0.8))
        getattr(victim_link, fault)()
        await asyncio.sleep(length)
        victim_link.heal()
        healed = time.time()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            acked = {op.id for op in history.ops if op.kind == "ack" and op.outcome == "ok"}
            if acked >= set(stored):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(LEASE + 0.3)  # a lease lost at the end would show again
    finally:
        victim.stop = other.stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
        victim_link.heal()
        for closing in (producer, victim.face, other.face):
            await closing.close()
    after = [t for t in victim.successes if t > healed]
    stall = (after[0] - healed) if after else float("inf")
    return check(history), stall, fault, length


async def campaign(backend: str, face: str, rounds: int, seed: int) -> dict[str, Any]:
    """Run ``rounds`` rounds on ``face``; the totals."""
    rng = random.Random(seed)
    totals: dict[str, Any] = {
        "rounds": 0,
        "messages": 0,
        "deliveries": 0,
        "lost": 0,
        "early": 0,
        "acked_back": 0,
        "phantom": 0,
        "duplicates": 0,
        "explained": 0,
        "unexplained": 0,
        "unknown": 0,
        "worst_stall": 0.0,
        "violations": [],
        "faults": {"cut": 0, "silence": 0},
    }
    with ServerHost() as host:
        victim_link, other_link = host.link(), host.link()
        with serving(backend, host, other_link) as server:
            async with scheduling(face, server, other_link):
                for n in range(rounds):
                    report, stall, fault, length = await one_round(
                        face, server, victim_link, other_link, rng, n
                    )
                    totals["rounds"] += 1
                    totals["faults"][fault] += 1
                    for key in ("messages", "deliveries", "duplicates", "explained", "unknown"):
                        totals[key] += getattr(report, key)
                    for key in ("lost", "early", "acked_back", "phantom", "unexplained"):
                        totals[key] += len(getattr(report, key))
                    totals["worst_stall"] = max(totals["worst_stall"], stall)
                    totals["violations"] += [f"round {n}: {v}" for v in report.violations()]
                    print(
                        f"{face} round {n}: {fault} {length:.1f} s, {report.deliveries} "
                        f"deliveries, {report.duplicates} duplicates, stall {stall:.2f} s, "
                        f"{len(report.violations())} violations",
                        flush=True,
                    )
    return totals


def measures_of(backend: str, face: str, totals: dict[str, Any]) -> list[Measure]:
    """The table's rows for one face."""
    count = "count"
    rows = [
        Measure(
            face,
            "rounds (cut / silence)",
            totals["rounds"],
            count,
            note=f"{totals['faults']['cut']} / {totals['faults']['silence']}",
        ),
        Measure(face, "messages put", totals["messages"], count),
        Measure(face, "deliveries", totals["deliveries"], count),
        Measure(face, "lost", totals["lost"], count, "0", totals["lost"] == 0),
        Measure(face, "early", totals["early"], count, "0", totals["early"] == 0),
        Measure(
            face,
            "acked, then delivered again",
            totals["acked_back"],
            count,
            "0",
            totals["acked_back"] == 0,
        ),
        Measure(
            face,
            "delivered without a stored put",
            totals["phantom"],
            count,
            "0",
            totals["phantom"] == 0,
        ),
        Measure(face, "calls of unknown outcome (OutcomeUnknown)", totals["unknown"], count),
        Measure(face, "duplicates", totals["duplicates"], count),
        Measure(
            face,
            "duplicates a lease expiry explains",
            totals["explained"],
            count,
            "all",
            totals["unexplained"] == 0,
        ),
        Measure(
            face,
            "worst stall of the victim after the heal",
            totals["worst_stall"],
            "s",
            note=TIMEOUTS[backend],
        ),
    ]
    return rows


async def link_figures(face: str, url: str, name: str, count: int) -> dict[str, float]:
    """Throughput of puts one by one, of batches of 100, of draining by reserve of 100
    and ``ack_many``, and the lateness of ``count`` messages due at 50 a second (one
    consumer keeps up), over ``url``."""
    q = Face(face, url, name)
    rng = random.Random(21)
    figures: dict[str, float] = {}
    try:
        started = time.perf_counter()
        for n in range(count):
            await q.call("put", n, id=f"one-{n}")
        figures["put"] = count / (time.perf_counter() - started)
        started = time.perf_counter()
        for first in range(0, 10 * count, 100):
            await q.call("put_many", [{"payload": n} for n in range(first, first + 100)])
        figures["put_many"] = 10 * count / (time.perf_counter() - started)
        started = time.perf_counter()
        drained = 0
        while messages := await q.call("reserve", wait=0, max=100):
            await q.call("ack_many", messages)
            drained += len(messages)
        figures["drain"] = drained / (time.perf_counter() - started)
        figures["missing"] = 11 * count - drained
        # Due at 50 a second, which one consumer keeps up with over either link.
        spread = 0.1 + count / 50
        batch = [{"payload": n, "delay": rng.uniform(0.1, spread)} for n in range(count)]
        await q.call("put_many", batch)
        late: list[float] = []
        while len(late) < count:
            messages = await q.call("reserve", wait=2, max=100)
            arrived = time.time()
            late += [arrived - m.due_at / 1000 for m in messages]
            await q.call("ack_many", messages)
        figures["late_p50"] = statistics.median(late)
        figures["late_max"] = max(late)
    finally:
        await q.close()
    return figures


async def slow_link(backend: str, face: str, count: int) -> list[Measure]:
    """The figures of :func:`link_figures` straight over a veth link, then through a
    proxy adding 20 ms +- 10 ms each way (``tests/faults/_delay.py``)."""
    rows: list[Measure] = []
    section = f"{face} slow"
    with ServerHost() as host:
        link = host.link()
        with serving(backend, host, link) as server:
            async with scheduling(face, server, link):
                port = server.PORT if isinstance(server, NsRedis) else server.port
                with DelayProxy((link.address, port), 0.020, 0.010) as proxy:
                    direct, slow = server.url(link), proxied(server, proxy.address)
                    # The loss is on the veth link, under the proxy's connection too.
                    runs = [
                        ("direct", direct, False),
                        ("20 ms +- 10 ms", slow, False),
                        ("1 % loss", direct, True),
                        ("20 ms +- 10 ms, 1 % loss", slow, True),
                    ]
                    for label, url, lossy in runs:
                        if lossy:
                            link.lose(every=100)
                        else:
                            link.heal()
                        f = await link_figures(face, url, f"slow-{len(rows)}", count)
                        rows += [
                            Measure(section, f"{label}: put, one by one", f["put"], "items/s"),
                            Measure(section, f"{label}: put_many of 100", f["put_many"], "items/s"),
                            Measure(
                                section, f"{label}: reserve 100 + ack_many", f["drain"], "items/s"
                            ),
                            Measure(
                                section, f"{label}: lateness, median", f["late_p50"] * 1000, "ms"
                            ),
                            Measure(
                                section, f"{label}: lateness, worst", f["late_max"] * 1000, "ms"
                            ),
                            Measure(
                                section, f"{label}: missing after drain", f["missing"], "items"
                            ),
                        ]
                        if lossy:
                            rows.append(
                                Measure(section, f"{label}: packets dropped", link.lost(), "")
                            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the campaign, print, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", choices=tuple(TIMEOUTS), default="redis")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--face", choices=("sync", "async", "both"), default="both")
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument(
        "--slow", type=int, default=100, help="messages of the slow-link section (0: skip)"
    )
    parser.add_argument("--json", type=Path, default=None, help="default: faults[-BACKEND].json")
    args = parser.parse_args(argv)
    if args.json is None:
        suffix = "" if args.backend == "redis" else f"-{args.backend}"
        args.json = RESULTS_DIR / f"faults{suffix}.json"
    refused = namespaces_refused()
    if refused:
        print(f"cannot make network namespaces here: {refused}", file=sys.stderr)
        return 2
    env = environment()
    faces = ("sync", "async") if args.face == "both" else (args.face,)
    measures: list[Measure] = []
    violations: dict[str, list[str]] = {}
    for face in faces:
        totals = asyncio.run(campaign(args.backend, face, args.rounds, args.seed))
        measures += measures_of(args.backend, face, totals)
        violations[face] = totals["violations"]
    for face in faces if args.slow else ():
        measures += asyncio.run(slow_link(args.backend, face, args.slow))
    title = f"delayq fault campaign on {args.backend}: {args.rounds} rounds a face"
    print_table(title, measures)
    for face, found in violations.items():
        for line in found:
            print(f"{face}: {line}")
    write_json(
        args.json,
        {
            "benchmark": "faults",
            "backend": args.backend,
            "rounds": args.rounds,
            "seed": args.seed,
            "environment": env,
        },
        measures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
