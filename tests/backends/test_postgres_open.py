"""A first use of ``postgresql://`` whose connection fails (the server down, an unknown
role or database, ``sslmode=require`` on a server without SSL) raises one
:class:`~delayq.backends.postgres.ServerRefused` on both Python faces: a DelayqError
whose message names the cause, never the password, with psycopg's error as its cause,
within the connect timeout rather than after the pool's."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import delayq

pytest.importorskip("psycopg")

import psycopg

from backends._postgres_mistakes import NAMES, line, mistakes
from delayq import AsyncQueue, Queue
from delayq.backends.postgres import ServerRefused

#: Far above the connect timeout (5 s) and the time a refusal takes: a call that waited
#: for the pool instead would fail the test by its time.
_POOL_TIMEOUT = 20


def _check(exc: ServerRefused, url: str, reason: str) -> None:
    assert isinstance(exc, delayq.ServerRefused)  # one class to catch, whatever the backend
    assert isinstance(exc, psycopg.OperationalError)  # still an outage to a Worker
    assert str(exc) == line(url, reason)
    assert "hunter2" not in str(exc)
    assert isinstance(exc.__cause__, psycopg.OperationalError)
    assert not isinstance(exc.__cause__, ServerRefused)


@pytest.mark.parametrize("mistake", NAMES)
def test_queue_says_why_in_one_line(mistake: str, caplog: pytest.LogCaptureFixture) -> None:
    url, reason = mistakes()[mistake]
    queue = Queue(url, name="jobs", pool_timeout=_POOL_TIMEOUT)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(ServerRefused) as raised:
        queue.stats()
    elapsed = time.monotonic() - started
    queue.close()
    _check(raised.value, url, reason)
    assert elapsed < _POOL_TIMEOUT / 2, elapsed
    assert [r for r in caplog.records if r.name.startswith("psycopg")] == []


@pytest.mark.parametrize("mistake", NAMES)
def test_async_queue_says_the_same(mistake: str) -> None:
    url, reason = mistakes()[mistake]

    async def main() -> ServerRefused:
        queue = AsyncQueue(url, name="jobs", pool_timeout=_POOL_TIMEOUT)
        try:
            with pytest.raises(ServerRefused) as raised:
                await queue.put({"n": 1})
        finally:
            await queue.close()
        return raised.value

    _check(asyncio.run(main()), url, reason)
