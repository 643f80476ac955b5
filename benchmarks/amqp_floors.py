"""The RabbitMQ floors that the ``amqp://`` backend is held to (issue 18), and the
latency of each step on the design's hot paths (``docs/rabbitmq.md``).

Run ``python benchmarks/amqp_floors.py --url amqp://guest:guest@127.0.0.1:5672/``
with the AMQP client installed (``pip install aiormq``: the core of aio-pika, the
client the design chose; nothing else beyond the standard library and rich). Every
queue it declares is named ``delayq-design-<section>-<hex>`` and deleted at the end.
It prints a table and writes JSON to ``benchmarks/results/amqp-floors.json``
(``-quick`` with ``--quick``); it never asserts.

Sections

a. Broker floor 1: publish one message at a time to a quorum queue, waiting for each
   publisher confirm (persistent, 100-byte body): messages per second.
b. Broker floor 2: the same, 1000 publishes with their confirms in flight, then wait.
c. Broker floor 3: consume the messages of (b) with prefetch 1000, acking every 100
   (``multiple``): messages per second.
d. The design's log: append to a stream one at a time waiting for each confirm (rate
   and p50/p99 of one confirm), then 1000 appends in flight.
e. The log's read side: a consumer tailing the stream (``x-stream-offset: next``)
   receives each append: p50/p99 from publish to delivery.
f. The request/reply transport: a request through a transient classic queue (the
   scheduler's), a reply through the client's exclusive inbox queue: one by one, and
   from 16 tasks at once. Direct reply-to (f2) is a little cheaper but cannot
   tell the scheduler that the client is gone (a ``mandatory`` reply to it is always
   returned), so the design replies to an inbox.
g. The put path end to end: f plus a stream append with its confirm before the
   reply, the server grouping the appends of requests that arrive together: one by
   one (rate, p99) and 16 tasks at once.
h. The firing path: a scheduler's timer fires at a message's due time, appends the
   lease record to the stream, waits for the confirm and replies to the waiting
   consumer: lateness (receipt minus due time) p50/p99/max for messages due over a
   few seconds; never early.
i. The TTL ladder's step (the approach not chosen): a quorum queue with a queue TTL
   of 100 ms dead-letters (at-least-once) to a quorum queue a consumer reads:
   lateness of messages published one every 5 ms, then of a burst of 5000.
j. Election: two consumers of a quorum queue with single-active-consumer; the active
   one holds the one token message unacked; its connection closes: time until the
   other one receives the token.
k. Replay: a new scheduler reads the log from its start; 100,000 appended records of
   200 bytes read with prefetch 2000 (acked every 1000): records per second, which
   bounds the time a failover takes per live record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage

from _common import (
    RESULTS_DIR,
    Measure,
    console,
    environment,
    percentile,
    print_table,
    write_json,
)

BODY = b"x" * 100
PERSISTENT = aiormq.spec.Basic.Properties(delivery_mode=2)


def name(section: str) -> str:
    return f"delayq-design-{section}-{uuid.uuid4().hex[:8]}"


class Broker:
    """One connection and the queues this run declared (deleted by :meth:`close`)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.declared: list[str] = []
        self.conn: aiormq.Connection | None = None

    async def open(self) -> aiormq.Connection:
        self.conn = await aiormq.connect(self.url)
        return self.conn

    async def connect(self) -> aiormq.Connection:
        return await aiormq.connect(self.url)

    async def declare(self, ch: Any, queue: str, **arguments: Any) -> str:
        await ch.queue_declare(queue, durable=True, arguments=arguments)
        self.declared.append(queue)
        return queue

    async def close(self) -> None:
        assert self.conn is not None
        ch = await self.conn.channel()
        for queue in self.declared:
            try:
                await ch.queue_delete(queue)
            except aiormq.exceptions.AMQPError:
                ch = await self.conn.channel()
        await self.conn.close()


QUORUM = {"x-queue-type": "quorum"}
STREAM = {"x-queue-type": "stream", "x-max-length-bytes": 200_000_000}


# -- a, b, c: the floors ------------------------------------------------------------


