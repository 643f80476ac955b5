"""Fixtures of the fault tests: a host in a network namespace, its links, its Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._netns import Link, NsRedis, ServerHost, namespaces_refused, unavailable


@pytest.fixture(scope="session")
def namespaces() -> None:
    """Once a session: whether hosts can be made here (fail under CI, skip elsewhere)."""
    reason = namespaces_refused()
    if reason:
        unavailable(reason)


@pytest.fixture
def server_host(namespaces: None) -> Iterator[ServerHost]:
    """A host of the test's own; removed with its links at the end, even on failure."""
    host = ServerHost()
    try:
        yield host
    finally:
        host.close()


@pytest.fixture
def ns_redis(server_host: ServerHost, tmp_path: Path) -> Iterator[NsRedis]:
    """A ``redis-server`` in :func:`server_host`'s namespace (not started: the test
    starts it once it made its links), stopped by PID at the end."""
    server = NsRedis(server_host, tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def link(server_host: ServerHost, ns_redis: NsRedis) -> Link:
    """A link to :func:`ns_redis`, which is started."""
    link = server_host.link()
    ns_redis.start(link)
    return link
