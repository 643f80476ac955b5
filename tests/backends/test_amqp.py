"""What is specific to ``amqp://`` (the shared contract is in tests/conformance): its URL
and options, the election (a pure producer never stands, a consumer does), and a new
scheduler that rebuilds the whole state from the log, leases included.

The tests use the shared RabbitMQ under a namespace (``prefix``) of their own, deleted
afterwards (the conformance suite's ``amqp`` entry).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import pytest

from delayq import UnsupportedURL
from delayq.durable import AsyncQueue, Message, Queue, State
from delayq.errors import OutcomeUnknown

pytest.importorskip("aiormq")

from conformance._helpers import in_thread
from conformance.conftest import AsyncFace, LoopThread, amqp_url, drop_amqp_shards
from delayq.backends._records import Records
from delayq.backends._replicated import _scheduler
from delayq.backends._replicated._codec import encode_outcome, pack
from delayq.backends._replicated._link import _core
from delayq.backends._replicated._options import shard_of
from delayq.backends._replicated._scheduler import _waiting
from delayq.backends.amqp import NOT_GUARANTEED, NoScheduler, ServerRefused

from ._amqp_mistakes import mute_candidate
from ._redis_server import free_port

#: The request timeout of a call that waits it out (a candidate that never answers):
#: short, yet long enough for a loaded broker to open the first connection and say who
#: stands, which the timeout covers too (past it: ServerRefused, or nothing sent).
MUTE_TIMEOUT = 3.0
#: The request timeout of a call refused at once (nothing stands): never waited out.
REFUSED_TIMEOUT = 10.0


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield from amqp_url(tmp_path)


@pytest.mark.parametrize(
    ("url", "options", "error", "match"),
    [
        ("amqp://", {}, UnsupportedURL, "names a host"),
        ("amqp://h1:5672,,h2:5672/", {}, UnsupportedURL, "or a list of them"),
        ("amqp://h1:5672,h2:99999/", {}, UnsupportedURL, "bad port: 'h2:99999'"),
        ("amqp://h/?shards=0", {}, ValueError, "shards must be a whole number from 1 to 256"),
        ("amqp://h/?shards=257", {}, ValueError, "shards must be"),
        ("amqp://h/?shards=2x", {}, ValueError, "shards must be"),
        ("amqp://h/", {"shards": 2.0}, ValueError, "shards must be"),
        ("amqp://h/", {"shards": True}, ValueError, "shards must be"),
        ("amqp://h/?shards=2&scheduler_shards=2", {}, ValueError, "from 0 to 1 .shards=2."),
        ("amqp://h/?scheduler_shards=", {}, ValueError, "scheduler_shards must list"),
        ("amqp://h/?shards=3&scheduler_shards=0,x", {}, ValueError, "scheduler_shards"),
        ("amqp://h/?shards=3", {"scheduler_shards": [True]}, ValueError, "scheduler_shards"),
        ("amqp://h/", {"clock": None}, TypeError, "clock"),
        ("amqp://h/?prefix=", {}, ValueError, "prefix"),
        ("amqp://h/", {"prefix": "a b"}, ValueError, "prefix"),
        ("amqp://h/?scheduler=maybe", {}, ValueError, "scheduler"),
        ("amqp://h/?standby=warm", {}, ValueError, "standby must be hot or cold"),
        ("amqp://h/", {"standby": True}, ValueError, "standby must be hot or cold"),
        ("amqp://h/", {"request_timeout": 0}, ValueError, "request_timeout"),
        ("amqp://h/?request_timeout=nan", {}, ValueError, "request_timeout"),
        ("amqp://h/?retention_bytes=-1", {}, ValueError, "retention_bytes"),
        ("amqp://h/?retention_bytes=5", {}, ValueError, "retention_bytes"),
        ("amqp://h/?retention_bytes=2GB", {}, ValueError, "retention_bytes"),
        ("amqp://h/", {"retention_bytes": 1.5e9}, ValueError, "retention_bytes"),
        ("amqp://h/", {"retention_bytes": True}, ValueError, "retention_bytes"),
    ],
)
def test_url_and_options_are_checked_before_any_io(
    url: str, options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Queue(url, **options)


def test_the_clock_is_declared_not_guaranteed() -> None:
    assert "server time" in NOT_GUARANTEED["server-clock"]


def test_a_pure_producer_does_not_stand_and_a_consumer_does(url: str) -> None:
    # put_outcome: a request to the scheduler (a put() would be kept in the intake
    # with no scheduler to answer: test_amqp_fastput.py).
    with Queue(url, name="jobs", scheduler="auto", request_timeout=REFUSED_TIMEOUT) as producer:
        with pytest.raises(NoScheduler):
            producer.put_outcome("lost")
        got: list[object] = []
        with Queue(url, name="jobs", scheduler="auto") as consumer:
            waiting = threading.Thread(
                target=lambda: got.extend(m.payload for m in consumer.reserve(wait=10))
            )
            waiting.start()
            deadline = time.monotonic() + 10
            while True:  # the consumer stands once it waits; then a put goes through
                try:
                    producer.put_outcome("kept")
                    break
                except NoScheduler:
                    assert time.monotonic() < deadline
            waiting.join(10)
            consumer.purge()
        assert got == ["kept"]


def test_a_change_without_a_reply_is_reported_unknown_and_a_read_as_no_scheduler(
    url: str,
) -> None:
    """A sent put or ack may have been taken by a scheduler whose reply was lost: the
    caller is told its fate is unknown (an OutcomeUnknown, and a NoScheduler still); a
    read changes nothing and is just NoScheduler (tests/faults has the real faults).
    Here a candidate stands and never answers (a scheduler that hangs)."""
    with (
        mute_candidate(url),
        Queue(url, name="jobs", scheduler="off", request_timeout=MUTE_TIMEOUT) as producer,
    ):
        with pytest.raises(OutcomeUnknown) as raised:
            producer.put_outcome("maybe")  # a request (put() goes to the intake)
        assert isinstance(raised.value, NoScheduler)
        assert raised.value.operation == "put"
        with pytest.raises(NoScheduler) as read:
            producer.stats()
        assert not isinstance(read.value, OutcomeUnknown)


def test_a_broker_that_never_answers_fails_calls_within_the_request_timeout() -> None:
    """A host that takes the TCP connection and then says nothing (or drops the SYN)
    must not hold a call for the connect's own timeouts (aiormq has none)."""
    with contextlib.closing(socket.create_server(("127.0.0.1", 0))) as mute:
        port = mute.getsockname()[1]
        url = f"amqp://guest:guest@127.0.0.1:{port}/%2F?request_timeout=0.5"

        def put_sync() -> None:
            with Queue(url, name="jobs", scheduler="off") as queue:
                queue.put("never")

        async def put_async() -> None:
            async with AsyncQueue(url, name="jobs", scheduler="off") as queue:
                await queue.put("never")

        for put in (put_sync, lambda: asyncio.run(put_async())):
            started = time.monotonic()
            with pytest.raises(ServerRefused, match=r"no connection to the broker in 0\.5 s"):
                put()  # a first connection: never sent
            assert time.monotonic() - started < 5