async def floors(b: Broker, quick: bool) -> list[Measure]:
    out: list[Measure] = []
    ch = await b.conn.channel(publisher_confirms=True)
    q = await b.declare(ch, name("floor"), **QUORUM)
    n = 500 if quick else 1500
    started = time.perf_counter()
    for _ in range(n):
        await ch.basic_publish(BODY, routing_key=q, properties=PERSISTENT)
    rate = n / (time.perf_counter() - started)
    out.append(
        Measure(
            "a",
            "quorum: publish one by one, wait each confirm",
            rate,
            "items/s",
            note="floor 1: put one by one >= 80% of it",
        )
    )
    batches = 5 if quick else 20
    started = time.perf_counter()
    for _ in range(batches):
        await asyncio.gather(
            *(ch.basic_publish(BODY, routing_key=q, properties=PERSISTENT) for _ in range(1000))
        )
    rate = batches * 1000 / (time.perf_counter() - started)
    out.append(
        Measure(
            "b",
            "quorum: 1000 publishes with confirms in flight",
            rate,
            "items/s",
            note="floor 2: put_many >= 80% of it",
        )
    )
    total = n + batches * 1000
    cch = await b.conn.channel()
    await cch.basic_qos(prefetch_count=1000)
    done = asyncio.get_running_loop().create_future()
    seen = 0

    async def on_message(message: DeliveredMessage) -> None:
        nonlocal seen
        seen += 1
        if seen % 100 == 0 or seen == total:
            await cch.basic_ack(message.delivery_tag, multiple=True)
        if seen == total and not done.done():
            done.set_result(None)

    started = time.perf_counter()
    await cch.basic_consume(q, on_message)
    await asyncio.wait_for(done, 120)
    rate = total / (time.perf_counter() - started)
    out.append(
        Measure(
            "c",
            "quorum: consume, prefetch 1000, ack every 100",
            rate,
            "items/s",
            note=f"floor 3: drain >= 50% of it ({total} messages)",
        )
    )
    await cch.close()
    await ch.close()
    return out


# -- d, e: the stream as the log ------------------------------------------------------


async def stream_log(b: Broker, quick: bool) -> list[Measure]:
    out: list[Measure] = []
    ch = await b.conn.channel(publisher_confirms=True)
    s = await b.declare(ch, name("log"), **STREAM)
    n = 500 if quick else 1500
    lat: list[float] = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        await ch.basic_publish(BODY, routing_key=s, properties=PERSISTENT)
        lat.append((time.perf_counter() - t0) * 1000)
    rate = n / (time.perf_counter() - started)
    lat.sort()
    out.append(
        Measure(
            "d",
            "stream: append one by one, wait each confirm",
            rate,
            "items/s",
            note=f"confirm p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms",
            extra={"p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99)},
        )
    )
    batches = 5 if quick else 20
    started = time.perf_counter()
    for _ in range(batches):
        await asyncio.gather(
            *(ch.basic_publish(BODY, routing_key=s, properties=PERSISTENT) for _ in range(1000))
        )
    rate = batches * 1000 / (time.perf_counter() - started)
    out.append(Measure("d", "stream: 1000 appends with confirms in flight", rate, "items/s"))
    # e: tail latency, publish -> delivery to a consumer reading from "next".
    cconn = await b.connect()
    cch = await cconn.channel()
    await cch.basic_qos(prefetch_count=1000)
    arrived: dict[int, float] = {}
    count = 300 if quick else 1000

    async def on_message(message: DeliveredMessage) -> None:
        arrived[int(message.body)] = time.perf_counter()
        await cch.basic_ack(message.delivery_tag)

    await cch.basic_consume(s, on_message, arguments={"x-stream-offset": "next"})
    await asyncio.sleep(0.2)
    sent: dict[int, float] = {}
    for i in range(count):
        sent[i] = time.perf_counter()
        await ch.basic_publish(str(i).encode(), routing_key=s, properties=PERSISTENT, wait=False)
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.5)
    tail = sorted((arrived[i] - sent[i]) * 1000 for i in sent if i in arrived)
    out.append(
        Measure(
            "e",
            "stream: publish -> delivery to a tailing consumer, p50",
            percentile(tail, 0.5),
            "ms",
            note=f"{len(tail)}/{count} arrived",
        )
    )
    out.append(
        Measure(
            "e",
            "stream: publish -> delivery to a tailing consumer, p99",
            percentile(tail, 0.99),
            "ms",
            note=f"max {max(tail):.2f} ms",
        )
    )
    await cconn.close()
    await ch.close()
    return out


# -- f, g, h: the design's request/reply paths ------------------------------------------


