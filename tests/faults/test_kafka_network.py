"""``kafka://`` under network faults, on both faces: a private Tansu broker (memory
storage) in a host's namespace, reached by the test's own threads through one link and,
by the threads that entered a client host's namespace, through another that the test
silences or cuts (conftest.py, ``kafka_net``: a broker advertises one address to all its
clients, so the client host has its own route to it).

* A link that hangs (the broker's packets dropped, no reset): each call of a client
  behind it fails within a bound, a change sent before the hang as an
  :class:`~delayq.errors.OutcomeUnknown` (it may have run; it ran at most once), a read
  as an outage; the client resumes once the link heals.
* A consumer partitioned past its leases, the consumer being a client or the elected
  scheduler: another consumer gets the messages after their lease (from the next
  scheduler, once the group's coordinator has dropped the cut-off one); on heal, the
  cut-off consumer's acks raise ``LeaseLost`` and change nothing, and its next reserve
  works.

Nothing acknowledged is lost, nothing is delivered twice within a lease (the history
of every call, _history.py). The URLs' request timeout is short here (4 s) to keep
the tests short; the default is 10 s. On Tansu a failover after a scheduler's member
stops heartbeating takes some 15 s (docs/kafka.md).
"""

from __future__ import annotations

import asyncio
import secrets

import pytest

from delayq.errors import OutcomeUnknown

from ._faces import FACES, Face, answers_again, drain
from ._faces import reserve as _reserve
from ._faces import settle as _settle
from ._history import History, check
from ._scenarios import Outage, check_partition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

pytest.importorskip("aiokafka")
from delayq.backends.kafka import OUTAGE_ERRORS  # noqa: E402 (needs aiokafka)

from .conftest import KafkaNet  # noqa: E402

REQUEST_TIMEOUT = 4.0
#: The longest a call through a hung link may take: the request timeout, plus slack
#: for a loaded machine (a request's produce waited for the partition's leader and
#: then for its answer, each a request timeout, before the transport bounded it).
BOUND = REQUEST_TIMEOUT + 2.5
LEASE = 1.5
#: The request timeout of a process on the link that stays up, riding out a first
#: election (3 to 5 s on Tansu) or a failover (some 9 s at SESSION_TIMEOUT).
ELECTION = 40.0
#: Every candidate's ``session_timeout`` (s): the least a Kafka broker takes by
#: default. A failover waits out the dead scheduler's session: on Tansu 9 s (15 s at
#: the default 10 s).
SESSION_TIMEOUT = 6
#: How a call through a hung link fails on kafka://.
KAFKA = Outage(errors=OUTAGE_ERRORS, bound=BOUND)
outage = KAFKA.fails


def _url(
    net: KafkaNet, prefix: str, scheduler: str, request_timeout: float = REQUEST_TIMEOUT
) -> str:
    return (
        f"kafka://{net.broker.bootstrap}?prefix={prefix}&scheduler={scheduler}"
        f"&idempotence=off&fetch_wait_ms=5&request_timeout={request_timeout:g}"
        f"&session_timeout={SESSION_TIMEOUT}"
    )


def _fresh() -> str:
    return f"delayq-test-{secrets.token_hex(4)}"


async def _answers_again(q: Face) -> None:
    await answers_again(q, OUTAGE_ERRORS, 30.0)