def test_a_new_scheduler_rebuilds_the_state_from_the_log(url: str) -> None:
    first = Queue(url, name="jobs")  # the fixture's URL: every object a candidate
    ids = first.put_many([{"payload": n, "delay": 0 if n < 3 else 60} for n in range(5)])
    held, acked = first.reserve(max=2, lease=60)
    first.ack(acked)
    dead = first.reserve(max=1)[0]
    first.nack(dead, dead=True, error="boom")
    assert first.cancel(ids[4])
    before = first.stats()
    with Queue(url, name="jobs") as second:  # stands at once, elected when first closes
        second.stats()
        first.close()
        assert second.stats() == before
        assert [m.id for m in second.dead()] == [dead.id]
        assert second.get(ids[3]).state is State.SCHEDULED
        assert second.get(ids[4]) is None
        second.ack(held)  # the lease and its token were logged: it still holds
        assert second.get(held.id) is None
        assert second.put_outcome(ids[3], id=ids[3]).created is False
        second.purge()


def test_a_list_of_hosts_is_tried_in_turn(url: str) -> None:
    """The first host refuses connections (a port nothing listens on): the backend
    connects to the next one, and keeps to it."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    listed = urlunsplit(parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{free_port()},{host}"))
    with Queue(listed, name="jobs") as q:
        q.put("x", id="a")
        [message] = q.reserve(wait=5)
        assert message.id == "a"
        q.ack(message)


def test_a_second_answer_to_a_reserve_gives_back_what_its_caller_did_not_receive(
    url: str,
) -> None:
    """A resend of a reserve that two schedulers serve across an election (the new one
    did not know of the first answer) answers a call that is over: the link gives back
    the messages its caller did not receive, so no one holds them until their lease
    expires, and keeps those it did."""

    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as q, AsyncQueue(url, name="jobs") as other:
            await q.put("a", id="a")
            await q.put("b", id="b")
            [first] = await q.reserve(wait=0, lease=60)
            assert first.id == "a"
            link = q._backend._link  # type: ignore[attr-defined]
            request_id = next(reversed(link.core.answered))
            # The second answer: "a" again as the caller got it, and "b", claimed for it.
            [held] = await other._backend.reserve("jobs", limit=1, lease_ms=60_000, wait=0)
            stored = await q._backend.get("jobs", "a")  # as get shows it: no token
            assert held.id == "b"
            assert stored is not None
            again = dataclasses.replace(stored, lease=first.lease)
            link._on_reply(request_id, "ok", pack(encode_outcome("reserve", [again, held])))
            deadline = time.monotonic() + 10
            while (await q.get("b")).state is not State.READY:  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "b was not given back"
                await asyncio.sleep(0.02)
            b = await q.get("b")
            assert b is not None
            assert b.attempts == 0
            a = await q.get("a")
            assert a is not None
            assert a.state is State.ACTIVE  # the caller holds it: not given back
            assert a.lease_expires_at == first.lease_expires_at
            await q.ack(first)

    asyncio.run(main())


def test_a_second_answer_in_the_turn_of_the_first_gives_back_what_it_claimed(url: str) -> None:
    """A reserve resent (a new scheduler, a new connection) may be served twice: the
    first answer empty at the end of its wait, the resend with a message. When the
    second answer comes in the same turn of the loop as the first, before the call
    took it, the message it claimed (which no caller receives) is ready again at
    once, not held by no one until its lease expires."""
    client = url.replace("scheduler=on", "scheduler=off")

    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as scheduler, AsyncQueue(client, name="jobs") as q:
            await scheduler.put("b", id="b")
            [held] = await scheduler._backend.reserve(  # type: ignore[attr-defined]
                "jobs", limit=1, lease_ms=60_000, wait=0
            )
            link = q._backend._link  # type: ignore[attr-defined]
            second = pack(encode_outcome("reserve", [held]))
            answered: list[str] = []

            def on_reply(request_id: str, kind: str, body: bytes) -> None:
                type(link)._on_reply(link, request_id, kind, body)
                if kind == "ok" and request_id in link._pending and not answered:
                    answered.append(request_id)  # the resend's answer, right behind
                    type(link)._on_reply(link, request_id, "ok", second)

            link._on_reply = on_reply  # before its connection opens, which takes it
            assert await q.reserve(wait=0.2, lease=60) == []  # the first answer: empty
            assert answered
            took = time.monotonic()
            while (await q.get("b")).state is not State.READY:  # type: ignore[union-attr]
                assert time.monotonic() - took < 10, "b was held to its 60 s lease"
                await asyncio.sleep(0.02)
            b = await q.get("b")
            assert b is not None
            assert b.attempts == 0  # given back: no attempt charged
            await q.purge()

    asyncio.run(main())


def test_a_waiting_reserve_resent_on_a_new_connection_is_answered_there(url: str) -> None:
    """A client that gives up its connection (a request got no reply in time) resends
    its waiting reserve on a new one; the scheduler, which still has it parked, answers
    the new connection's inbox, not the old one that no one reads any more."""
    client = url.replace("scheduler=on", "scheduler=off")

    async def main() -> list[str]:
        async with AsyncQueue(url, name="jobs") as scheduler, AsyncQueue(client, name="jobs") as q:
            await scheduler.stats()  # elected
            waiting = asyncio.ensure_future(q.reserve(wait=20))
            link = q._backend._link  # type: ignore[attr-defined]
            while not link._pending:  # the reserve is on its way
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # parked at the scheduler
            old = link._transport
            link._abandon(old)
            while link._transport in (None, old):  # resent on a new connection
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            await scheduler.put("x", id="x")
            messages = await asyncio.wait_for(waiting, 10)
            return [m.id for m in messages]

    assert asyncio.run(main()) == ["x"]


