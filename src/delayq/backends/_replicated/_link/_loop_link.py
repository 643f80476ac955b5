"""The link on the caller's event loop (the asyncio face): each concern's module adds
its part; the close, where they meet, is here."""

from __future__ import annotations

import asyncio
import contextlib

from ...._timeout import within
from ....errors import QueueClosed
from ._ahead import Ahead
from ._calls import Calls
from ._election import Election
from ._fast_put import FastPuts
from ._outbox import Outbox

__all__ = ["CLOSE_WAIT", "LoopLink"]

#: Seconds a close waits for the connections given up before it.
CLOSE_WAIT = 3.0


class LoopLink(Election, Calls, Ahead, Outbox, FastPuts):
    """Requests and replies over one transport, on the loop of its first call."""

    async def close(self, *, settle: bool = True) -> None:
        """Fail every call in flight with QueueClosed and close the connection (a
        scheduler so hands over to the next candidate). ``settle``: first let this
        link's fast puts be folded (False: its caller did)."""
        if self._closed:
            return
        if self._ahead or self._giving:
            await self._give_back_all()
        if settle and (self._intake or self._core.unfolded):
            await self._settle()
        self._closed = True
        if self._closed_signal is not None and not self._closed_signal.done():
            self._closed_signal.set_result(None)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(QueueClosed("the queue was closed"))
        if self._scheduler is not None:
            # Its publishes to a user's exchange end and are logged first, so that its
            # successor takes over at once, not once their leases ran out.
            await self._scheduler.step_down(self.close_settle)
        if self._scheduler is not None:
            scheduler, self._scheduler = self._scheduler, None
            scheduler.stop()
        self._drop_standby()
        opening = self._opening
        if opening is not None and not opening.done():
            # A connection being opened (and a campaign) is given up, its calls fail.
            opening.cancel()
            await asyncio.wait([opening])
        transport, self._transport = self._transport, None
        if transport is not None:
            with contextlib.suppress(Exception):
                await transport.close()
        if self._closing:
            # A connection given up a moment ago is let finish its close (bounded:
            # aiormq gives a dead one 2 s), so nothing of it is left pending.
            await asyncio.wait(set(self._closing), timeout=CLOSE_WAIT)
        for task in [*self._tasks, *self._closing]:
            task.cancel()

    def close_idle(self) -> None:
        """Close a link that never ran (no loop: nothing of it to end)."""
        self._closed = True

    async def _give_back_all(self) -> None:
        """Before a close: give back what was claimed for this link's callers and will
        not be taken (a reserve sent ahead, a late answer, a hold given up), for up to
        CLOSE_SETTLE s (as the settle of its puts: a close waits no longer for a
        scheduler that is gone), rather than leave it to wait out its lease. A reserve
        still unanswered is forgotten, which needs no reply: a round trip behind it
        makes sure the scheduler took it before this link goes (and with it perhaps
        the scheduler itself, which would drop what it had not taken yet)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.close_settle
        with contextlib.suppress(Exception):
            await within(self._drop_ahead(), until - loop.time())
            await within(self._call("sync", [], 0.0), until - loop.time())
        while self._giving and loop.time() < until:
            # The late answers the round trip let in give back what they claimed.
            await asyncio.wait(set(self._giving), timeout=until - loop.time())
