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

import pytest

from ._faces import FACES
from ._netns import NsRedis, ServerHost
from ._scenarios import Outage, check_partition

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.mark.parametrize("face", FACES)
def test_a_consumer_cut_off_past_its_leases_loses_them_and_comes_back(
    face: str, server_host: ServerHost, ns_redis: NsRedis
) -> None:
    cut_off, other = server_host.link(), server_host.link()
    ns_redis.start(other)
    urls = (ns_redis.short_url(cut_off), ns_redis.short_url(other))
    check_partition(face, urls, cut_off, Outage())
