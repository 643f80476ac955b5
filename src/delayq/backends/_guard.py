"""A claim is never lost to a cancelled caller: the hand-written pair the faces of
``redis://`` and ``postgresql://`` (written once in their ``_async/``) run each claim
through.

The sync face cannot be cut off halfway, so :class:`Guard` runs the call and hands back
what it returned. An asyncio task can be cancelled while its claim is on the wire:
:class:`AsyncGuard` runs the claim in a task of its own, and when the awaiting task is
cancelled, lets the claim finish and gives back what it took (nobody received it, so it
is released at once rather than waiting out its lease). It keeps those claims and their
give-backs until they end, and a backend's close waits for them first
(:meth:`AsyncGuard.settle`): closed first, the give-back would fail and leave the
messages leased.

``sqlite:///`` does the same on its own (``sqlite/_runner.py``): its claims run on a
thread pool, and the give-back is submitted from the pool's thread as the claim ends,
with no event loop needed (a loop that ended without closing the queue still gives
back).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._log import LOGGER_NAME

__all__ = ["AsyncGuard", "Guard"]

T = TypeVar("T")

_log = logging.getLogger(LOGGER_NAME)


class Guard:
    """On the sync face nothing can interrupt a call half way: nothing to guard."""

    __slots__ = ()

    def __init__(self) -> None:
        """Nothing to keep."""

    def run(self, call: Callable[[], T], give_back: Callable[[T], object]) -> T:
        """``call()``."""
        return call()

    def settle(self) -> None:
        """Nothing is ever in flight here."""


class AsyncGuard:
    """Claims whose awaiting task was cancelled, kept until what they took is given
    back; a backend's close waits for them first (:meth:`settle`)."""

    __slots__ = ("_in_flight",)

    def __init__(self) -> None:
        self._in_flight: set[asyncio.Future[Any]] = set()

    async def run(
        self, call: Callable[[], Awaitable[T]], give_back: Callable[[T], Awaitable[None]]
    ) -> T:
        """``await call()`` in a task of its own: when the awaiting task is cancelled,
        the call still finishes, and what it returned is handed to ``give_back``."""
        task = asyncio.ensure_future(call())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:

            def done(finished: asyncio.Future[T]) -> None:
                if finished.cancelled() or finished.exception() is not None:
                    return  # it took nothing (its error retrieved: nobody awaits it)
                giving = asyncio.ensure_future(give_back(finished.result()))
                giving.add_done_callback(_given_back)
                self._keep(giving)

            task.add_done_callback(done)  # before the task leaves the set
            self._keep(task)
            raise

    def _keep(self, future: asyncio.Future[Any]) -> None:
        self._in_flight.add(future)
        future.add_done_callback(self._in_flight.discard)

    async def settle(self) -> None:
        """Wait for the cancelled claims still on their way, then their give-backs."""
        while self._in_flight:
            await asyncio.wait(list(self._in_flight))


def _given_back(future: asyncio.Future[Any]) -> None:
    """A give-back ended: a failed one leaves its messages leased until their lease
    runs out, which is said once."""
    if future.cancelled():
        return
    error = future.exception()
    if error is not None:
        _log.warning("delayq: could not give back a cancelled reserve's claim: %r", error)
