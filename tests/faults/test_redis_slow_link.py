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

import pytest

from ._faces import FACES
from ._netns import Link, NsRedis
from ._scenarios import check_lossy_link, check_slow_link

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.mark.parametrize("face", FACES)
def test_a_slow_link_makes_messages_later_by_about_its_round_trip_and_loses_none(
    face: str, ns_redis: NsRedis, link: Link
) -> None:
    target = (link.address, ns_redis.PORT)
    check_slow_link(face, target, lambda address: f"redis://{address}/0")


@pytest.mark.parametrize("face", FACES)
def test_a_lossy_link_loses_no_message_and_delivers_none_early(
    face: str, ns_redis: NsRedis, link: Link
) -> None:
    check_lossy_link(face, ns_redis.url(link), link)
