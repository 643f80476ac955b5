"""The link's connection and the election: one connection opened at a time (by a task
of its own), given up when a request gets no reply in time, and this process's
candidacy on it; once elected, the :class:`~.._scheduler.Scheduler` runs on the
link's loop and connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from ...._timeout import within
from ....errors import QueueClosed
from .._constants import REJOIN_FIRST_PAUSE, REJOIN_MAX_PAUSE
from .._scheduler import Scheduler
from .._transport import Refused, Transport
from ._state import LinkState

__all__ = ["Election"]


class Election(LinkState):
    """The connection, and standing for election on it."""

    async def _connected(self) -> Transport:
        if self._closed:
            raise QueueClosed("the queue is closed")
        if self._transport is not None:
            return self._transport
        # Opened by a task of its own, which a caller's cancellation does not cut short
        # (a connection half open, or a campaign half made, would hold the election).
        loop = asyncio.get_running_loop()
        if self._opening is None or self._opening.done():
            self._opening = loop.create_task(self._open())
            # Seen here too: the calls that awaited it may all have timed out.
            self._opening.add_done_callback(lambda task: task.cancelled() or task.exception())
        if self._closed_signal is None:
            self._closed_signal = loop.create_future()
        # Until it opens, or this link closes: a close fails the callers at once, not
        # once the opening it cancels has cleaned up (a connection's close may take
        # seconds on a busy broker). A caller's cancellation leaves the opening be.
        opening = self._opening
        either: set[asyncio.Future[Any]] = {opening, self._closed_signal}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not opening.done():
            raise QueueClosed("the queue was closed")
        return opening.result()

    async def _open(self) -> Transport:
        transport = self._make_transport()
        try:
            # Bounded: a host that does not answer would hold a connect for the kernel's
            # SYN retries (over two minutes), and every call behind it.
            opening = transport.open(
                self._on_reply, self._on_elected, lambda: self._on_lost(transport)
            )
            try:
                await within(opening, self._request_timeout)
            except asyncio.TimeoutError:
                raise ConnectionError(
                    f"no connection to the broker in {self._request_timeout:g} s"
                ) from None
            self._transport = transport
            self._core.declared = True
            if self._candidacy == "on":
                await self._campaign(transport)
        except BaseException as exc:
            if self._transport is transport:
                self._transport = None
            with contextlib.suppress(Exception):
                await transport.close()
            if not self._core.declared and isinstance(exc, (ConnectionError, OSError)):
                # No connection ever opened: a mistake of the URL more likely than an
                # outage, said at once rather than ridden out (each call tries again).
                raise Refused(self._core.refused(exc)) from exc
            raise
        return transport

    async def _stands(self, transport: Transport, seconds: float) -> bool:
        """Whether a process stands for election (True once a scheduler answered this
        link), asked of the broker by one task for every call that asks meanwhile;
        ConnectionError when it did not answer within ``seconds``."""
        if self._core.served:
            return True
        counting = self._counting
        if counting is None or counting[0] is not transport or counting[1].done():
            task = asyncio.get_running_loop().create_task(transport.candidates())
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
            counting = self._counting = (transport, task)
        try:
            found = await within(asyncio.shield(counting[1]), max(seconds, 0.001))
        except asyncio.TimeoutError:
            raise ConnectionError("the broker did not say who stands in time") from None
        return found > 0

    async def _connected_within(self, seconds: float) -> Transport:
        """:meth:`_connected`, or ConnectionError after ``seconds`` (the opening goes
        on, for the next call); while no connection ever opened, a Refused of a
        ServerRefused instead (as the opening itself raises)."""
        try:
            return await within(self._connected(), max(seconds, 0.001))
        except asyncio.TimeoutError:
            if not self._core.declared:  # as the opening itself would say
                late = ConnectionError(f"no connection to the broker in {seconds:.3g} s")
                raise Refused(self._core.refused(late)) from None
            raise ConnectionError("no connection to the broker in time") from None

    async def _stand(self) -> None:
        """Stand for election on the current connection (once per connection)."""
        transport = await self._connected()
        if not self._candidate:
            await asyncio.shield(self._campaign(transport))

    async def _campaign(self, transport: Transport) -> None:
        if not self._candidate:
            self._candidate = True
            self._stood = True
            try:
                await transport.campaign(lambda: self._on_token(transport))
            except BaseException:
                self._candidate = False
                raise
            if (
                self._standby_hot
                and self._scheduler is None
                and self._standby is None
                and transport is self._transport
            ):
                # A hot standby: the state folded from the log as it grows, while
                # this process waits to be elected.
                self._standby = self._new_scheduler(transport)
                self._standby.stand_by()

    def _new_scheduler(self, transport: Transport) -> Scheduler:
        def stopped() -> None:
            if scheduler.elected:
                self._on_scheduler_stopped(transport)
            elif self._standby is scheduler:
                self._standby = None  # its fold failed: an election replays cold

        scheduler = Scheduler(transport, stopped)
        return scheduler

    def _on_token(self, transport: Transport) -> None:
        if transport is not self._transport or self._scheduler is not None:
            return  # a token on a connection being dropped: it goes with it
        scheduler, self._standby = self._standby, None
        if scheduler is None:
            scheduler = self._new_scheduler(transport)
        self._scheduler = scheduler
        self._spawn(self._reign(scheduler))

    async def _reign(self, scheduler: Scheduler) -> None:
        try:
            await scheduler.run()
        except Exception:
            # It could not take over (its connection went): stopping gives up the
            # connection, and the next call stands again on a new one.
            scheduler.stop()

    def _on_scheduler_stopped(self, transport: Transport) -> None:
        if self._scheduler is not None:
            self._scheduler = None
        self._close_later(self._drop(transport))

    async def _drop(self, transport: Transport) -> None:
        """Give up ``transport`` (a scheduler that stopped gives up its election with
        its connection); calls in flight resend on the next one."""
        await self._close(transport)
        self._on_lost(transport)

    def _abandon(self, transport: Transport) -> None:
        """Give up a connection on which a request got no reply in time: it may be dead
        without a reset (a link that went silent: TCP then holds every later send
        behind its retransmissions, and the heartbeats notice only after 3 x (heartbeat
        + 1) s), so the next call opens a new one. A scheduler so stops being one, as
        its clients are not being answered either.

        Kept while this link stands and no scheduler ever answered it: the likelier
        cause is that none is elected yet, and this candidacy may be the one being
        elected (on Kafka a group's join takes seconds: a request timeout shorter than
        an election gave the candidacy up at each call, and it never was elected). A
        connection that is dead all the same is found by the broker client itself
        (heartbeats, timeouts), as for any candidate that does not call."""
        if self._candidate and self._scheduler is None and not self._core.served:
            return
        if transport is self._transport:
            self._on_lost(transport)
            self._close_later(self._close(transport))

    def _close_later(self, closing: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(closing)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(transport: Transport) -> None:
        with contextlib.suppress(Exception):
            await transport.close()

    def _on_lost(self, transport: Transport) -> None:
        if transport is not self._transport:
            return  # an earlier connection, already given up
        stood = self._candidate
        self._transport = None
        self._candidate = False
        if self._scheduler is not None:
            scheduler, self._scheduler = self._scheduler, None
            scheduler.stop()
        self._drop_standby()
        self._next_turn()
        if stood and not self._closed:
            self._spawn(self._rejoin())

    async def _rejoin(self) -> None:
        """A candidate that lost its connection stands again on a new one, whether or
        not its owner calls meanwhile (a process that only waits to be elected too)."""
        pause = REJOIN_FIRST_PAUSE
        while not self._closed and not self._candidate:
            try:
                await self._stand()
            except QueueClosed:
                return  # closed while it stood again: nothing is left to stand for
            except (ConnectionError, OSError, Refused):
                await asyncio.sleep(pause)
                pause = min(pause * 2, REJOIN_MAX_PAUSE)

    def _drop_standby(self) -> None:
        if self._standby is not None:
            standby, self._standby = self._standby, None
            standby.stop()

    def _on_elected(self) -> None:
        self._core.served = True
        self._core.elected()
        self._next_turn()

    def _next_turn(self) -> None:
        """Wake every call in flight: resend (to a new scheduler, or on a new
        connection)."""
        turn, self._turn = self._turn, None
        if turn is not None and not turn.done():
            turn.set_result(None)
