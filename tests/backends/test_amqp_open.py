"""A first use of ``amqp://`` whose connection fails (the broker down, a virtual host
that does not exist, a wrong password) raises one
:class:`~delayq.backends.amqp.ServerRefused` on both Python faces, at once: a
DelayqError whose message names the cause, never the password, with the broker client's
error as its cause (aiormq's on the asyncio face, the sync face's own connection's on
the sync one, whose first call goes from the caller's thread), and no log line of
aiormq's per try.

A call that needs the scheduler's answer, on a namespace where no process stands for
election, raises :class:`~delayq.errors.SchedulerNotRunning` at once, which says how to
run one, rather than after the request timeout; a put that needs no answer still
returns; once a candidate stands, calls wait for it as before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import delayq

pytest.importorskip("aiormq")
pytest.importorskip("pika")

import aiormq

from backends._amqp_mistakes import NAMES, line, mistakes, mute_candidate, not_running
from conformance.conftest import amqp_url
from delayq import AsyncQueue, NoScheduler, OutcomeUnknown, Queue, SchedulerNotRunning
from delayq.backends.amqp import ServerRefused

#: Far above what a refusal takes: a call that rode the mistake out as an outage (until
#: its request timeout) instead fails the test by its time.
_REQUEST_TIMEOUT = 20


def _check(exc: ServerRefused, url: str, reason: str, *, sync: bool = False) -> None:
    assert isinstance(exc, delayq.ServerRefused)  # one class to catch, whatever the backend
    assert isinstance(exc, ConnectionError)  # still an outage to a Worker
    assert str(exc) == line(url, reason)
    assert "hunter2" not in str(exc)
    if sync:  # the sync face's own connection's error: the socket's, or the broker's words
        assert isinstance(exc.__cause__, OSError)
        assert not isinstance(exc.__cause__, delayq.ServerRefused)
    else:
        assert isinstance(exc.__cause__, aiormq.exceptions.AMQPError)


@pytest.mark.parametrize("mistake", NAMES)
def test_queue_says_why_in_one_line(mistake: str, caplog: pytest.LogCaptureFixture) -> None:
    url, reason = mistakes()[mistake]
    with Queue(f"{url}?request_timeout={_REQUEST_TIMEOUT}", name="jobs") as queue:
        for call in (queue.stats, lambda: queue.put({"n": 1})):
            started = time.monotonic()
            with caplog.at_level(logging.WARNING), pytest.raises(ServerRefused) as raised:
                call()
            assert time.monotonic() - started < _REQUEST_TIMEOUT / 4
            _check(raised.value, f"{url}?request_timeout={_REQUEST_TIMEOUT}", reason, sync=True)
    assert [r for r in caplog.records if r.name.startswith("aiormq")] == []


@pytest.mark.parametrize("mistake", NAMES)
def test_async_queue_says_the_same(mistake: str) -> None:
    url, reason = mistakes()[mistake]

    async def main() -> ServerRefused:
        async with AsyncQueue(url, name="jobs", request_timeout=_REQUEST_TIMEOUT) as queue:
            with pytest.raises(ServerRefused) as raised:
                await queue.stats()
        return raised.value

    _check(asyncio.run(main()), url, reason)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[str]:
    """A fresh namespace's URL, as a user writes it (no scheduler option): a client that
    stands only once it waits in a reserve."""
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace).replace("&scheduler=on", "")


def test_a_call_with_no_candidate_standing_is_refused_at_once(client: str) -> None:
    default = 10.0  # the request timeout a call would otherwise wait out
    with Queue(client, name="jobs") as queue:
        queue.put("kept", id="kept")  # into the intake: it needs no answer
        for call in (queue.stats, lambda: queue.put_outcome("x"), lambda: queue.get("kept")):
            started = time.monotonic()
            with pytest.raises(SchedulerNotRunning) as raised:
                call()
            assert time.monotonic() - started < default / 5
            assert str(raised.value) == not_running(client)
            assert isinstance(raised.value, NoScheduler)  # an outage still
            assert not isinstance(raised.value, OutcomeUnknown)  # nothing was sent
        with Queue(client, name="jobs", scheduler="on") as candidate:
            candidate.stats()  # elected
            assert queue.stats().ready == 1  # the put kept in the intake is folded
            assert queue.get("kept") is not None

    async def after() -> int:
        async with AsyncQueue(client, name="jobs") as queue:
            with pytest.raises(SchedulerNotRunning, match="delayq scheduler --url"):
                await queue.stats()
            return 1

    assert asyncio.run(after()) == 1  # the candidate is gone with its queue


def test_a_call_waits_for_a_candidate_that_stands(client: str) -> None:
    """A process that stands (a scheduler starting, or one that hangs) is waited for,
    as before: the call then fails after its timeout, its fate unknown."""
    # Long enough for a loaded broker to open the first connection and say who stands
    # (the timeout covers them too: past it, ServerRefused or nothing sent).
    timeout = 3.0
    with mute_candidate(client), Queue(client, name="jobs", request_timeout=timeout) as queue:
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown) as raised:
            queue.put_outcome("maybe")
        assert time.monotonic() - started >= timeout * 0.8
        assert not isinstance(raised.value, SchedulerNotRunning)
