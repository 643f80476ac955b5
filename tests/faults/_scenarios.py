"""The scenarios of issue 21 written once, run on each backend by its test module
(test_redis_*.py, test_postgres_network.py, test_amqp_network.py): each takes the
URLs and links of its backend's server and how a call to that server fails
(:class:`Outage`), runs on one face and returns the history it recorded, for the
module to check."""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from delayq.errors import LeaseLost, OutcomeUnknown

from ._delay import DelayProxy
from ._faces import BOUND, OUTAGE, Face, fails
from ._faces import reserve as _reserve
from ._faces import settle as _settle
from ._history import History, Op, check
from ._netns import Link

__all__ = [
    "LEASE",
    "Outage",
    "check_lossy_link",
    "check_partition",
    "check_silent_then_heal",
    "check_slow_link",
    "lateness",
    "partition",
    "replies_dropped",
    "silent_then_heal",
]

#: The lease of the messages a scenario holds across a fault, seconds.
LEASE = 1.5
#: The slow link: its delay each way and the jitter around it, seconds.
DELAY, JITTER = 0.020, 0.010
#: How many messages a slow or lossy link carries.
MESSAGES = 40
#: How much later than over the direct link a message may come out at most: three
#: round trips at the longest delay (one is expected).
MARGIN = 3 * 2 * (DELAY + JITTER)


@dataclass(frozen=True)
class Outage:
    """How a call to a backend's server that does not answer fails: what it raises,
    within how long (s), and how long a waiting consumer is left waiting in it."""

    errors: tuple[type[BaseException], ...] = OUTAGE
    bound: float = BOUND
    waiting: float = 2.0

    async def fails(self, call: Awaitable[Any], op: Op | None = None) -> BaseException:
        """:func:`._faces.fails` with this backend's errors and bound."""
        return await fails(call, op, errors=self.errors, bound=self.bound)


def check_silent_then_heal(
    face: str, url: str, link: Link, outage: Outage, *, ack_connects: bool
) -> None:
    """:func:`silent_then_heal`, then its history checked: nothing lost or early; the
    one duplicate is the held message, after its lease."""
    history = asyncio.run(silent_then_heal(face, url, link, outage, ack_connects=ack_connects))
    report = check(history)
    report.assert_ok()
    assert report.messages == 4  # a, b, c and the put of unknown fate
    assert report.explained == report.duplicates == 1  # the held one, after its lease


def check_partition(
    face: str,
    urls: tuple[str, str],
    cut_off: Link,
    outage: Outage,
    ready: Callable[[Face, Face], Awaitable[None]] | None = None,
    netns: str | None = None,
) -> None:
    """:func:`partition` of 5 messages, then its history checked: nothing lost or
    early; each message delivered twice, its first lease expired in between."""
    history = asyncio.run(partition(face, urls, cut_off, outage, 5, ready, netns))
    report = check(history)
    report.assert_ok()
    assert report.messages == 5 + 1
    assert report.explained == report.duplicates == 5  # each lease expired