def test_a_waiting_reserve_whose_answer_is_lost_ends_after_its_wait_and_the_timeout(
    url: str,
) -> None:
    """A scheduler that parked a reserve and stopped with no successor never answers
    it (no scheduler announces itself, so nothing is resent): a finite wait still ends,
    its wait and the request timeout after it was sent, as a reserve whose reply was
    lost (an OutcomeUnknown and a NoScheduler), instead of waiting for ever."""
    client = url.replace("scheduler=on", "scheduler=off")
    wait, timeout = 1.0, 1.0

    async def main() -> None:
        async with AsyncQueue(client, name="jobs", request_timeout=timeout) as q:
            scheduler = AsyncQueue(url, name="jobs")
            try:
                await scheduler.stats()  # elected
                waiting = asyncio.ensure_future(q.reserve(wait=wait))
                link = q._backend._link  # type: ignore[attr-defined]
                while not link._pending:  # the reserve is on its way
                    await asyncio.sleep(0.005)
                sent = time.monotonic()
                [request_id] = link._pending
                await asyncio.sleep(0.3)  # parked at the scheduler
            finally:
                await scheduler.close()  # stops serving: the parked reserve is dropped
            with pytest.raises(OutcomeUnknown) as raised:
                await asyncio.wait_for(waiting, 30)
            took = time.monotonic() - sent
            # Its wait and the timeout, not much less (then a slow answer would be
            # taken for a lost one) nor much more (a caller held past what it asked).
            assert wait + timeout * 0.75 <= took < (wait + timeout) * 1.5, took
            assert isinstance(raised.value, NoScheduler)
            assert raised.value.operation == "reserve"
            # An answer that still comes (on the connection being given up) gives back
            # what it claimed: its caller is gone.
            async with AsyncQueue(url, name="jobs") as successor:
                await successor.put("x", id="x")
                [held] = await successor._backend.reserve(  # type: ignore[attr-defined]
                    "jobs", limit=1, lease_ms=60_000, wait=0
                )
                link._on_reply(request_id, "ok", pack(encode_outcome("reserve", [held])))
                deadline = time.monotonic() + 10
                while (await q.get("x")).state is not State.READY:  # type: ignore[union-attr]
                    assert time.monotonic() < deadline, "x was not given back"
                    await asyncio.sleep(0.02)
                await q.purge()

    asyncio.run(main())