@pytest.mark.parametrize("face", FACES)
def test_calls_through_a_hung_link_fail_in_bounded_time_and_the_client_resumes(
    face: str, kafka_links: KafkaNet
) -> None:
    net = kafka_links
    prefix = _fresh()
    history = History(unknown=[OutcomeUnknown])

    async def main() -> None:
        async with (
            Face(face, _url(net, prefix, "on", ELECTION), "hung") as scheduler,
            Face(face, _url(net, prefix, "off"), "hung") as checker,
            Face(face, _url(net, prefix, "off"), "hung", net.clients) as q,
            Face(face, _url(net, prefix, "off"), "hung", net.clients) as acker,
        ):
            await scheduler.call("stats")  # elected, on the link that stays up
            for id in ("a", "b", "c"):
                with history.call("put", id):
                    await q.call("put", id, id=id, on_conflict="replace")
            [held] = await _reserve(q, history, wait=0, lease=LEASE)
            assert held.id == "a"
            await acker.call("stats")
            await checker.call("stats")
            # The broker still gets what the clients send, its answers are dropped.
            net.cut_off.silence()
            put = history.call("put", "d")
            acked = history.call("ack", held.id, token=held.lease)
            with put as put_op, acked as ack_op:
                lost = await asyncio.gather(
                    outage(q.call("put", "d", id="d", on_conflict="replace"), put_op),
                    outage(acker.call("ack", held), ack_op),
                )
            assert all(isinstance(exc, OutcomeUnknown) for exc in lost), lost
            # A read changes nothing: it fails as an outage, not as an unknown outcome.
            assert not isinstance(await outage(q.call("stats")), OutcomeUnknown)
            net.cut_off.heal()
            await _answers_again(q)
            # Every change ran once (the scheduler got them through the broker).
            assert await checker.call("get", "a") is None  # acked
            assert await checker.call("get", "d") is not None
            while messages := await _reserve(q, history, wait=LEASE + 1, max=10, lease=30):
                for message in messages:
                    await _settle(q, history, "ack", message)

    asyncio.run(main())
    report = check(history)
    report.assert_ok()
    assert report.messages == 4  # a, b, c, d


@pytest.mark.parametrize(
    ("face", "victim"),
    # One face each: a failover takes some 15 s on Tansu, and the scheduler and the
    # transport are the same code under both faces.
    [("sync", "client"), ("async", "scheduler")],
)
def test_a_consumer_partitioned_past_its_leases_loses_them_and_comes_back(
    face: str, victim: str, kafka_links: KafkaNet
) -> None:
    """When the partitioned consumer is the elected scheduler, the other candidate takes
    over once the group's coordinator has dropped the cut-off member (its heartbeats
    stop: a session timeout), and replays the leases."""
    net = kafka_links
    prefix = _fresh()
    urls = (_url(net, prefix, "on"), _url(net, prefix, "on", ELECTION))

    async def elect(first: Face, second: Face) -> None:
        """The first of them to call is elected (a first election takes longer than the
        short request timeout on Tansu: its first calls are tried again)."""
        for q in (first, second) if victim == "scheduler" else (second, first):
            await _answers_again(q)

    check_partition(face, urls, net.cut_off, KAFKA, ready=elect, netns=net.clients)


def test_a_hung_scheduler_fails_its_calls_in_bounded_time_and_is_replaced(
    kafka_links: KafkaNet,
) -> None:
    """The elected scheduler's link hangs (the broker's packets dropped: what it sends
    still arrives): its own calls raise OutcomeUnknown within its request timeout; its
    appends go unanswered, so it steps down, and the other candidate takes over: a
    client on the link that stays up goes on (nothing lost, nothing early); the hung
    process comes back once its link heals."""
    net = kafka_links
    prefix = _fresh()
    history = History(unknown=[OutcomeUnknown])

    async def main() -> None:
        async with (
            Face("sync", _url(net, prefix, "on"), "hung", net.clients) as first,
            Face("sync", _url(net, prefix, "on", ELECTION), "hung") as second,
            Face("sync", _url(net, prefix, "off", ELECTION), "hung") as client,
        ):
            for q in (first, second, client):
                await _answers_again(q)  # the first is elected
            for id in ("a", "b"):
                with history.call("put", id, delay=0.5):
                    await client.call("put", id, id=id, delay=0.5, on_conflict="replace")
            [held] = await _reserve(first, history, lease=LEASE, wait=5)
            net.cut_off.silence()
            # One after the other: the sync face's calls of one thread are.
            with history.call("put", "s") as put_op:
                lost = [await outage(first.call("put", "s", id="s", on_conflict="replace"), put_op)]
            with history.call("ack", held.id, token=held.lease) as ack_op:
                lost.append(await outage(first.call("ack", held), ack_op))
            assert all(isinstance(exc, OutcomeUnknown) for exc in lost), lost
            # The other candidate takes over: the client's put goes through.
            with history.call("put", "c"):
                await client.call("put", "c", id="c", on_conflict="replace")
            net.cut_off.heal()
            await _answers_again(first)  # back
            await drain(client, history, LEASE)

    asyncio.run(main())
    report = check(history)
    report.assert_ok()
    assert report.messages >= 3  # a, b, c (and s, of unknown fate, if it ran)