async def silent_then_heal(
    face: str, url: str, link: Link, outage: Outage, *, ack_connects: bool
) -> History:
    """Scenario 2: puts, a reserve; the link cut: a put written on the open connection
    raises OutcomeUnknown, an ack and a reserve fail in bounded time (``ack_connects``:
    the ack needs a new connection, so it failed before sending: not unknown); a
    consumer waiting through the outage gets messages after the heal; drained."""
    history = History(unknown=[OutcomeUnknown])

    async def reserve(q: Face, **options: Any) -> list[Any]:
        return await _reserve(q, history, lease=LEASE, **options)

    async with Face(face, url, "silent") as q, Face(face, url, "silent") as waiter:
        for id in ("a", "b", "c"):
            with history.call("put", id):
                await q.call("put", id, id=id)
        [held] = await reserve(q, wait=0)
        link.cut()
        # Written on the open connection, the put's reply never comes.
        with history.call("put", "d") as op:
            lost = await outage.fails(q.call("put", "d", id="d"), op)
        assert isinstance(lost, OutcomeUnknown)
        assert lost.operation == "put"
        with history.call("ack", held.id, token=held.lease) as op:
            acked = await outage.fails(q.call("ack", held), op)
        assert not (ack_connects and isinstance(acked, OutcomeUnknown))
        with history.call("reserve") as op:
            await outage.fails(q.call("reserve", wait=0), op)
        # A consumer that waits through the outage gets messages once it heals.
        waiting = asyncio.ensure_future(reserve(waiter, wait=None, max=10))
        await asyncio.sleep(outage.waiting)
        assert not waiting.done()
        link.heal()
        got = await asyncio.wait_for(waiting, 30)
        assert got
        for message in got:
            await _settle(waiter, history, "ack", message)
        # The held message comes back once its lease expires; drain the queue.
        while messages := await reserve(q, wait=LEASE + 1, max=10):
            for message in messages:
                await _settle(q, history, "ack", message)
    return history


async def replies_dropped(face: str, url: str, link: Link, outage: Outage) -> None:
    """Scenario 2 with the server's replies dropped (it still runs what it gets): a
    put raises OutcomeUnknown, and retried with its id stores nothing twice; a claim
    raises OutcomeUnknown, and what it took comes back after the lease."""
    async with Face(face, url, "unknown") as q:
        await q.call("put", "warm", id="warm")
        link.silence()
        lost = await outage.fails(q.call("put", "job", id="job"))
        assert isinstance(lost, OutcomeUnknown)
        link.heal()
        again = await q.call("put_outcome", "job", id="job")
        assert not again.created  # the first put had stored it: nothing twice
        link.silence()
        lost = await outage.fails(q.call("reserve", wait=0, max=10, lease=LEASE))
        assert isinstance(lost, OutcomeUnknown)
        assert lost.operation == "reserve"
        link.heal()
        messages = await q.call("reserve", wait=LEASE + 5, max=10)
        assert sorted(m.id for m in messages) == ["job", "warm"]
        assert {m.attempts for m in messages} == {2}
        await q.call("ack_many", messages)


async def partition(
    face: str,
    urls: tuple[str, str],
    cut_off: Link,
    outage: Outage,
    count: int,
    ready: Callable[[Face, Face], Awaitable[None]] | None = None,
    netns: str | None = None,
) -> History:
    """Scenario 1: the consumer on ``urls[0]`` (through ``cut_off``) holds ``count``
    messages and is cut off past their lease; its ack fails; the one on ``urls[1]``
    gets them after the lease; after the heal the first one's acks and nacks raise
    LeaseLost and change nothing, and its next reserve works. ``ready(first,
    second)`` runs first (amqp:// elects one of them there). ``netns``: the network
    namespace the first one's connections are opened in (kafka://'s client host)."""
    history = History(unknown=[OutcomeUnknown])
    ids = [f"job-{n}" for n in range(count)]

    async def reserve(q: Face, lease: float, **options: Any) -> list[Any]:
        return await _reserve(q, history, lease=lease, **options)

    async def settle(q: Face, kind: str, message: Any, **options: Any) -> None:
        await _settle(q, history, kind, message, **options)

    async with (
        Face(face, urls[0], "partition", netns) as first,
        Face(face, urls[1], "partition") as second,
    ):
        if ready is not None:
            await ready(first, second)
        for id in ids:
            with history.call("put", id):
                await second.call("put", id, id=id)
        # amqp://'s put() is seen by another object once its scheduler folded it, which
        # the putter's next call waits for (read-your-writes): the puts are all there.
        await second.call("stats")
        held = await reserve(first, LEASE, wait=0, max=count)
        assert sorted(m.id for m in held) == ids
        cut_off.cut()
        # The cut-off consumer finishes a job: its ack cannot reach the server.
        with history.call("ack", held[0].id, token=held[0].lease) as op:
            await outage.fails(first.call("ack", held[0]), op)
        # The other consumer gets every message once its lease has expired.
        taken: list[Any] = []
        while len(taken) < count:
            got = await reserve(second, 60, wait=LEASE + 5, max=count)
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
        assert (stats.active, stats.scheduled) == (count, 0)
        for message in taken:
            await settle(second, "ack", message)
        # Its next reserve works, without a restart.
        with history.call("put", "after"):
            await second.call("put", "after", id="after")
        [after] = await reserve(first, LEASE, wait=5)
        assert after.id == "after"
        await settle(first, "ack", after)
        assert await reserve(second, LEASE, wait=0) == []
    return history


