"""A call: a request to the elected scheduler and the wait for its reply, with the
resends that make a failover invisible to the caller. A request keeps its id across
resends: the scheduler answers a resent write from its log instead of applying it
twice, for as long as it remembers the id (DEDUP_WINDOW): so a write is not sent again
once RESEND_FOR s (or the request timeout, if shorter) have passed since its first
send, a waiting reserve's wait added, and each send expires after as long. The
replies (and the scheduler's announcements) come back here."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from ....errors import QueueClosed, SchedulerNotRunning
from .._codec import pack, raise_error, unpack
from .._constants import FOLDING, RESEND_FOR
from .._transport import NoScheduler, Refused
from ._core import READS, unclaim
from ._state import NO_REPLY_HINT, LinkState

__all__ = ["Calls"]


class Calls(LinkState):
    """Requests, their replies, and the resends between."""

    def _on_reply(self, request_id: str, kind: str, body: bytes) -> None:
        if kind == "batch":  # the replies to several requests of this link, in order
            for part_id, part_kind, part_body in unpack(body):
                self._on_reply(part_id, part_kind, part_body)
            return
        if kind == FOLDING and not request_id:
            self._core.told_folding(body, time.monotonic(), self._pending)
            return
        if self._core.announced(request_id, kind, time.monotonic()):
            return
        future = self._pending.get(request_id)
        if future is None:
            releases = self._core.give_back(request_id, kind, body)
        else:
            self._core.served = True
            self._core.replied(request_id)
            if not future.done():
                # When it came, by the clock a held reply is counted on (the loop's
                # own may be coarser, or cached).
                future.set_result((kind, body, time.monotonic()))
                return
            # A second answer before the call took the first (a resend served again).
            failed = future.cancelled() or future.exception() is not None
            first = None if failed else future.result()[:2]
            releases = self._core.answered_again(request_id, first, kind, body)
        for release in releases:
            self._spawn_giving(self._quiet("release", release))

    async def _forget(self, queue: str, request_id: str) -> None:
        transport = self._transport
        if transport is not None:
            body = pack([queue, request_id])
            # Through the outbox, so that it leaves after the reserve it forgets.
            await self._request(transport, "forget", uuid.uuid4().hex, body, None)

    async def _quiet(self, op: str, args: list[Any]) -> None:
        with contextlib.suppress(Exception):
            await self._call(op, args, 0.0)  # the link's own: not its caller's next call

    async def call(self, op: str, args: list[Any], wait: float | None = 0.0) -> Any:
        """Send ``op`` with ``args`` (the queue first) and return its decoded outcome;
        a ``reserve`` waits up to ``wait`` seconds (None: no limit) at the scheduler."""
        outcome, until = await self.call_held(op, args, wait)
        if until is not None:
            await self._hold(args[0], outcome, until)
        return outcome

    async def call_held(
        self, op: str, args: list[Any], wait: float | None = 0.0
    ) -> tuple[Any, float | None]:
        """:meth:`call`, without the hold: the outcome, and for messages a reserve got
        ahead of their due time, the :func:`time.monotonic` time until which the
        caller must hold them (None: none to hold); a caller that gives up before then
        hands them to :meth:`give_back`."""
        try:
            taken = await self._take_ahead(op, args, wait) if self._ahead else None
            if taken is None:
                if args:
                    await self._configure(args[0])
                if self._core.ahead_of(op, args, bool(self._pending)):
                    self._send_ahead(args[0])
                taken = await self._call(op, args, wait)
            self._core.called(op, args, wait, taken[0], bool(self._pending))
            return taken
        except Refused as exc:
            raise exc.reason from exc.reason.__cause__

    async def _configure(self, queue: str) -> None:
        configure = self._core.to_configure(queue)
        if configure is not None:
            # This backend object delivers its queues' messages to a user's exchange:
            # say so once per queue, before its first operation.
            await self._call("configure", configure, 0.0)
            self._core.configured.add(queue)

    async def _call(self, op: str, args: list[Any], wait: float | None) -> tuple[Any, float | None]:
        loop = asyncio.get_running_loop()
        request_id = uuid.uuid4().hex
        waits = op == "reserve" and (wait is None or wait > 0)
        give_up = None if wait is None else loop.time() + wait
        future: asyncio.Future[tuple[str, bytes, float]] = loop.create_future()
        self._pending[request_id] = future
        if op == "reserve":
            self._core.reserves[request_id] = args[0]
        parked = False
        try:
            if waits and self._candidacy == "auto" and not self._candidate:
                await self._stand()
            unanswered_since = loop.time()
            # Whether some send of the request may have reached a scheduler: then a
            # change that gets no reply may have run, and its caller is told so.
            may_have_run = False
            sent_before = False
            # A change is not sent again past this (the loop's time; set at its first
            # send): the scheduler remembers its id for a bounded time only.
            resend_for = min(self._request_timeout, RESEND_FOR)
            resend_until = float("inf")
            while True:
                if self._turn is None:
                    self._turn = loop.create_future()
                turn = self._turn
                sent = [*args, None if give_up is None else max(0.0, give_up - loop.time())]
                if loop.time() >= resend_until:
                    raise self._no_reply(op, may_have_run, "no reply", resend_for)
                limit = min(unanswered_since + self._request_timeout, resend_until)
                try:
                    transport = self._transport or await self._connected_within(limit - loop.time())
                    left = limit - loop.time()
                    asks = self._core.asks_who_stands(sent_before, self._candidate)
                    if asks and not await self._stands(transport, left):
                        raise self._core.not_running()  # nothing was sent: nothing ran
                    ttl = None if waits else int(resend_for * 1000)
                    # A waiting reserve counts as parked from the moment it may be on
                    # its way: one cancelled while its publish is in flight may reach
                    # the scheduler all the same, and must be forgotten there.
                    parked = waits
                    may_have_run = may_have_run or op not in READS
                    if not sent_before and op not in READS:
                        resend_until = loop.time() + resend_for
                        if waits:  # and for its wait (none: while it waits)
                            resend_until += float("inf") if give_up is None else (wait or 0.0)
                    sent_before = True
                    await self._request(
                        transport, op, request_id, pack(sent if op == "reserve" else args), ttl
                    )
                except SchedulerNotRunning:
                    raise
                except (NoScheduler, ConnectionError, OSError) as exc:
                    left = min(unanswered_since + self._request_timeout, resend_until)
                    left -= loop.time()
                    if left <= 0:
                        raise self._no_reply(op, may_have_run, "no scheduler answered") from exc
                    # Until a new scheduler or connection, or the close of this link
                    # (which fails the future: a call must not outlive its loop).
                    waited: set[asyncio.Future[Any]] = {future, turn}
                    await asyncio.wait(waited, timeout=min(left, 0.5))
                    if future.done():
                        break
                    continue
                unanswered_since = loop.time()  # the outage budget counts from here
                timeout: float | None = self._request_timeout
                if waits:
                    # A scheduler answers a parked reserve by the end of its wait; the
                    # request timeout more covers the trips. An answer lost (a scheduler
                    # gone after parking it, and no successor that saw it) must not hold
                    # the caller for ever: past that, as for any request with no reply.
                    wait_left = None if give_up is None else give_up - loop.time()
                    timeout = None if wait_left is None else wait_left + self._request_timeout
                either: set[asyncio.Future[Any]] = {future, turn}
                waited_from = time.monotonic()
                done, _ = await asyncio.wait(
                    either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                # Held behind this link's intake messages while the scheduler's fold of
                # them advances (it said so meanwhile): a request timeout more.
                while not done and (told := self._core.folding_since(request_id, waited_from)):
                    waited_from = told
                    timeout = max(told + self._request_timeout - time.monotonic(), 0.0)
                    done, _ = await asyncio.wait(
                        either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                    )
                if future.done():
                    break
                if not done:
                    self._abandon(transport)
                    if op == "reserve":
                        # An answer still on its way (the given-up connection is closed
                        # later) gives back what it claimed; one that reaches the
                        # closed inbox is returned to the scheduler, which releases it.
                        self._core.forget(request_id, args[0])
                    what = "no reply" if self._candidate else NO_REPLY_HINT
                    raise self._no_reply(op, may_have_run, what, timeout)
                unanswered_since = loop.time()
        except asyncio.CancelledError:
            if parked:
                # Sent before the caller goes on, so that the scheduler drops the parked
                # reserve before it sees the caller's next request; one served meanwhile
                # is given back when its reply comes.
                self._core.forget(request_id, args[0])
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._forget(args[0], request_id))
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", None)  # Python 3.11+
            if self._closed and cancelling is not None and not cancelling():
                # Not the caller's cancellation: the close cut what the call awaited
                # (a connection being opened, a publish).
                raise QueueClosed("the queue was closed") from None
            raise
        except Exception:
            if self._closed:  # whatever the close broke on its way (the broker's client)
                raise QueueClosed("the queue was closed") from None
            raise
        finally:
            self._pending.pop(request_id, None)
            self._core.ended(request_id)
            if future.done() and not future.cancelled():
                future.exception()  # seen, also when the call ends another way
        kind, body, arrived = future.result()
        if kind not in {"ok", "held"}:
            raise_error(kind, unpack(body))
        if op == "put":
            self._core.put_taken()
        if kind == "ok":
            return self._core.answer(op, args, request_id, unpack(body)), None
        # Claimed ahead of their due time: held until then, by the scheduler's clock
        # (the reply says how long, counted from when it left: it came later).
        rest, items = unpack(body)
        return self._core.answer(op, args, request_id, items), arrived + rest

    async def _hold(self, queue: str, records: list[Any], until: float) -> None:
        """Wait until ``until`` (:func:`time.monotonic`) before handing ``records``
        (claimed ahead of their due time) to the caller; a caller that gives up
        meanwhile gives them back (released: no attempt charged)."""
        try:
            # Checked against the clock: a loop's timer may fire early by its grain.
            while (rest := until - time.monotonic()) > 0:
                await asyncio.sleep(rest)
        except asyncio.CancelledError:
            self.give_back(queue, records)
            raise
        if self._closed:
            raise QueueClosed("the queue was closed")

    def give_back(self, queue: str, records: list[Any]) -> None:
        """Release ``records``, got by a reserve whose caller gave up while they were
        held (each in a task of its own; a failure leaves them to their lease)."""
        for record in records:
            self._spawn_giving(self._quiet("release", unclaim(queue, record)))
