"""A first use of ``redis://`` (one node, sharded, ``rediss://``, ``redis+cluster://``)
whose server cannot be used (down, no TLS, not a cluster, a password missing or wrong)
raises one :class:`~delayq.backends.redis.ServerRefused` on both Python faces: a
DelayqError whose message names the cause, never the password, with redis-py's error
as its cause, well within the connect timeout (a ``rediss://`` URL to a server without
TLS timed out after it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

import delayq

pytest.importorskip("redis")

import redis

from backends._redis_mistakes import NAMES, PASSWORD, line, mistakes, server
from delayq import AsyncQueue, DelayqError, Queue
from delayq.backends.redis import ServerRefused

#: The connect timeout is 5 s: a refusal takes a fraction of it, however loaded the
#: machine; a call that waited for the timeout fails the test by its time.
_BOUND = 2.5


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    with server(tmp_path_factory.mktemp("redis-password")) as ports:
        yield mistakes(ports)


def _check(exc: ServerRefused, url: str, reason: str) -> None:
    assert isinstance(exc, delayq.ServerRefused)  # one class to catch, whatever the backend
    assert isinstance(exc, redis.ConnectionError)  # still an outage to a Worker
    assert str(exc) == line(url, reason)
    assert "hunter2" not in str(exc)
    assert isinstance(exc.__cause__, redis.RedisError | redis.exceptions.RedisClusterException)
    assert not isinstance(exc.__cause__, DelayqError)


@pytest.mark.parametrize("mistake", NAMES)
def test_queue_says_why_in_one_line(mistake: str, cases: dict[str, tuple[str, str]]) -> None:
    url, reason = cases[mistake]
    started = time.monotonic()
    with Queue(url, name="jobs") as queue, pytest.raises(ServerRefused) as raised:
        queue.stats()
    elapsed = time.monotonic() - started
    _check(raised.value, url, reason)
    assert elapsed < _BOUND, elapsed


@pytest.mark.parametrize("mistake", NAMES)
def test_async_queue_says_the_same(mistake: str, cases: dict[str, tuple[str, str]]) -> None:
    url, reason = cases[mistake]

    async def main() -> tuple[ServerRefused, float]:
        started = time.monotonic()
        async with AsyncQueue(url, name="jobs") as queue:
            with pytest.raises(ServerRefused) as raised:
                await queue.put({"n": 1})
        return raised.value, time.monotonic() - started

    exc, elapsed = asyncio.run(main())
    _check(exc, url, reason)
    assert elapsed < _BOUND, elapsed


@pytest.mark.parametrize("mistake", ["no-password", "no-password-cluster"])
def test_the_password_servers_take_their_password(
    mistake: str, cases: dict[str, tuple[str, str]]
) -> None:
    """The private servers of the password mistakes serve a URL with their password (so
    those fail for the password alone): a cluster URL's password reaches every node."""
    url = cases[mistake][0].replace("://", f"://:{PASSWORD}@")

    async def main() -> int:
        async with AsyncQueue(url, name="jobs") as queue:
            return (await queue.stats()).ready

    with Queue(url, name="jobs") as queue:
        queue.put({"n": 1})
        assert queue.stats().ready == 1
        assert asyncio.run(main()) == 1
        queue.purge()
