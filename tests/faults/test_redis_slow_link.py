"""Scenario 3 on Redis: a link of 20 ms +- 10 ms each way, then 1 % packet loss, on both
faces.

The slow link is a user-space proxy (``_delay.py``: this kernel has no ``netem``) in
front of the Redis of a namespace; the same workload runs once straight over the veth
link and once through the proxy, in the same test. Nothing is lost or early, and a
message comes out later by about a round trip of the link (the consumer sleeps until
the due time the server reported, then claims): never by more than a few round trips.

The loss is real: the link drops one packet in a hundred each way (``Link.lose``),
the first ones included, so TCP retransmits a connection's opening and some requests
and replies; what a dropped packet costs is a retransmission timeout (200 ms or more),
and the history must still show every message once and none early.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any

import pytest

from delayq.errors import OutcomeUnknown

from ._delay import DelayProxy
from ._faces import FACES, Face
from ._faces import reserve as _reserve
from ._history import History, Op, check
from ._netns import Link, NsRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

DELAY, JITTER = 0.020, 0.010
MESSAGES = 40
#: How much later than over the direct link a message may come out at most: three
#: round trips at the longest delay (one is expected).
MARGIN = 3 * 2 * (DELAY + JITTER)


async def _lateness(face: str, url: str, name: str, history: History) -> list[float]:
    """Put messages due within 0.5 s, consume them; how late each came out (s)."""
    rng = random.Random(21)
    q = Face(face, url, name)
    late: list[float] = []
    try:
        batch = [
            {"payload": n, "id": f"{name}-{n}", "delay": rng.uniform(0.1, 0.5)}
            for n in range(MESSAGES)
        ]
        with history.call("put_many") as op:
            await q.call("put_many", batch)
        for item in batch:  # the batch is one call: one put each in the history
            history.add(Op("put", op.start, op.end, op.outcome, id=item["id"], delay=item["delay"]))
        while len(late) < MESSAGES:
            messages: list[Any] = await _reserve(q, history, wait=2, max=10, lease=30)
            assert messages, "nothing came out"
            arrived = history.ops[-1].end
            late += [arrived - m.due_at / 1000 for m in messages]
            with history.call("ack_many") as acked:
                assert await q.call("ack_many", messages) == []
            for m in messages:  # one ack each in the history
                history.add(Op("ack", acked.start, acked.end, id=m.id, token=m.lease))
    finally:
        await q.close()
    return late


@pytest.mark.parametrize("face", FACES)
def test_a_slow_link_makes_messages_later_by_about_its_round_trip_and_loses_none(
    face: str, ns_redis: NsRedis, link: Link
) -> None:
    history = History(unknown=[OutcomeUnknown])
    with DelayProxy((link.address, ns_redis.PORT), DELAY, JITTER) as proxy:
        slow_url = f"redis://{proxy.address}/0"

        async def main() -> tuple[list[float], list[float]]:
            direct = await _lateness(face, ns_redis.url(link), "direct", history)
            slow = await _lateness(face, slow_url, "slow", history)
            return direct, slow

        direct, slow = asyncio.run(main())
    report = check(history)
    report.assert_ok()
    assert report.messages == 2 * MESSAGES
    extra = statistics.median(slow) - statistics.median(direct)
    assert extra < MARGIN, f"{extra * 1000:.0f} ms later through the slow link"


@pytest.mark.parametrize("face", FACES)
def test_a_lossy_link_loses_no_message_and_delivers_none_early(
    face: str, ns_redis: NsRedis, link: Link
) -> None:
    history = History(unknown=[OutcomeUnknown])
    link.lose(every=100)
    asyncio.run(_lateness(face, ns_redis.url(link), "lossy", history))
    assert link.lost() >= 2, "the link dropped nothing: the test would prove nothing"
    report = check(history)
    report.assert_ok()
    assert report.messages == MESSAGES
