"""Scenario 1 on Redis: a consumer cut off from Redis while it holds leases, for longer
than the lease, on both faces.

The cut-off consumer reaches Redis through a link of its own; another consumer and the
producer through another link to the same server. While it is cut off its acks fail
within the socket timeout (their fate unknown); the other consumer gets its messages
once their lease expires; after the heal the cut-off consumer's acks and nacks raise
``LeaseLost`` and change nothing (the other consumer still holds the messages and acks
them), and its next reserve works without a restart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from delayq.errors import LeaseLost, OutcomeUnknown

from ._faces import FACES, Face, fails
from ._faces import reserve as _reserve
from ._faces import settle as _settle
from ._history import History, check
from ._netns import NsRedis, ServerHost

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

LEASE = 1.5
MESSAGES = 5


@pytest.mark.parametrize("face", FACES)
def test_a_consumer_cut_off_past_its_leases_loses_them_and_comes_back(
    face: str, server_host: ServerHost, ns_redis: NsRedis
) -> None:
    cut_off, other = server_host.link(), server_host.link()
    ns_redis.start(other)
    history = History(unknown=[OutcomeUnknown])
    ids = [f"job-{n}" for n in range(MESSAGES)]

    async def reserve(q: Face, lease: float, **options: Any) -> list[Any]:
        return await _reserve(q, history, lease=lease, **options)

    async def settle(q: Face, kind: str, message: Any, **options: Any) -> None:
        await _settle(q, history, kind, message, **options)

    async def main() -> None:
        first = Face(face, ns_redis.short_url(cut_off), "partition")
        second = Face(face, ns_redis.short_url(other), "partition")
        try:
            for id in ids:
                with history.call("put", id):
                    await second.call("put", id, id=id)
            held = await reserve(first, LEASE, wait=0, max=MESSAGES)
            assert sorted(m.id for m in held) == ids
            cut_off.cut()
            # The cut-off consumer finishes a job: its ack cannot reach Redis.
            with history.call("ack", held[0].id, token=held[0].lease) as op:
                await fails(first.call("ack", held[0]), op)
            # The other consumer gets every message once its lease has expired.
            taken: list[Any] = []
            while len(taken) < MESSAGES:
                got = await reserve(second, 60, wait=LEASE + 5, max=MESSAGES)
                assert got, "the other consumer got nothing after the leases expired"
                taken.extend(got)
            assert sorted(m.id for m in taken) == ids
            assert all(m.attempts == 2 for m in taken)
            cut_off.heal()
            # Back: the old leases are lost, and using them changes nothing.
            for message in held:
                with pytest.raises(LeaseLost):
                    await settle(first, "ack", message)
            with pytest.raises(LeaseLost):
                await settle(first, "nack", held[1], delay=0)
            stats = await second.call("stats")
            assert (stats.active, stats.scheduled) == (MESSAGES, 0)
            for message in taken:
                await settle(second, "ack", message)
            # Its next reserve works, without a restart.
            with history.call("put", "after"):
                await second.call("put", "after", id="after")
            [after] = await reserve(first, LEASE, wait=5)
            assert after.id == "after"
            await settle(first, "ack", after)
            assert await reserve(second, LEASE, wait=0) == []
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())
    report = check(history)
    report.assert_ok()
    assert report.messages == MESSAGES + 1
    assert report.explained == report.duplicates == MESSAGES  # each lease expired