async def lateness(face: str, url: str, name: str, history: History, count: int) -> list[float]:
    """Put ``count`` messages due within 0.5 s, consume them; how late each came out
    (s), every call recorded in ``history``."""
    rng = random.Random(21)
    late: list[float] = []
    async with Face(face, url, name) as q:
        batch = [
            {"payload": n, "id": f"{name}-{n}", "delay": rng.uniform(0.1, 0.5)}
            for n in range(count)
        ]
        with history.call("put_many") as op:
            await q.call("put_many", batch)
        for item in batch:  # the batch is one call: one put each in the history
            history.add(Op("put", op.start, op.end, op.outcome, id=item["id"], delay=item["delay"]))
        while len(late) < count:
            messages: list[Any] = await _reserve(q, history, wait=2, max=10, lease=30)
            assert messages, "nothing came out"
            arrived = history.ops[-1].end
            late += [arrived - m.due_at / 1000 for m in messages]
            with history.call("ack_many") as acked:
                assert await q.call("ack_many", messages) == []
            for m in messages:  # one ack each in the history
                history.add(Op("ack", acked.start, acked.end, id=m.id, token=m.lease))
    return late


def check_slow_link(face: str, target: tuple[str, int], url_of: Callable[[str], str]) -> None:
    """Scenario 3: the same workload to ``target`` (host, port) through a
    :class:`DelayProxy` that adds nothing and through one that adds the slow link's
    delay (``url_of(proxy address)``), side by side: nothing lost or early, and the
    median message later by less than :data:`MARGIN` through the slow one. Both go
    through a proxy process, so that a loaded machine that starves such a process
    weighs on both alike (with the direct path straight to the server, the slow one
    alone came out 240 ms later, under a load of 10 on two cores)."""
    history = History(unknown=[OutcomeUnknown])
    with DelayProxy(target, 0.0, 0.0) as plain, DelayProxy(target, DELAY, JITTER) as proxy:

        async def main() -> tuple[list[float], list[float]]:
            # Side by side, so that the machine's load weighs on both alike: one after
            # the other, a loaded moment during the second alone made it 0.3-0.75 s later.
            direct, slow = await asyncio.gather(
                lateness(face, url_of(plain.address), "direct", history, MESSAGES),
                lateness(face, url_of(proxy.address), "slow", history, MESSAGES),
            )
            return direct, slow

        direct, slow = asyncio.run(main())
    report = check(history)
    report.assert_ok()
    assert report.messages == 2 * MESSAGES
    extra = statistics.median(slow) - statistics.median(direct)
    assert extra < MARGIN, f"{extra * 1000:.0f} ms later through the slow link"


def check_lossy_link(face: str, url: str, link: Link) -> None:
    """Scenario 3 with 1 % loss on ``link``: nothing lost, nothing early."""
    history = History(unknown=[OutcomeUnknown])
    link.lose(every=100)
    asyncio.run(lateness(face, url, "lossy", history, MESSAGES))
    assert link.lost() >= 2, "the link dropped nothing: the test would prove nothing"
    report = check(history)
    report.assert_ok()
    assert report.messages == MESSAGES
