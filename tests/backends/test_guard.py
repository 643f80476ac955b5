"""The guard redis:// and postgresql:// run each claim through (``backends/_guard.py``):
a claim whose caller is cancelled still finishes and what it took is given back, a
close (``settle``) waits for that, and a give-back that fails is said, not lost in a
task nobody awaits. The backends' own tests (test_redis.py, test_postgres.py) check
the same end to end, against their servers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from delayq.backends._guard import AsyncGuard, Guard


async def _cancelled_mid_claim(
    guard: AsyncGuard, outcome: str | Exception, give_back: Callable[[str], Awaitable[None]]
) -> None:
    """Run a claim through ``guard`` that ends with ``outcome`` (returned, or raised)
    some 20 ms after it started, and cancel its caller as soon as it started."""
    claimed = asyncio.Event()

    async def claim() -> str:
        claimed.set()
        await asyncio.sleep(0.02)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    caller = asyncio.ensure_future(guard.run(claim, give_back))
    await claimed.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller


def test_a_cancelled_caller_leaves_its_claim_to_finish_and_be_given_back() -> None:
    async def main() -> list[str]:
        guard = AsyncGuard()
        given: list[str] = []

        async def give_back(what: str) -> None:
            await asyncio.sleep(0.05)
            given.append(what)

        await _cancelled_mid_claim(guard, "x", give_back)
        assert given == []  # still on its way: the close must wait for it
        await guard.settle()
        return given

    assert asyncio.run(main()) == ["x"]


def test_a_caller_not_cancelled_gets_the_claim_and_nothing_is_given_back() -> None:
    async def main() -> tuple[str, list[str]]:
        guard = AsyncGuard()
        given: list[str] = []

        async def claim() -> str:
            return "x"

        async def give_back(what: str) -> None:
            given.append(what)

        got = await guard.run(claim, give_back)
        await guard.settle()
        return got, given

    assert asyncio.run(main()) == ("x", [])
    assert Guard().run(lambda: "x", lambda what: None) == "x"


def test_a_claim_that_fails_after_its_caller_left_gives_nothing_back_and_says_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> list[str]:
        guard = AsyncGuard()
        given: list[str] = []

        async def give_back(what: str) -> None:
            given.append(what)

        await _cancelled_mid_claim(guard, ConnectionError("gone"), give_back)
        await guard.settle()
        return given

    with caplog.at_level(logging.WARNING, logger="delayq"):
        assert asyncio.run(main()) == []
    assert not caplog.records


def test_a_give_back_that_fails_is_logged_once_and_the_close_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        guard = AsyncGuard()

        async def give_back(what: str) -> None:
            raise ConnectionError("the server went away")

        await _cancelled_mid_claim(guard, "x", give_back)
        await asyncio.wait_for(guard.settle(), 5)

    with caplog.at_level(logging.WARNING, logger="delayq"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if r.name == "delayq"]
    assert len(said) == 1
    assert "could not give back" in said[0]
    assert "the server went away" in said[0]
