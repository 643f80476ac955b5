"""Fast puts (docs/rabbitmq.md, "Fast put") skip the scheduler: they are appended to the
intake, coalesced the same way as requests (those that gather while an append is on
its way leave as one message), and return on its confirm. The link numbers its intake
messages; every request it sends afterwards, until a reply proves the scheduler folded
them, starts with an ``after`` part naming the last one confirmed, which the scheduler
holds the request behind (read-your-writes). The numbers, and the grouping of the puts
waiting, are the link core's (``_core``), which a :class:`~._thread_link.ThreadLink`
appending from its callers' threads uses too."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from ...._timeout import timeout_at, within
from ....errors import QueueClosed
from .._constants import FIRE_AHEAD_MS, RESEND_FOR
from .._transport import NoScheduler, Refused, Transport
from ._core import take_group
from ._state import FastPut, LinkState

__all__ = ["FastPuts", "soon"]


def soon(requests: list[Any]) -> bool:
    """Whether a put of ``requests`` (encoded) makes a message due within
    FIRE_AHEAD_MS: one a waiting consumer may want before the intake's tail reaches it."""
    horizon: float | None = None
    for request in requests:
        delay_ms, at_ms = request[5], request[6]
        if at_ms is None:
            if (delay_ms or 0) <= FIRE_AHEAD_MS:
                return True
            continue
        if horizon is None:
            horizon = time.time() * 1000.0 + FIRE_AHEAD_MS
        if at_ms <= horizon:
            return True
    return False


class FastPuts(LinkState):
    """Appending puts to the intake, and settling them before a close."""

    async def put_fast(self, queue: str, requests: list[Any]) -> None:
        """Append a put (``requests``: encoded, ``on_conflict="ignore"`` each) to the
        intake and return once the broker confirmed it; the scheduler folds it a moment
        later, and this link's next requests wait for that at the scheduler.
        NoScheduler (an outage) when it could not be sent within the request timeout,
        ReplyLost when it was sent and not confirmed (it may be in the intake)."""
        if self._closed:
            raise QueueClosed("the queue is closed")
        try:
            await self._configure(queue)  # a request, if any: it needs a scheduler
        except Refused as exc:
            raise exc.reason from exc.reason.__cause__
        appended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        size = sum(len(request[1]) for request in requests)  # the payloads
        put = FastPut(uuid.uuid4().hex, queue, requests, size, soon(requests), appended)
        if self._appending:  # an append is on its way: this put leaves with the next
            self._intake.append(put)
        else:
            # Nothing on its way: appended by this caller's task (no task of the link
            # to start and switch to); what gathers meanwhile, by the drain task.
            self._appending = True
            try:
                await self._send_intake([put])
            except BaseException:
                # Cancelled: the put's outcome is this raise (none awaits it any more).
                if appended.done() and not appended.cancelled():
                    appended.exception()
                raise
            finally:
                if self._intake and not self._closed:
                    self._spawn(self._drain_intake())
                else:
                    self._appending = False
                    self._fail_intake()
        try:
            await appended
        except Refused as exc:
            raise exc.reason from exc.reason.__cause__

    async def _drain_intake(self) -> None:
        """Append what gathered in the intake box, one message at a time (each carries
        every put that came while the previous one was on its way, up to
        MAX_GROUP_BYTES), so that this link's intake messages are confirmed in order."""
        try:
            while self._intake:
                puts = take_group(
                    self._intake, lambda put: put.size, gone=lambda put: put.appended.done()
                )
                if puts:
                    await self._send_intake(puts)
        finally:
            self._appending = False
            self._fail_intake()

    async def _send_intake(self, puts: list[FastPut]) -> None:
        """Append ``puts`` as the link's next intake message and settle their futures
        (an error of the append: each put's; a cancellation is raised too)."""
        seq, nudge = self._core.next_intake(any(p.soon for p in puts), time.monotonic())
        parts = [[p.request_id, p.queue, p.requests] for p in puts]
        try:
            await self._append(seq, parts, nudge=nudge)
        except BaseException as exc:
            for put in puts:
                if not put.appended.done():
                    put.appended.set_exception(
                        exc if isinstance(exc, Exception) else QueueClosed("closed")
                    )
            if not isinstance(exc, Exception):
                raise
            return
        self._core.intake_confirmed(seq)
        for put in puts:
            if not put.appended.done():
                put.appended.set_result(None)

    def _fail_intake(self) -> None:
        """Fail the puts left in the intake box once nothing appends them (a close)."""
        left, self._intake = self._intake, []
        for put in left:
            if not put.appended.done():
                put.appended.set_exception(QueueClosed("the queue was closed"))

    async def _settle(self) -> None:
        """Before a close: wait, for up to CLOSE_SETTLE s, until this link's fast puts
        are appended and folded (so that what a process put before it closed is seen by
        the next one), by a request that waits behind them. With no scheduler running
        they stay in the intake, folded once one is elected."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self.close_settle
        with contextlib.suppress(Exception):
            while self._intake and loop.time() < until:
                await asyncio.sleep(0.005)
        if self._core.unfolded:
            with contextlib.suppress(Exception):
                await within(self._call("sync", [], 0.0), until - loop.time())

    async def _append(self, seq: int, parts: list[Any], *, nudge: bool) -> None:
        """Append the intake message ``seq`` of ``parts`` (puts), on a new connection
        when one goes, for up to the request timeout (the same puts: the scheduler folds
        each once). The message carries the moment it is sent (as the put's arrival is
        for a plain put): the scheduler decides its puts as of then. With ``nudge``, the
        broker hands the scheduler a copy at once too (docs/rabbitmq.md, "Fast put")."""
        loop = asyncio.get_running_loop()
        # Not appended again past RESEND_FOR either: the scheduler remembers a put's
        # request id for a bounded time only (DEDUP_WINDOW).
        deadline = loop.time() + min(self._request_timeout, RESEND_FOR)
        may_have_run = False
        while True:
            left = deadline - loop.time()
            try:
                transport = self._transport or await self._connected_within(left)
                may_have_run = True
                body = self._core.intake_body(seq, parts, time.time())
                await self._append_by(deadline, transport, body, nudge)
                return
            except (ConnectionError, OSError) as exc:
                if isinstance(exc, NoScheduler):
                    raise
                if loop.time() >= deadline:
                    raise self._no_reply("put", may_have_run, "no intake append") from exc
                if self._closed:
                    raise QueueClosed("the queue was closed") from None
                await asyncio.sleep(min(deadline - loop.time(), 0.1))

    async def _append_by(
        self, deadline: float, transport: Transport, body: bytes, nudge: bool
    ) -> None:
        """``transport.append_intake(body)``, or ReplyLost at ``deadline`` (the loop's
        time), the connection then given up (it may be dead without a reset). Bounded in
        the caller's own task (no task per put), its cancellation kept (:mod:`delayq.
        _timeout`)."""
        try:
            async with timeout_at(deadline):
                await transport.append_intake(body, nudge=nudge)
        except asyncio.TimeoutError:
            self._abandon(transport)
            raise self._no_reply("put", True, "no confirm from the intake") from None
