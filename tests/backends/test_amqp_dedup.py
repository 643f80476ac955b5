"""The dedup table on RabbitMQ (tests/backends/test_dedup_window.py has its rules with
the log in memory): a client sends a change again for a bounded time only after its
first send, so that the scheduler may forget a request id once no copy can come; the
table then follows the request rate times that window, not a fixed count; a failover
inside the window still answers a resent request once."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from backends.test_amqp_fastput import client, scheduler
from conformance.conftest import amqp_url
from delayq.backends._replicated import _scheduler
from delayq.backends._replicated._codec import decode_outcome, pack, reserve_items, unpack
from delayq.backends._replicated._scheduler import _dedup, _group_commit
from delayq.backends.amqp._constants import LOCK_ARGUMENTS, RPC_KEY
from delayq.durable import AsyncQueue, Queue
from delayq.errors import OutcomeUnknown


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield from amqp_url(tmp_path)


@contextlib.contextmanager
def deaf_scheduler(url: str, every: float) -> Iterator[list[tuple[float, str]]]:
    """A process that holds the election of ``url``'s namespace, takes every request and
    never answers, and says it was elected again every ``every`` s (a scheduler
    elected over and over, each losing what it was sent): yields what it received,
    ``(time.monotonic(), request id)`` for each request (a batch's parts each)."""
    prefix = url.split("prefix=", 1)[1].split("&", 1)[0]
    received: list[tuple[float, str]] = []
    ready = threading.Event()
    stop = threading.Event()
    failed: list[BaseException] = []

    def take(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        at = time.monotonic()
        if properties.type == "batch":
            received.extend((at, part[1]) for part in unpack(body))
        else:
            received.append((at, properties.correlation_id))

    def run() -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
            channel = connection.channel()
            lock = f"{prefix}.lock"
            channel.queue_declare(lock, durable=True, arguments=dict(LOCK_ARGUMENTS))
            channel.basic_consume(lock, lambda *_: None)
            channel.exchange_declare(f"{prefix}.rpc", exchange_type="direct", durable=True)
            channel.exchange_declare(f"{prefix}.events", exchange_type="fanout", durable=True)
            queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
            channel.queue_bind(queue, f"{prefix}.rpc", routing_key=RPC_KEY)
            channel.basic_consume(queue, take, auto_ack=True)
            ready.set()
            announce = time.monotonic()
            while not stop.is_set():
                if time.monotonic() >= announce:
                    channel.basic_publish(
                        f"{prefix}.events", "", b"deaf", pika.BasicProperties(type="elected")
                    )
                    announce += every
                connection.process_data_events(time_limit=0.01)
            connection.close()
        except BaseException as exc:
            failed.append(exc)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        assert not failed, failed
        yield received
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_change_is_not_sent_again_past_its_cap_since_the_first_send(url: str, face: str) -> None:
    """Each new scheduler makes a call send its request again: a change keeps its
    request id only while the scheduler may still remember it, so no send of it
    leaves later than the request timeout after the first, however many schedulers
    come; the call then ends as a change with no reply (ReplyLost, an
    OutcomeUnknown), not as long as elections go on."""
    client = url.replace("scheduler=on", "scheduler=off")
    timeout = 1.0

    def put() -> None:
        if face == "sync":
            with Queue(client, name="jobs", request_timeout=timeout) as q:
                q.put_outcome("x", id="x")
            return

        async def main() -> None:
            async with AsyncQueue(client, name="jobs", request_timeout=timeout) as q:
                await q.put_outcome("x", id="x")

        asyncio.run(main())

    with deaf_scheduler(url, every=0.2) as received:
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown):
            put()
        took = time.monotonic() - started
    sends = [at for at, _ in received]
    assert len({request_id for _, request_id in received}) == 1
    assert len(sends) >= 3, "not sent again at each election"
    assert sends[-1] - sends[0] <= timeout + 0.15, sends
    assert took < 2 * timeout + 1.5, took


def test_the_table_follows_the_request_rate_not_a_fixed_count(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a steady rate of changes (each a request id in the table), the table holds
    about the window's worth once the window has passed, not every request since the
    scheduler started; those in the window are answered once when resent."""
    window = 1.0
    windows = 6  # how long it runs
    monkeypatch.setattr(_dedup, "DEDUP_WINDOW", window)
    monkeypatch.setattr(_dedup, "DEDUP_PRUNE_EVERY", 0.1)
    schedulers: list[Any] = []
    run = _scheduler.Scheduler.run

    async def spy(self: Any) -> None:
        schedulers.append(self)
        await run(self)

    monkeypatch.setattr(_scheduler.Scheduler, "run", spy)

    async def main() -> tuple[int, list[tuple[float, int]]]:
        async with AsyncQueue(url, name="jobs") as q:
            await q.stats()  # elected
            [scheduler] = schedulers
            started = time.monotonic()
            sizes: list[tuple[float, int]] = []
            done = 0
            while (elapsed := time.monotonic() - started) < windows * window:
                await q.put_outcome(str(done), id=f"m{done}", delay=3600)
                done += 1
                await asyncio.sleep(0.005)
                sizes.append((elapsed, len(scheduler._dedup)))
            await q.purge()
            return done, sizes

    done, sizes = asyncio.run(main())
    late = [size for elapsed, size in sizes if elapsed >= (windows - 1.5) * window]
    rate = done / (windows * window)
    assert done > 100, done
    # The window, a round and the marker's trip, with a wide margin: never all of them.
    # Six windows, not four: on a loaded machine (33 puts a second) the table held 2.5
    # windows' worth, the marker's trip late, which a run of four made over half of all.
    assert max(late) < 2 * rate * window + 50, (max(late), rate, done)
    assert max(late) < done / 2, (max(late), done)


def test_a_change_resent_to_a_new_scheduler_inside_the_window_is_answered_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put whose reply never left its scheduler (which then stepped down): its caller
    sends it again, same request id, to the next scheduler, which answers from the
    replayed table (``created``, as the first answer would have been) rather than
    storing it again (then a DuplicateId)."""
    client = url.replace("scheduler=on", "scheduler=off")
    schedulers: list[Any] = []
    send = _group_commit.GroupCommit._send

    def mute(self: Any, replies: list[Any]) -> None:
        if schedulers and self is schedulers[0] and any(r.request_id for r in replies):
            return  # the first scheduler's replies are lost
        send(self, replies)

    run = _scheduler.Scheduler.run

    async def spy(self: Any) -> None:
        schedulers.append(self)
        await run(self)

    monkeypatch.setattr(_scheduler.Scheduler, "run", spy)

    async def main() -> None:
        first = AsyncQueue(url, name="jobs")
        await first.stats()  # elected
        async with AsyncQueue(url, name="jobs") as second, AsyncQueue(client, name="jobs") as q:
            await second.stats()  # stands
            await q.stats()
            monkeypatch.setattr(_group_commit.GroupCommit, "_send", mute)
            put = asyncio.ensure_future(q.put_outcome("x", id="x"))
            deadline = time.monotonic() + 10
            while "x" not in schedulers[0]._store("jobs").records:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # logged; its reply dropped
            await first.close()  # steps down: the second is elected, the put resent
            result = await asyncio.wait_for(put, 30)
            assert result.created is True
            assert len(schedulers) == 2
            assert (await second.get("x")).payload == "x"  # type: ignore[union-attr]
            await second.purge()

    asyncio.run(main())


def raw_calls(url: str, *calls: tuple[str, list[Any], str]) -> list[tuple[str, bytes]]:
    """Send ``(op, args, reply_to)`` requests, all with one request id, back to back as a
    client of delayq would (a reply_to of ``""``: this connection's inbox); the replies
    that reach the inbox ``(kind, body)``, as many as requests sent there."""
    prefix = url.split("prefix=", 1)[1].split("&", 1)[0]
    connection = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
    try:
        channel = connection.channel()
        inbox = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        request_id = uuid.uuid4().hex
        for op, args, reply_to in calls:
            properties = pika.BasicProperties(
                reply_to=reply_to or inbox, correlation_id=request_id, type=op
            )
            channel.basic_publish(f"{prefix}.rpc", RPC_KEY, pack(args), properties)
        replies: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + 10
        while len(replies) < sum(1 for _, _, reply_to in calls if not reply_to):
            assert time.monotonic() < deadline, "no reply"
            method, properties, body = channel.basic_get(inbox, auto_ack=True)
            if method is None:
                connection.process_data_events(time_limit=0.01)
                continue
            assert properties.correlation_id == request_id
            replies.append((properties.type, body))
        return replies
    finally:
        connection.close()


def test_a_reserve_resent_before_its_first_answer_left_keeps_what_it_was_answered(
    url: str,
) -> None:
    """A consumer's connection closes before the answer to its reserve comes; it sends
    the reserve again from a new connection, same request id, and is answered from the
    dedup table with the message claimed for the first send. The first answer, on its
    way meanwhile, then finds its inbox gone: the message stays the consumer's (not
    given back for another consumer to take while its holder works on it: its ack would
    then find the lease lost). Both sends reach the scheduler before the first answer
    leaves (it waits for its log append)."""
    with (
        scheduler(url),
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=10) as queue,
    ):
        queue.put("m", id="m")
        gone = f"gone-{uuid.uuid4().hex}"  # the closed connection's inbox: no such queue
        reserve = ["jobs", 1, 60_000, 0.0]
        [(kind, body)] = raw_calls(url, ("reserve", reserve, gone), ("reserve", reserve, ""))
        [held] = decode_outcome("reserve", reserve_items(kind, body))
        assert held.id == "m"
        time.sleep(0.5)  # the first answer returned meanwhile
        assert queue.reserve(wait=1) == []
        assert queue.stats().active == 1
        [(kind, _)] = raw_calls(url, ("ack", ["jobs", "m", held.lease], ""))
        assert kind == "ok"
        assert queue.stats().active == 0