class Scheduler:
    """A stand-in for the elected scheduler: takes requests from a transient classic
    queue, groups those that arrive together into one stream append (``log``), waits
    for its confirm, replies through direct reply-to. ``timers`` fire at due times."""

    def __init__(self, b: Broker, log: bool) -> None:
        self.b = b
        self.log = log
        self.pending: list[DeliveredMessage] = []
        self.flushing = False

    async def start(self, requests: str, stream: str, handler: Any = None) -> None:
        self.conn = await self.b.connect()
        self.ch = await self.conn.channel(publisher_confirms=True)
        self.reply_ch = await self.conn.channel(publisher_confirms=False)
        self.stream = stream
        await self.ch.basic_qos(prefetch_count=1000)
        await self.ch.basic_consume(requests, handler or self.on_request, no_ack=True)

    async def on_request(self, message: DeliveredMessage) -> None:
        if not self.log:
            await self.reply(message, message.body)
            return
        self.pending.append(message)
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self.flush()))

    async def flush(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            record = b"".join(m.body for m in batch)  # one append for the whole group
            await self.ch.basic_publish(record, routing_key=self.stream, properties=PERSISTENT)
            for m in batch:
                await self.reply(m, b"ok")
        self.flushing = False

    async def reply(self, m: DeliveredMessage, body: bytes) -> None:
        await self.reply_ch.basic_publish(
            body,
            routing_key=m.header.properties.reply_to,
            properties=aiormq.spec.Basic.Properties(
                correlation_id=m.header.properties.correlation_id
            ),
            wait=False,
        )

    async def fire_at(self, due: float, reply_to: str, corr: str) -> None:
        """h: wait until ``due`` (perf_counter), append the lease record, reply."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_at(loop.time() + max(0.0, due - time.perf_counter()), fut.set_result, None)
        await fut
        while time.perf_counter() < due:  # the loop's timer may fire a hair early
            await asyncio.sleep(0)
        await self.ch.basic_publish(
            b"lease:" + corr.encode(), routing_key=self.stream, properties=PERSISTENT
        )
        await self.reply_ch.basic_publish(
            corr.encode(),
            routing_key=reply_to,
            properties=aiormq.spec.Basic.Properties(correlation_id=corr),
            wait=False,
        )

    async def close(self) -> None:
        await self.conn.close()


class Client:
    """Requests through the requests queue, replies on direct reply-to."""

    def __init__(self, b: Broker, direct: bool = False) -> None:
        self.b = b
        self.direct = direct
        self.waiting: dict[str, asyncio.Future[bytes]] = {}
        self.arrived: dict[str, float] = {}

    async def start(self, requests: str) -> None:
        self.requests = requests
        self.conn = await self.b.connect()
        self.ch = await self.conn.channel(publisher_confirms=False)
        # The client's inbox: exclusive, so a reply to a client that is gone is
        # returned to the scheduler (mandatory), which direct reply-to cannot tell.
        if self.direct:
            self.inbox = "amq.rabbitmq.reply-to"
        else:
            ok = await self.ch.queue_declare("", exclusive=True, auto_delete=True)
            self.inbox = ok.queue
        await self.ch.basic_consume(self.inbox, self.on_reply, no_ack=True)

    async def on_reply(self, message: DeliveredMessage) -> None:
        corr = message.header.properties.correlation_id
        self.arrived[corr] = time.perf_counter()
        fut = self.waiting.pop(corr, None)
        if fut is not None and not fut.done():
            fut.set_result(message.body)

    async def call(self, body: bytes) -> bytes:
        corr = uuid.uuid4().hex
        fut = asyncio.get_running_loop().create_future()
        self.waiting[corr] = fut
        await self.ch.basic_publish(
            body,
            routing_key=self.requests,
            properties=aiormq.spec.Basic.Properties(reply_to=self.inbox, correlation_id=corr),
            wait=False,
        )
        return await fut

    async def close(self) -> None:
        await self.conn.close()


async def rpc_rates(
    b: Broker, log: bool, quick: bool, direct: bool = False
) -> tuple[float, float, list[float]]:
    ch = await b.conn.channel()
    requests = name("rpc")
    await ch.queue_declare(
        requests, durable=False, auto_delete=True, arguments={"x-queue-type": "classic"}
    )
    stream = await b.declare(ch, name("rpclog"), **STREAM)
    server = Scheduler(b, log)
    await server.start(requests, stream)
    client = Client(b, direct)
    await client.start(requests)
    n = 500 if quick else 1500
    lat: list[float] = []
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        await client.call(BODY)
        lat.append((time.perf_counter() - t0) * 1000)
    one = n / (time.perf_counter() - started)

    async def task(k: int) -> None:
        for _ in range(k):
            await client.call(BODY)

    tasks, per = 16, (n * 3) // 16
    started = time.perf_counter()
    await asyncio.gather(*(task(per) for _ in range(tasks)))
    many = tasks * per / (time.perf_counter() - started)
    await client.close()
    await server.close()
    return one, many, sorted(lat)


async def request_paths(b: Broker, quick: bool) -> list[Measure]:
    out: list[Measure] = []
    one, many, lat = await rpc_rates(b, log=False, quick=quick)
    label = "request/reply (reply to the client's inbox), one by one"
    out.append(
        Measure(
            "f",
            label,
            one,
            "items/s",
            note=f"p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms",
        )
    )
    out.append(Measure("f", "request/reply, 16 tasks at once", many, "items/s"))
    one, many, lat = await rpc_rates(b, log=False, quick=quick, direct=True)
    out.append(
        Measure(
            "f",
            "f2: request/reply through direct reply-to, one by one",
            one,
            "items/s",
            note=f"p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms",
        )
    )
    one, many, lat = await rpc_rates(b, log=True, quick=quick)
    out.append(
        Measure(
            "g",
            "put path: request + stream append + confirm + reply, one by one",
            one,
            "items/s",
            note=f"p50 {percentile(lat, 0.5):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms",
            extra={"p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99)},
        )
    )
    out.append(Measure("g", "put path, 16 tasks at once (appends grouped)", many, "items/s"))
    return out


async def firing(b: Broker, quick: bool) -> list[Measure]:
    ch = await b.conn.channel()
    stream = await b.declare(ch, name("firelog"), **STREAM)
    server = Scheduler(b, log=True)
    requests = name("firerpc")
    await ch.queue_declare(requests, durable=False, auto_delete=True)
    reply_to = None

    async def learn(message: DeliveredMessage) -> None:
        # A waiting reserve: the scheduler keeps where to reply when its message is due.
        nonlocal reply_to
        reply_to = message.header.properties.reply_to

    await server.start(requests, stream, learn)
    client = Client(b)
    await client.start(requests)
    count, span = (300, 2.0) if quick else (1000, 5.0)
    base = time.perf_counter() + 0.3
    dues = {uuid.uuid4().hex: base + span * i / count for i in range(count)}
    await client.ch.basic_publish(
        b"reserve",
        routing_key=requests,
        properties=aiormq.spec.Basic.Properties(reply_to=client.inbox),
        wait=False,
    )
    while reply_to is None:
        await asyncio.sleep(0.01)
    await asyncio.gather(*(server.fire_at(due, reply_to, corr) for corr, due in dues.items()))
    await asyncio.sleep(0.3)
    late = sorted((client.arrived[c] - d) * 1000 for c, d in dues.items() if c in client.arrived)
    early = sum(1 for x in late if x < 0)
    await client.close()
    await server.close()
    return [
        Measure(
            "h",
            "firing: timer -> lease append + confirm -> reply, p50",
            percentile(late, 0.5),
            "ms",
            note=f"{len(late)}/{count} arrived, {early} early",
        ),
        Measure(
            "h",
            "firing: lateness p99",
            percentile(late, 0.99),
            "ms",
            "<= 10 ms",
            percentile(late, 0.99) <= 10.0,
        ),
        Measure("h", "firing: lateness max", max(late), "ms", "<= 50 ms", max(late) <= 50.0),
    ]


# -- i: a TTL step ----------------------------------------------------------------------


async def ttl_step(b: Broker, quick: bool) -> list[Measure]:
    out: list[Measure] = []
    ch = await b.conn.channel(publisher_confirms=True)
    target = await b.declare(ch, name("ttl-out"), **QUORUM)
    wait = await b.declare(
        ch,
        name("ttl-100ms"),
        **QUORUM,
        **{
            "x-message-ttl": 100,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": target,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
    )
    cconn = await b.connect()
    cch = await cconn.channel()
    await cch.basic_qos(prefetch_count=1000)
    arrived: dict[int, float] = {}

    async def on_message(message: DeliveredMessage) -> None:
        arrived[int(message.body)] = time.perf_counter()
        await cch.basic_ack(message.delivery_tag)

    await cch.basic_consume(target, on_message)
    for label, count, gap in (
        ("one every 5 ms", 200 if quick else 600, 0.005),
        ("a burst of 5000", 5000, 0.0),
    ):
        arrived.clear()
        sent: dict[int, float] = {}
        if gap:
            for i in range(count):
                sent[i] = time.perf_counter()
                await ch.basic_publish(str(i).encode(), routing_key=wait, properties=PERSISTENT)
                await asyncio.sleep(gap)
        else:
            sent = {i: time.perf_counter() for i in range(count)}
            await asyncio.gather(
                *(
                    ch.basic_publish(str(i).encode(), routing_key=wait, properties=PERSISTENT)
                    for i in range(count)
                )
            )
        deadline = time.perf_counter() + 15
        while len(arrived) < count and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        late = sorted((arrived[i] - sent[i]) * 1000 - 100 for i in sent if i in arrived)
        out.append(
            Measure(
                "i",
                f"TTL 100 ms step ({label}): lateness p50 / p99",
                percentile(late, 0.99),
                "ms",
                note=f"p50 {percentile(late, 0.5):.1f} ms, max {max(late):.1f} ms, "
                f"{len(late)}/{count} arrived",
                extra={"p50_ms": percentile(late, 0.5), "max_ms": max(late)},
            )
        )
    await cconn.close()
    await ch.close()
    return out


# -- j: election ------------------------------------------------------------------------


async def election(b: Broker, quick: bool) -> list[Measure]:
    ch = await b.conn.channel(publisher_confirms=True)
    lock = await b.declare(ch, name("lock"), **QUORUM, **{"x-single-active-consumer": True})
    await ch.basic_publish(b"token", routing_key=lock, properties=PERSISTENT)
    got: dict[str, float] = {}
    conns = []
    for who in ("first", "second"):
        conn = await b.connect()
        cch = await conn.channel()
        await cch.basic_qos(prefetch_count=1)

        async def on_token(message: DeliveredMessage, who: str = who) -> None:
            got[who] = time.perf_counter()

        await cch.basic_consume(lock, on_token)
        conns.append(conn)
        await asyncio.sleep(0.2)
    if "first" not in got or "second" in got:
        raise RuntimeError(f"single-active-consumer did not hold: {got}")
    t0 = time.perf_counter()
    await conns[0].close()
    while "second" not in got and time.perf_counter() - t0 < 10:
        await asyncio.sleep(0.0005)
    await conns[1].close()
    took = (got.get("second", float("nan")) - t0) * 1000
    return [
        Measure(
            "j",
            "SAC handover after the holder's connection closes",
            took,
            "ms",
            note="a clean close; a killed node: see the doc's experiments",
        )
    ]


# -- k: replay ---------------------------------------------------------------------------


async def replay(b: Broker, quick: bool) -> list[Measure]:
    ch = await b.conn.channel(publisher_confirms=True)
    s = await b.declare(ch, name("replay"), **STREAM)
    total = 20_000 if quick else 100_000
    record = b"r" * 200
    for _ in range(total // 1000):
        await asyncio.gather(
            *(ch.basic_publish(record, routing_key=s, properties=PERSISTENT) for _ in range(1000))
        )
    rch = await b.conn.channel()
    await rch.basic_qos(prefetch_count=2000)
    done = asyncio.get_running_loop().create_future()
    seen = 0

    async def on_message(message: DeliveredMessage) -> None:
        nonlocal seen
        seen += 1
        if seen % 1000 == 0:
            await rch.basic_ack(message.delivery_tag, multiple=True)
        if seen == total and not done.done():
            done.set_result(None)

    started = time.perf_counter()
    await rch.basic_consume(s, on_message, arguments={"x-stream-offset": "first"})
    await asyncio.wait_for(done, 120)
    rate = total / (time.perf_counter() - started)
    await rch.close()
    await ch.close()
    return [
        Measure(
            "k",
            f"replay: read {total:,} records from the stream's first offset",
            rate,
            "items/s",
            note="the read side of a failover",
        )
    ]


async def main_async(url: str, quick: bool, sections: str) -> tuple[list[Measure], dict]:
    b = Broker(url)
    conn = await b.open()
    server = conn.server_properties
    info = {"rabbitmq": server.get("version"), "erlang": server.get("platform")}
    out: list[Measure] = []
    steps = {
        "abc": floors,
        "de": stream_log,
        "fg": request_paths,
        "h": firing,
        "i": ttl_step,
        "j": election,
        "k": replay,
    }
    try:
        for key, step in steps.items():
            if any(s in sections for s in key):
                out += await step(b, quick)
    finally:
        await b.close()
    return out, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sections", default="abcdefghijk")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    measures, info = asyncio.run(main_async(args.url, args.quick, args.sections))
    info["aiormq"] = version("aiormq")
    info["pamqp"] = version("pamqp")
    print_table(
        f"RabbitMQ floors and the design's paths (RabbitMQ {info['rabbitmq']}, "
        f"aiormq {info.get('aiormq')})",
        measures,
    )
    path = args.json or RESULTS_DIR / f"amqp-floors{'-quick' if args.quick else ''}.json"
    write_json(path, {"environment": environment(), "broker": info}, measures)
    console.print(json.dumps(info))


if __name__ == "__main__":
    main()