def test_a_waiting_reserve_cancelled_on_its_way_claims_nothing(url: str) -> None:
    """A reserve cancelled while its request is being sent may still reach the
    scheduler and park there: it is forgotten all the same, so the next message is
    not claimed by a caller that is gone (and held until its lease expired)."""

    async def main() -> list[str]:
        claimed: list[str] = []
        async with AsyncQueue(url, name="jobs") as q:
            await q.stats()  # connected, elected
            for i in range(40):
                waiting = asyncio.ensure_future(q.reserve(wait=10))
                for _ in range(i % 8):  # cancelled at each step of its way out
                    await asyncio.sleep(0)
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
                await q.put(i, id=f"m{i}")
                message = await q.get(f"m{i}")
                assert message is not None
                if message.state is not State.READY:
                    claimed.append(message.id)
                await q.purge()
        return claimed

    assert asyncio.run(main()) == []


@pytest.fixture
def wide_fire_ahead(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The scheduler claims for a waiting reserve up to 2 s ahead (10 ms in use), so
    that a test sees the hold without racing it; the ids it claims ahead, as it claims
    them (a claim ahead is not visible to a user: get, stats and the rest give it back
    first)."""
    monkeypatch.setattr(_waiting, "FIRE_AHEAD_MS", 2000)
    ids: list[str] = []
    claim_ahead = Records.claim_ahead

    def spy(self: Records, now: Any, horizon: int, limit: int, lease_ms: int) -> list[Any]:
        claimed = claim_ahead(self, now, horizon, limit, lease_ms)
        ids.extend(record.id for record in claimed)
        return claimed

    monkeypatch.setattr(Records, "claim_ahead", spy)
    return ids


async def _park_then_put(
    q: AsyncQueue, other: AsyncQueue, claims: list[str], id: str, delay: float, lease: float = 60
) -> asyncio.Future[list[Message]]:
    """``q`` elected, a reserve of ``q`` parked, then ``id`` put by ``other`` with
    ``delay``: the reserve, once ``id`` is claimed ahead for it."""
    await q.stats()
    waiting = asyncio.ensure_future(q.reserve(wait=10, lease=lease))
    await asyncio.sleep(0.2)  # parked
    await other.put(id, id=id, delay=delay)
    await _claimed_ahead(claims, id)
    return waiting


async def _back_then_on_time(q: AsyncQueue, id: str) -> Message:
    """The message ``id``, given back (scheduled, no attempt charged), as the next
    reserve gets it: not before its due time."""
    back = await q.get(id)
    assert back is not None
    assert back.state is State.SCHEDULED
    assert back.attempts == 0
    [message] = await q.reserve(wait=10)
    assert message.id == id
    assert time.time() * 1000 >= message.due_at
    return message


async def _claimed_ahead(claims: list[str], id: str) -> None:
    """Once the message ``id`` is claimed ahead for a waiting reserve."""
    deadline = time.monotonic() + 5
    while id not in claims:
        assert time.monotonic() < deadline, "not claimed ahead"
        await asyncio.sleep(0.01)


def test_a_message_claimed_ahead_reaches_its_caller_at_its_due_time(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """A waiting reserve is answered before the message is due (its lease logged, the
    reply on its way), and the client holds it until the due time: never early, and
    its lease runs from the due time, whole. Until its reply leaves, the message is
    seen as if it had not been claimed."""

    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as q, AsyncQueue(url, name="jobs") as other:
            started = time.time()
            waiting = await _park_then_put(q, other, wide_fire_ahead, "x", 1.0, lease=30)
            assert not waiting.done()  # claimed for it, held until its due time
            seen = await other.get("x")
            assert seen is not None
            assert (seen.state, seen.attempts) == (State.SCHEDULED, 0)
            stats = await other.stats()
            assert (stats.scheduled, stats.active) == (1, 0)
            [message] = await asyncio.wait_for(waiting, 10)
            assert time.time() * 1000 >= message.due_at
            assert time.time() - started >= 1.0
            assert message.attempts == 1
            assert message.lease_expires_at == message.due_at + 30_000
            await q.ack(message)

    asyncio.run(main())


def test_a_reserve_cancelled_while_it_holds_messages_gives_them_back(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """A caller that gives up while its link holds messages claimed ahead for it: they
    are given back (no attempt charged) and reach the next reserve at their time."""

    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as q, AsyncQueue(url, name="jobs") as other:
            waiting = await _park_then_put(q, other, wide_fire_ahead, "x", 1.5)
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            deadline = time.monotonic() + 5
            while (back := await other.get("x")) is not None and back.state is State.ACTIVE:
                assert time.monotonic() < deadline, "not given back"
                await asyncio.sleep(0.01)
            await other.ack(await _back_then_on_time(other, "x"))

    asyncio.run(main())


def test_a_reserve_whose_wait_ends_before_the_due_time_claims_nothing_ahead(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """Claiming ahead never takes a message due after the reserve's wait ends: the
    reserve returns empty and the message stays scheduled, unclaimed."""
    with Queue(url, name="jobs") as q:
        q.put("x", id="x", delay=1.0)
        assert q.reserve(wait=0.3) == []
        message = q.get("x")
        assert message is not None
        assert message.state is State.SCHEDULED
        assert message.attempts == 0


def test_the_sync_face_holds_a_message_claimed_ahead_until_its_due_time(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """The same through the sync face, which holds it in the calling thread."""
    with Queue(url, name="jobs") as q, Queue(url, name="jobs") as other:
        q.stats()  # elected
        got: list[tuple[list[Any], float]] = []

        def consume() -> None:
            messages = q.reserve(wait=10)
            got.append((messages, time.time()))

        waiting = threading.Thread(target=consume)
        waiting.start()
        time.sleep(0.2)  # parked
        other.put("x", id="x", delay=1.0)
        deadline = time.monotonic() + 5
        while "x" not in wide_fire_ahead:
            assert time.monotonic() < deadline, "not claimed ahead"
            time.sleep(0.01)
        assert waiting.is_alive()  # held until its due time
        waiting.join(10)
        [([message], returned)] = got
        assert returned * 1000 >= message.due_at
        q.ack(message)


def test_a_message_due_now_is_not_kept_waiting_behind_one_claimed_ahead(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """A waiting reserve whose message was claimed ahead but not yet sent takes a
    message that falls due meanwhile instead: the one claimed ahead goes back (its due
    time and attempts as they were) and reaches a later reserve at its time."""

    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as q, AsyncQueue(url, name="jobs") as other:
            waiting = await _park_then_put(q, other, wide_fire_ahead, "later", 1.5)
            await other.put("now", id="now")
            [first] = await asyncio.wait_for(waiting, 1.0)  # not held until "later" is due
            assert first.id == "now"
            await q.ack_many([first, await _back_then_on_time(q, "later")])

    asyncio.run(main())


def test_a_message_claimed_ahead_can_be_cancelled_until_its_reply_leaves(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """A cancel that comes while a message is claimed ahead and its reply has not left
    succeeds as for any scheduled message: the message is never delivered, and the
    waiting reserve stays parked for the next one."""

    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as q, AsyncQueue(url, name="jobs") as other:
            waiting = await _park_then_put(q, other, wide_fire_ahead, "x", 1.0)
            assert await other.cancel("x")
            assert await other.get("x") is None
            await asyncio.sleep(1.2)  # past its due time
            assert not waiting.done()
            await other.put("y", id="y", delay=0.2)
            [message] = await asyncio.wait_for(waiting, 10)
            assert message.id == "y"
            await q.ack(message)
            assert await other.get("x") is None

    asyncio.run(main())


def test_a_message_claimed_ahead_can_be_rescheduled_or_replaced_until_its_reply_leaves(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """A reschedule, or a put that replaces it, while a message is claimed ahead and
    its reply has not left: it moves (or changes) as a scheduled message would, and
    reaches the waiting reserve at its new time, with what the put stored."""

    async def main() -> None:
        async with AsyncQueue(url, name="jobs") as q, AsyncQueue(url, name="jobs") as other:
            waiting = await _park_then_put(q, other, wide_fire_ahead, "x", 0.8)
            first = await other.get("x")
            assert first is not None
            assert await other.reschedule("x", delay=1.5)
            # Each gave it back, then claimed it ahead again for the reserve still parked.
            assert wide_fire_ahead.count("x") == 3
            assert await other.put("new", id="x", delay=1.2, on_conflict="replace") == "x"
            [message] = await asyncio.wait_for(waiting, 10)
            assert message.id == "x"
            assert message.payload == "new"
            assert message.due_at > first.due_at
            assert time.time() * 1000 >= message.due_at
            assert message.attempts == 1
            assert wide_fire_ahead.count("x") == 4
            await q.ack(message)

    asyncio.run(main())


def test_a_cancelled_claim_ahead_is_not_the_answer_to_a_reserve_resent_after_a_failover(
    url: str, wide_fire_ahead: list[str]
) -> None:
    """A message claimed ahead for a waiting reserve, then cancelled before its reply
    left: the reply it would have carried is not that reserve's answer any more, in the
    log either, so the reserve, resent to the next scheduler, waits again and never
    gets the cancelled message."""
    client = url.replace("scheduler=on", "scheduler=off")

    async def main() -> list[str]:
        async with AsyncQueue(client, name="jobs") as q:
            first = AsyncQueue(url, name="jobs")
            await first.stats()  # elected
            waiting = asyncio.ensure_future(q.reserve(wait=20))
            await asyncio.sleep(0.2)  # parked
            await first.put("x", id="x", delay=1.5)
            await _claimed_ahead(wide_fire_ahead, "x")
            assert await first.cancel("x")
            async with AsyncQueue(url, name="jobs") as second:
                await second.stats()  # stands; elected once first closes
                await first.close()
                assert await second.get("x") is None  # second serves now
                await asyncio.sleep(2.0)  # past x's due time
                assert not waiting.done()
                await second.put("y", id="y", delay=0.2)
                messages = await asyncio.wait_for(waiting, 15)
                await q.ack_many(messages)
                return [m.id for m in messages]

    assert asyncio.run(main()) == ["y"]


@pytest.fixture
def requests_seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The operations the scheduler of this process receives, in order (a batch's
    parts each)."""
    seen: list[str] = []
    on_request = _scheduler.Scheduler._on_request

    def spy(self: Any, delivery: Any) -> None:
        seen.append(delivery.op)
        on_request(self, delivery)

    monkeypatch.setattr(_scheduler.Scheduler, "_on_request", spy)
    return seen


def test_a_consumer_loop_has_a_reserve_waiting_while_it_acks(
    url: str, requests_seen: list[str]
) -> None:
    """reserve, then ack_many of what it got: the link sends the next reserve with the
    acks, so that a message falling due during their round trip finds a reserve at
    the scheduler; the caller's next reserve takes its answer."""
    with Queue(url, name="jobs") as q:
        q.put("a", id="a")
        first = q.reserve(wait=5, max=10)
        assert [m.id for m in first] == ["a"]
        q.put("b", id="b", delay=0.3)
        del requests_seen[:]
        q.ack_many(first)
        # Sent ahead, before the caller asks. It leaves right after the acks, and the
        # scheduler may answer them before it takes the reserve off the wire.
        deadline = time.monotonic() + 5
        while requests_seen.count("reserve") == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert requests_seen.count("reserve") == 1
        second = q.reserve(wait=5, max=10)
        assert [(m.id, m.attempts) for m in second] == [("b", 1)]
        assert requests_seen.count("reserve") == 1  # the caller's took its answer
        q.ack_many(second)
        assert q.stats().active == q.stats().ready == q.stats().scheduled == 0


@pytest.mark.parametrize("host", ["closing", "other"])
def test_a_close_gives_back_what_the_reserve_sent_ahead_claimed_whenever_it_comes(
    url: str, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close lands at any moment of the reserve sent with the acks: unanswered (it
    is forgotten), answered (what it got is released), or answered and given up
    already (its releases on their way); the scheduler may live in the closing queue
    and go with it. In every case the message it claimed is found at once by another
    consumer, with no attempt charged, rather than after its lease."""
    monkeypatch.setattr(_core, "AHEAD_KEPT", 0.0)  # given up as soon as answered

    async def main() -> None:
        for turns in range(6):  # of the loop between the acks and the close
            async with AsyncQueue(url, name="jobs") as other:
                if host == "other":
                    assert await other.reserve(wait=0.05) == []  # stands: the scheduler
                # Else the first waiting reserve elects the closing queue's scheduler.
                q = AsyncQueue(url, name="jobs", scheduler="auto" if host == "closing" else "off")
                await q.put("a", id="a")
                first = await q.reserve(wait=5, max=10)
                await q.put("b", id="b")  # due now: the reserve sent ahead claims it
                await q.ack_many(first)
                for _ in range(turns):
                    await asyncio.sleep(0)
                await q.close()
                taken = await other.reserve(wait=5, max=10, lease=60)
                assert [(m.id, m.attempts) for m in taken] == [("b", 1)], turns
                await other.ack_many(taken)

    asyncio.run(main())


def test_what_the_reserve_sent_with_the_acks_claimed_is_given_back_before_any_other_call(
    url: str,
) -> None:
    """A call other than the matching reserve (here cancel) finds the message the
    reserve sent ahead claimed as if it had never been claimed; so does another
    consumer once the caller is busy elsewhere, and after a close."""
    with Queue(url, name="jobs") as q, Queue(url, name="jobs") as other:
        for round in range(3):
            q.put("a", id="a")
            first = q.reserve(wait=5, max=10)
            q.put("b", id="b")  # due now: the reserve sent ahead claims it at once
            q.ack_many(first)
            if round == 0:
                assert q.cancel("b") is True
                assert q.reserve(wait=0.3) == []
            elif round == 1:
                time.sleep(0.3)  # the caller does something else: given back
                taken = other.reserve(wait=2, max=10)
                assert [(m.id, m.attempts) for m in taken] == [("b", 1)]
                other.ack_many(taken)
            else:
                break
        q.close()  # with a reserve sent ahead and its claim: given back
        taken = other.reserve(wait=5, max=10, lease=60)
        assert [(m.id, m.attempts) for m in taken] == [("b", 1)]
        other.ack_many(taken)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_what_the_reserve_sent_ahead_claimed_is_given_back_uncharged_after_its_lease(
    url: str, face: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reserve sent with the acks claims with the caller's lease, which may run out
    before the claim is given back: here 50 ms, and the caller's next call (a get)
    comes later, as any call may under load. The message is given back all the same,
    as if never claimed: no attempt charged, no lease expiry noted and, with one
    attempt allowed, not dead (it was dead before: a message no caller received)."""
    monkeypatch.setattr(_core, "AHEAD_KEPT", 60.0)  # kept until the caller's next call
    runner = LoopThread() if face == "async" else None

    def make() -> Any:
        if runner is None:
            return Queue(url, name="jobs")

        async def build() -> AsyncQueue:
            return AsyncQueue(url, name="jobs")

        return AsyncFace(runner, runner.run(build()))

    try:
        with make() as q:
            q.put("a", id="a")
            first = q.reserve(wait=5, max=10, lease=0.05)
            q.put("b", id="b", max_attempts=1)  # due now: the reserve sent ahead claims it
            q.ack_many(first)
            time.sleep(0.3)  # the lease of the claim sent ahead has run out
            seen = q.get("b")
            assert (seen.state, seen.attempts, seen.last_error) == (State.READY, 0, None)
            # ("a" too when its own 50 ms lease ran out before the acks, under load.)
            taken = {m.id: m for m in q.reserve(wait=0, max=10, lease=30)}
            assert taken["b"].attempts == 1
            assert q.ack_many(list(taken.values())) == []
    finally:
        if runner is not None:
            runner.stop()


def test_a_close_fails_a_call_waiting_for_a_connection_before_its_cleanup(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reserve waits while the first connection opens; the queue is closed meanwhile:
    the reserve raises QueueClosed at once, while the opening the close gave up is still
    cleaning up (here its transport's close is held until the reserve has raised; a
    busy broker takes seconds over one)."""
    from delayq import QueueClosed  # noqa: PLC0415
    from delayq.backends.amqp._transport import AmqpTransport  # noqa: PLC0415

    opening = threading.Event()
    released = threading.Event()
    open_transport, close_transport = AmqpTransport.open, AmqpTransport.close

    async def slow_open(self: AmqpTransport, *args: Any) -> None:
        opening.set()
        await asyncio.sleep(30)  # cancelled by the close
        await open_transport(self, *args)

    async def held_close(self: AmqpTransport) -> None:
        while not released.is_set():
            await asyncio.sleep(0.01)
        await close_transport(self)

    monkeypatch.setattr(AmqpTransport, "open", slow_open)
    monkeypatch.setattr(AmqpTransport, "close", held_close)
    queue = Queue(url, name="jobs", request_timeout=60)  # not what ends the wait
    waiting = in_thread(queue.reserve, wait=30)
    assert opening.wait(10)
    closing = threading.Thread(target=queue.close)
    closing.start()
    try:
        with pytest.raises(QueueClosed):
            waiting.result(10)
        assert closing.is_alive()  # the opening's cleanup still holds the close
    finally:
        released.set()
        closing.join(10)
    assert not closing.is_alive()


def test_a_call_no_scheduler_answers_says_how_to_run_one(url: str) -> None:
    """A pure client on a namespace where no scheduler runs: its call fails with
    NoScheduler, whose message says how to run a scheduler."""
    client = url.replace("scheduler=on", "scheduler=off")
    with (
        Queue(client, name="jobs", request_timeout=REFUSED_TIMEOUT) as queue,
        pytest.raises(NoScheduler, match="delayq scheduler"),
    ):
        queue.stats()


def test_each_call_of_a_sharded_namespace_goes_to_its_queues_shard(url: str) -> None:
    """``shards=3``: every operation on a queue is decided by its shard's scheduler and
    kept in that shard's namespace (``<prefix>.<k>``), where a client of that namespace
    alone finds it and the other shards know nothing of the queue; ``queues()`` lists the
    queues of every shard. Both faces."""
    sharded = f"{url}&shards=3"
    prefix = dict(parse_qsl(urlsplit(url).query))["prefix"]
    names = [next(f"q{i}" for i in range(100) if shard_of(f"q{i}", 3) == k) for k in range(3)]
    try:
        for name in names:
            with Queue(sharded, name=name) as q:
                q.put("a", id="a")
                q.put("b", id="b", delay=60)
                q.put("c", id="c", delay=60)
                [a] = q.reserve(wait=5)
                assert q.extend(a, lease=60) > 0
                q.release(a)
                [a] = q.reserve(wait=5)
                assert q.nack(a, dead=True) is State.DEAD
                assert [m.id for m in q.dead()] == ["a"]
                assert q.retry_dead() == 1
                [a] = q.reserve(wait=5)
                q.ack(a)
                assert q.cancel("b") is True
                assert q.reschedule("c", delay=0) is True
                assert [m.id for m in q.peek()] == ["c"]
                assert q.get("c") is not None
                q.put("d", id="d", delay=20)
                assert q.stats().scheduled == 1
                assert q.due_counts(horizon=60, buckets=2)[1] == [1, 0]
                got = q.reserve(wait=5, max=10)
                assert [m.id for m in got] == ["c"]
                assert q.ack_many(got) == []
                assert q.purge() == 1
                q.put("kept", id="kept", delay=60)

        async def on_the_async_face() -> list[str]:
            async with AsyncQueue(sharded, name=names[2]) as q:
                await q.put("e", id="e")
                [e] = await q.reserve(wait=5)
                await q.ack(e)
                return await q.queues()

        assert asyncio.run(on_the_async_face()) == sorted(names)
        for k, name in enumerate(names):
            alone = url.replace(f"prefix={prefix}", f"prefix={prefix}.{k}")
            with Queue(alone, name=name) as shard:
                assert shard.queues() == [name]
                assert [m.id for m in shard.peek()] == ["kept"]
    finally:
        drop_amqp_shards(url, 3)
