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

import pytest

from delayq.errors import OutcomeUnknown

from ._faces import FACES, Face, fails
from ._netns import READ_TIMEOUT, Link, NsRedis
from ._scenarios import Outage, check_silent_then_heal, replies_dropped

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


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
    """The ack after the lost put must connect, and cannot: it fails unsent."""
    outage = Outage(waiting=2 * READ_TIMEOUT)
    check_silent_then_heal(face, url, link, outage, ack_connects=True)


def test_a_put_or_claim_whose_reply_is_dropped_is_reported_unknown(
    face: str, url: str, link: Link
) -> None:
    """A put retried with its id stores nothing twice; what a lost claim took comes
    back after the lease."""
    asyncio.run(replies_dropped(face, url, link, Outage()))


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
