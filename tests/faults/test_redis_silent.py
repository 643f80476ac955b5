"""Scenario 2 on Redis: a server that stops answering without closing (its packets
dropped, no reset), on both faces.

Each call fails within a bound: a call that must connect, within the connect timeout
(a connect that timed out is not tried again at once); a call written on an open
connection, within the socket timeout. A change written before the server went silent
raises :class:`~delayq.errors.OutcomeUnknown` (it may have run, and it is not sent
again); a consumer waiting through the outage resumes once the server answers. The
URL's timeouts are short here (1 s and 0.5 s) to keep the tests short; the defaults
are 10 s and 5 s (docs/durability.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from delayq.errors import OutcomeUnknown

from ._faces import FACES, Face, fails
from ._faces import reserve as _reserve
from ._faces import settle as _settle
from ._history import History, check
from ._netns import READ_TIMEOUT, Link, NsRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

LEASE = 1.5


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> str:
    """Each test runs on both faces."""
    return str(request.param)


@pytest.fixture
def url(ns_redis: NsRedis, link: Link) -> str:
    """The test's Redis through ``link``, with the short timeouts."""
    return ns_redis.short_url(link)


def test_calls_to_a_silent_server_fail_in_bounded_time_and_a_waiting_consumer_resumes(
    face: str, url: str, link: Link
) -> None:
    history = History(unknown=[OutcomeUnknown])

    async def reserve(q: Face, **options: Any) -> list[Any]:
        return await _reserve(q, history, lease=LEASE, **options)

    async def ack(q: Face, message: Any) -> None:
        await _settle(q, history, "ack", message)

    async def main() -> None:
        async with Face(face, url, "silent") as q, Face(face, url, "silent") as waiter:
            for id in ("a", "b", "c"):
                with history.call("put", id):
                    await q.call("put", id, id=id)
            [held] = await reserve(q, wait=0)
            link.cut()
            # Written on the open connection, the put's reply never comes.
            with history.call("put", "d") as op:
                lost = await fails(q.call("put", "d", id="d"), op)
            assert isinstance(lost, OutcomeUnknown)
            assert lost.operation == "put"
            # The connection is gone: the next calls must connect, and cannot.
            with history.call("ack", held.id, token=held.lease) as op:
                assert not isinstance(await fails(q.call("ack", held), op), OutcomeUnknown)
            with history.call("reserve") as op:
                await fails(q.call("reserve", wait=0), op)
            # A consumer that waits through the outage gets messages once it heals.
            waiting = asyncio.ensure_future(reserve(waiter, wait=None, max=10))
            await asyncio.sleep(2 * READ_TIMEOUT)
            assert not waiting.done()
            link.heal()
            got = await asyncio.wait_for(waiting, 15)
            assert got
            for message in got:
                await ack(waiter, message)
            # The held message comes back once its lease expires; drain the queue.
            while messages := await reserve(q, wait=LEASE + 1, max=10):
                for message in messages:
                    await ack(q, message)

    asyncio.run(main())
    report = check(history)
    report.assert_ok()
    assert report.messages == 4  # a, b, c and the put of unknown fate
    assert report.explained == report.duplicates == 1  # the held one, after its lease


def test_a_put_or_claim_whose_reply_is_dropped_is_reported_unknown(
    face: str, url: str, link: Link
) -> None:
    """A put retried with its id stores nothing twice; what a lost claim took comes
    back after the lease."""

    async def main() -> None:
        async with Face(face, url, "unknown") as q:
            await q.call("put", "warm", id="warm")
            link.silence()  # the server still gets and runs what it is sent
            lost = await fails(q.call("put", "job", id="job"))
            assert isinstance(lost, OutcomeUnknown)
            link.heal()
            again = await q.call("put_outcome", "job", id="job")
            assert not again.created  # the first put had stored it: nothing twice
            # A claim whose reply is dropped: the messages it took come back after
            # their lease, to the next reserve.
            link.silence()
            lost = await fails(q.call("reserve", wait=0, max=10, lease=LEASE))
            assert isinstance(lost, OutcomeUnknown)
            assert lost.operation == "reserve"
            link.heal()
            messages = await q.call("reserve", wait=LEASE + 3, max=10)
            assert sorted(m.id for m in messages) == ["job", "warm"]
            assert {m.attempts for m in messages} == {2}

    asyncio.run(main())


def test_a_large_put_to_a_server_that_stopped_reading_fails_in_bounded_time(
    face: str, url: str, link: Link
) -> None:
    """The write itself cannot complete: the socket's buffers fill up."""
    batch = [{"payload": "x" * 400_000, "id": f"big-{n}"} for n in range(10)]

    async def main() -> None:
        async with Face(face, url, "large") as q:
            await q.call("put", "warm", id="warm")
            link.cut()
            await fails(q.call("put_many", batch))
            link.heal()
            await q.call("put", "after", id="after")
            ids = {m.id for m in await q.call("reserve", wait=0, max=20)}
            assert {"warm", "after"} <= ids

    asyncio.run(main())


def test_a_sharded_ack_whose_reply_is_dropped_is_reported_unknown(
    face: str, url: str, link: Link
) -> None:
    """The sharded faces run on redis-py's clients (``_resend.py``): the same rule."""

    async def main() -> None:
        async with Face(face, url + "&shards=2", "sharded") as q:
            await q.call("put", "job", id="job")
            [message] = await q.call("reserve", wait=0, lease=30)
            link.silence()
            lost = await fails(q.call("ack", message))
            assert isinstance(lost, OutcomeUnknown)
            assert lost.operation == "ack"
            link.heal()
            assert await q.call("get", "job") is None  # it had run

    asyncio.run(main())
