"""Scenarios 1-3 on PostgreSQL, on both faces, with the history checker: one private
server (tests/backends/_postgres_server.py) in a namespace of the module's own, each
test on links of its own.

* **A silent server** (scenario 2): its packets dropped, no reset. A call written on
  an open connection fails once its request is not acknowledged within libpq's
  ``tcp_user_timeout``; a call that needs a new connection, once the pool found none
  within ``pool_timeout`` (each connect gives up after ``connect_timeout``). A change
  written before the silence raises :class:`~delayq.errors.OutcomeUnknown` and is not
  sent again; a waiting consumer rides the outage out and resumes after the heal. The
  URLs' timeouts are short here (:data:`NsPostgres.SHORT`); the defaults (10 s, 10 s,
  5 s) are in docs/durability.md.
* **A partition of a consumer holding leases** past the lease (scenario 1): the other
  consumer gets the messages after the lease; after the heal the cut-off consumer's
  acks raise ``LeaseLost`` and change nothing, and its next reserve works.
* **A slow link and a lossy one** (scenario 3): nothing lost or early; a message comes
  out later by about a round trip of the link.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backends._postgres_server import PostgresUnavailable

from ._faces import FACES, PG_BOUND, PG_OUTAGE
from ._netns import Link, NsPostgres, ServerHost, unavailable
from ._scenarios import (
    Outage,
    check_lossy_link,
    check_partition,
    check_silent_then_heal,
    check_slow_link,
    replies_dropped,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

#: A call to the silent server fails within PG_BOUND; a waiting consumer is left
#: waiting for as long.
OUTAGE = Outage(errors=PG_OUTAGE, bound=PG_BOUND, waiting=PG_BOUND)


@pytest.fixture(scope="module")
def ns_postgres(namespaces: None) -> Iterator[NsPostgres]:
    """The module's server, in a host of its own."""
    with ServerHost() as host:
        try:
            server = NsPostgres(host)
        except PostgresUnavailable as exc:
            unavailable(str(exc), "the PostgreSQL binaries")
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def links(ns_postgres: NsPostgres) -> Iterator[list[Link]]:
    """Two links of the test's own to the module's server (removed at the end)."""
    host = ns_postgres.host
    made = [host.link(), host.link()]
    try:
        yield made
    finally:
        for link in made:
            link.remove()
            host.links.remove(link)


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> str:
    """Each test runs on both faces."""
    return str(request.param)


def test_calls_to_a_silent_server_fail_in_bounded_time_and_a_waiting_consumer_resumes(
    face: str, ns_postgres: NsPostgres, links: list[Link]
) -> None:
    """The ack after the lost put may find another pooled connection (its fate
    unknown too) or wait for a new one, which cannot connect: both fail as fast."""
    url = ns_postgres.short_url(links[0])
    check_silent_then_heal(face, url, links[0], OUTAGE, ack_connects=False)


def test_a_put_or_claim_whose_reply_is_dropped_is_reported_unknown(
    face: str, ns_postgres: NsPostgres, links: list[Link]
) -> None:
    """A put retried with its id stores nothing twice; what a lost claim took comes
    back after the lease."""
    asyncio.run(replies_dropped(face, ns_postgres.short_url(links[0]), links[0], OUTAGE))


def test_a_consumer_cut_off_past_its_leases_loses_them_and_comes_back(
    face: str, ns_postgres: NsPostgres, links: list[Link]
) -> None:
    cut_off, other = links
    urls = (ns_postgres.short_url(cut_off), ns_postgres.short_url(other))
    check_partition(face, urls, cut_off, OUTAGE)


def test_a_slow_link_makes_messages_later_by_about_its_round_trip_and_loses_none(
    face: str, ns_postgres: NsPostgres, links: list[Link]
) -> None:
    target = (links[0].address, ns_postgres.port)
    check_slow_link(face, target, lambda address: f"postgresql://postgres@{address}/postgres")


def test_a_lossy_link_loses_no_message_and_delivers_none_early(
    face: str, ns_postgres: NsPostgres, links: list[Link]
) -> None:
    check_lossy_link(face, ns_postgres.url(links[0]), links[0])
