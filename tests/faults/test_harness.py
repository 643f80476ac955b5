"""The harness itself: a link carries traffic, a cut drops it without a reset, a heal
brings it back, and everything is removed at the end."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._netns import Link, NsRedis, ServerHost


def _client(link: Link, timeout: float | None = 0.3, connect: float = 1) -> redis.Redis:
    """A redis-py client without its retries (which would reconnect and wait again)."""
    return redis.Redis(
        host=link.address,
        port=NsRedis.PORT,
        socket_timeout=timeout,
        socket_connect_timeout=connect,
        retry=Retry(NoBackoff(), 0),
    )


def test_a_cut_link_drops_silently_and_a_heal_restores_it(
    server_host: ServerHost, ns_redis: NsRedis
) -> None:
    a, b = server_host.link(), server_host.link()
    ns_redis.start(a)
    client_a, client_b = _client(a), _client(b)
    try:
        assert client_a.ping()
        assert client_b.ping()
        a.cut()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):  # no reset: the read times out
            client_a.ping()
        assert time.monotonic() - started >= 0.3
        assert client_b.ping()  # the other link still works
        a.heal()
        assert client_a.ping()
    finally:
        client_a.close()
        client_b.close()


def test_a_lossy_link_drops_only_its_share_and_a_heal_ends_the_loss(
    server_host: ServerHost, ns_redis: NsRedis
) -> None:
    a, b = server_host.link(), server_host.link()
    ns_redis.start(a)
    a.lose(every=4)
    # The opening SYN is dropped too: its retransmission comes a second later.
    client_a, client_b = _client(a, None, connect=10), _client(b)
    try:
        for _ in range(20):  # TCP retransmits what the link drops: every ping answers
            assert client_a.ping()
        dropped = a.lost()
        assert dropped >= 2
        assert b.lost() == 0
        assert client_b.ping()  # the other link loses nothing
        a.heal()
        assert a.lost() == 0
        for _ in range(20):
            assert client_a.ping()
    finally:
        client_a.close()
        client_b.close()


def test_a_silenced_link_still_delivers_what_clients_send(
    server_host: ServerHost, ns_redis: NsRedis
) -> None:
    a, b = server_host.link(), server_host.link()
    ns_redis.start(a)
    client_a, client_b = _client(a), _client(b, None)
    try:
        client_a.ping()
        a.silence()
        with pytest.raises(redis.TimeoutError):
            client_a.set("delayq-test-harness", "ran")
        assert client_b.get("delayq-test-harness") == b"ran"
    finally:
        client_a.close()
        client_b.close()


@pytest.mark.usefixtures("namespaces")
def test_a_host_leaves_nothing_behind() -> None:
    with ServerHost() as host:
        link = host.link()
        link.cut()
        with socket.socket() as sock:  # the address is routable while the host lives
            sock.settimeout(0.2)
            with pytest.raises(TimeoutError):
                sock.connect((link.address, 1))
    assert (
        host.name
        not in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert (
        link.outer
        not in subprocess.run(
            ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
        ).stdout
    )
