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

from ._faces import FACES, Face
from ._faces import reserve as _reserve
from ._faces import settle as _settle
from ._history import History, check
from ._scenarios import Outage

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
#: election (3 to 5 s on Tansu) or a failover (some 15 s).
ELECTION = 40.0
#: How a call through a hung link fails on kafka://.
KAFKA = Outage(errors=OUTAGE_ERRORS, bound=BOUND)
outage = KAFKA.fails


def _url(
    net: KafkaNet, prefix: str, scheduler: str, request_timeout: float = REQUEST_TIMEOUT
) -> str:
    return (
        f"kafka://{net.broker.bootstrap}?prefix={prefix}&scheduler={scheduler}"
        f"&idempotence=off&fetch_wait_ms=5&request_timeout={request_timeout:g}"
    )


def _fresh() -> str:
    return f"delayq-test-{secrets.token_hex(4)}"


async def _answers_again(q: Face, within: float = 30.0) -> None:
    """``q.stats()`` until it answers; an outage meanwhile is retried until ``within``
    seconds have passed."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            await q.call("stats")
            return
        except OUTAGE_ERRORS:
            if asyncio.get_running_loop().time() > deadline:
                raise


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
