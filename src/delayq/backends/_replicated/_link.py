"""The client side: a request to the elected scheduler and the wait for its reply, with
the resends that make a failover invisible to the caller. :class:`LoopLink` runs on
the caller's event loop (the asyncio face); :class:`ThreadLink` drives one on a
private loop thread (the sync face). Both have the same methods, so the two faces of
the backend read the same (the sync one is generated).

A request keeps its id across resends: the scheduler answers a resent write from its
log instead of applying it twice. Requests of concurrent callers are coalesced: those
made in the same turn of the loop, or while a publish is on its way, leave together
from an outbox as one ``batch`` message, whose parts the scheduler takes one by one
(each keeps its id, and gets its own outcome); their replies come back the same way.
A process that is a candidate runs its :class:`~._scheduler.Scheduler` on the same loop
and connection once elected.

Fast puts (:meth:`LoopLink.put_fast`, docs/rabbitmq.md "Fast put") skip the scheduler:
they are appended to the intake, coalesced the same way (those that gather while an
append is on its way leave as one message), and return on its confirm. The link numbers
its intake messages; every request it sends afterwards, until a reply proves the
scheduler folded them, starts with an ``after`` part naming the last one confirmed,
which the scheduler holds the request behind (read-your-writes).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Literal, NamedTuple, TypeVar

from ..._fork import generation
from ..._redact import redact_url
from ...durable.message import Now
from ...errors import QueueClosed, SchedulerNotRunning
from ._codec import decode_outcome, decode_record, pack, raise_error, reserve_items, unpack
from ._constants import (
    CLOSE_SETTLE,
    FIRE_AHEAD_MS,
    MAX_GROUP_BYTES,
    QUIET_HOLD,
    REJOIN_FIRST_PAUSE,
    REJOIN_MAX_PAUSE,
)
from ._scheduler import Scheduler
from ._transport import (
    BlockingIntake,
    NoScheduler,
    Refused,
    ReplyLost,
    ServerRefused,
    Transport,
)

__all__ = ["Candidacy", "LoopLink", "ThreadLink"]

T = TypeVar("T")
#: Who stands for election: ``on`` at once, ``auto`` once this backend object runs a
#: waiting reserve (a consumer, never a pure producer), ``off`` never.
Candidacy = Literal["auto", "on", "off"]
#: Seconds a close waits for the connections given up before it.
_CLOSE_WAIT = 3.0
#: Seconds a reserve sent ahead keeps what it claimed for its caller's next reserve
#: (given back after: the caller is doing something else).
_AHEAD_KEPT = 0.05
#: How many answered (and abandoned) reserves a link remembers, for a late answer.
_REMEMBERED = 1024
#: The operations that change nothing: one that got no reply just failed (NoScheduler);
#: any other may have run (ReplyLost, an OutcomeUnknown).
_READS = frozenset({"get", "stats", "peek", "dead", "queues", "due_counts", "sync"})


#: What a call that got no reply says when its process does not stand for election: the
#: likeliest cause is that nothing does (a producer's first hour).
_NO_REPLY_HINT = (
    "no reply from a scheduler (none may run for this namespace: `delayq scheduler`, "
    "`delayq worker` or a queue opened with scheduler=on runs one)"
)


class _FastPut(NamedTuple):
    """A fast put waiting for the link's intake append."""

    request_id: str
    queue: str
    requests: list[Any]  # encoded PutRequests
    size: int  # their payloads' bytes
    soon: bool  # some fall due within FIRE_AHEAD_MS: the scheduler gets a copy at once
    appended: asyncio.Future[None]


class _Outgoing(NamedTuple):
    """A request in the outbox, until the link's drain task publishes it."""

    transport: Transport
    op: str
    request_id: str
    body: bytes
    ttl: int | None
    sent: asyncio.Future[None]  # resolved once published (an exception: it was not)


def _soon(requests: list[Any]) -> bool:
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


def _remember(table: collections.OrderedDict[str, T], key: str, value: T) -> None:
    """Note ``key`` in ``table``, forgetting the oldest past :data:`_REMEMBERED`."""
    table[key] = value
    if len(table) > _REMEMBERED:
        table.popitem(last=False)


class LoopLink:
    """Requests and replies over one transport, on the loop of its first call."""

    def __init__(
        self,
        make_transport: Callable[[], Transport],
        *,
        scheduler: Candidacy,
        request_timeout: float,
        deliver: tuple[str, str] | None = None,
        fast_put: bool = False,
        url: str = "",
    ) -> None:
        self._make_transport = make_transport
        self._url = url
        self._deliver = deliver
        self._fast_put = fast_put
        #: This link's name in the intake, and its intake messages: the last numbered,
        #: the last confirmed, the last known folded (a reply to a request that waited
        #: behind it came back); the first ``after`` each request in flight was sent with.
        self._client = uuid.uuid4().hex
        self._intake_seq = 0
        self._confirmed_seq = 0
        self._folded_seq = 0
        self._barriers: dict[str, int] = {}
        self._intake: list[_FastPut] = []
        self._appending = False
        #: Set by the scheduler's ``full`` announcement: puts take the plain path (which
        #: may refuse them) until one of them is taken.
        self._full = False
        #: Until when (time.monotonic()) the scheduler said ``quiet``: no reserve waits,
        #: so a put due soon is not copied to it (the intake's tail brings it).
        self._quiet_until = 0.0
        self._configured: set[str] = set()
        #: Whether a connection of this link opened once (the namespace's objects are
        #: declared: a ThreadLink may append from its callers' threads).
        self._declared = False
        self._candidacy = scheduler
        self._request_timeout = request_timeout
        self._transport: Transport | None = None
        #: Whether a scheduler answered this link once (or announced itself). Until
        #: then, a call from a process that does not stand first asks the broker
        #: whether any process does: if none, none would answer it. After, a scheduler
        #: that does not answer is an outage, ridden out as ever (a broker's restart:
        #: the candidates come back, a moment after the clients).
        self._served = False
        self._counting: tuple[Transport, asyncio.Task[int]] | None = None
        self._opening: asyncio.Task[Transport] | None = None
        #: Done once this link is closed (made on its loop by the first connect).
        self._closed_signal: asyncio.Future[None] | None = None
        #: Request id -> the future of its reply: kind, body and the loop's time it came.
        self._pending: dict[str, asyncio.Future[tuple[str, bytes, float]]] = {}
        #: Request id -> queue, of reserves their callers abandoned; and -> queue and the
        #: leases its caller got, of reserves answered: a late answer to either (a resend
        #: that a new scheduler served too) gives back what no caller received.
        self._forgotten: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._answered: collections.OrderedDict[str, tuple[str, frozenset[str]]] = (
            collections.OrderedDict()
        )
        #: A sequential consumer's loop (docs/rabbitmq.md, "A reserve sent with the
        #: acks"): per queue, the ``(limit, lease_ms, wait)`` of the last call, when it
        #: was a waiting reserve that got messages; and the reserve sent ahead with the
        #: ``ack_many`` that followed it, until the caller's next call takes or drops it.
        self._reserving: dict[str, tuple[int, int, float | None]] = {}
        self._ahead: dict[str, tuple[int, int, asyncio.Task[tuple[Any, float | None]]]] = {}
        self._turn: asyncio.Future[None] | None = None
        self._candidate = False
        self._scheduler: Scheduler | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The tasks giving back what a reserve claimed for a caller that will not take
        #: it (a subset of ``_tasks``): a close lets them finish before it cuts calls.
        self._giving: set[asyncio.Task[Any]] = set()
        self._publishing = False
        self._outbox: list[_Outgoing] = []
        #: Connections being closed after they were given up (a close waits for them).
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def fast(self) -> bool:
        """Whether a put whose outcome nobody reads may go through the intake now."""
        return self._fast_put and not self._full

    # -- connection and election ---------------------------------------------------------

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
                await asyncio.wait_for(opening, self._request_timeout)
            except asyncio.TimeoutError:
                raise ConnectionError(
                    f"no connection to the broker in {self._request_timeout:g} s"
                ) from None
            self._transport = transport
            self._declared = True
            if self._candidacy == "on":
                await self._campaign(transport)
        except BaseException as exc:
            if self._transport is transport:
                self._transport = None
            with contextlib.suppress(Exception):
                await transport.close()
            if not self._declared and isinstance(exc, (ConnectionError, OSError)):
                # No connection ever opened: a mistake of the URL more likely than an
                # outage, said at once rather than ridden out (each call tries again).
                raise Refused(self._refused(exc)) from exc
            raise
        return transport

    def _refused(self, exc: BaseException) -> ServerRefused:
        """``exc``, a first connection's failure, as a :class:`ServerRefused`."""
        if isinstance(exc, ServerRefused):
            return exc
        error = ServerRefused(f"cannot use the queue at {redact_url(self._url)}: {exc}")
        error.__cause__ = exc
        return error

    async def _stands(self, transport: Transport, seconds: float) -> bool:
        """Whether a process stands for election (True once a scheduler answered this
        link), asked of the broker by one task for every call that asks meanwhile;
        ConnectionError when it did not answer within ``seconds``."""
        if self._served:
            return True
        counting = self._counting
        if counting is None or counting[0] is not transport or counting[1].done():
            task = asyncio.get_running_loop().create_task(transport.candidates())
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
            counting = self._counting = (transport, task)
        try:
            found = await asyncio.wait_for(asyncio.shield(counting[1]), max(seconds, 0.001))
        except asyncio.TimeoutError:
            raise ConnectionError("the broker did not say who stands in time") from None
        return found > 0

    def _not_running(self) -> SchedulerNotRunning:
        return SchedulerNotRunning(
            f"cannot use the queue at {redact_url(self._url)}: no scheduler runs for its "
            "namespace (no delayq process stands for election): start one with `delayq "
            "scheduler --url URL` (a `delayq worker`, or a consumer waiting in a reserve, "
            "stands too)"
        )

    async def _connected_within(self, seconds: float) -> Transport:
        """:meth:`_connected`, or ConnectionError after ``seconds`` (the opening goes
        on, for the next call); while no connection ever opened, a Refused of a
        ServerRefused instead (as the opening itself raises)."""
        try:
            return await asyncio.wait_for(self._connected(), max(seconds, 0.001))
        except asyncio.TimeoutError:
            if not self._declared:  # as the opening itself would say
                late = ConnectionError(f"no connection to the broker in {seconds:.3g} s")
                raise Refused(self._refused(late)) from None
            raise ConnectionError("no connection to the broker in time") from None

    async def _stand(self) -> None:
        """Stand for election on the current connection (once per connection)."""
        transport = await self._connected()
        if not self._candidate:
            await asyncio.shield(self._campaign(transport))

    async def _campaign(self, transport: Transport) -> None:
        if not self._candidate:
            self._candidate = True
            try:
                await transport.campaign(lambda: self._on_token(transport))
            except BaseException:
                self._candidate = False
                raise

    def _on_token(self, transport: Transport) -> None:
        if transport is not self._transport or self._scheduler is not None:
            return  # a token on a connection being dropped: it goes with it
        scheduler = Scheduler(transport, lambda: self._on_scheduler_stopped(transport))
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
        its clients are not being answered either."""
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
            except (ConnectionError, OSError, Refused):
                await asyncio.sleep(pause)
                pause = min(pause * 2, REJOIN_MAX_PAUSE)

    def _on_elected(self) -> None:
        self._served = True
        self._quiet_until = 0.0  # a new scheduler says so again if no reserve waits
        self._next_turn()

    def _next_turn(self) -> None:
        """Wake every call in flight: resend (to a new scheduler, or on a new
        connection)."""
        turn, self._turn = self._turn, None
        if turn is not None and not turn.done():
            turn.set_result(None)

    def _on_reply(self, request_id: str, kind: str, body: bytes) -> None:
        if kind == "batch":  # the replies to several requests of this link, in order
            for part_id, part_kind, part_body in unpack(body):
                self._on_reply(part_id, part_kind, part_body)
            return
        if not request_id and kind in ("full", "quiet", "nudge"):  # announcements
            if kind == "full":
                self._full = self._fast_put
            else:
                self._quiet_until = time.monotonic() + QUIET_HOLD if kind == "quiet" else 0.0
            return
        future = self._pending.get(request_id)
        if future is not None:
            self._served = True
            # Every send of this request waited behind this intake message at least.
            self._folded_seq = max(self._folded_seq, self._barriers.pop(request_id, 0))
            if not future.done():
                # When it came, by the clock a held reply is counted on (the loop's
                # own may be coarser, or cached).
                future.set_result((kind, body, time.monotonic()))
            return
        queue = self._forgotten.pop(request_id, None)
        received: frozenset[str] = frozenset()
        if queue is None and request_id in self._answered:
            queue, received = self._answered[request_id]
        if queue is not None and kind in ("ok", "held"):
            # A reserve abandoned by its caller was served after all, or one answered
            # was served again (its resend reached a scheduler that did not know of the
            # first answer): give back what its caller did not receive.
            for item in reserve_items(kind, body):
                record = decode_record(item)
                if record.lease not in received:
                    self._spawn_giving(self._quiet("release", [queue, record.id, record.lease]))

    async def _forget(self, queue: str, request_id: str) -> None:
        transport = self._transport
        if transport is not None:
            body = pack([queue, request_id])
            # Through the outbox, so that it leaves after the reserve it forgets.
            await self._request(transport, "forget", uuid.uuid4().hex, body, None)

    async def _quiet(self, op: str, args: list[Any]) -> None:
        with contextlib.suppress(Exception):
            await self._call(op, args, 0.0)  # the link's own: not its caller's next call

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _spawn_giving(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._spawn(coro)
        self._giving.add(task)
        task.add_done_callback(self._giving.discard)

    # -- calls -------------------------------------------------------------------------

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
                if op == "ack_many" and self._reserving.get(args[0]) and not self._pending:
                    self._send_ahead(args[0])
                taken = await self._call(op, args, wait)
            self._reserving.clear()
            if op == "reserve" and taken[0] and wait != 0 and not self._pending:
                self._reserving[args[0]] = (args[1], args[2], wait)
            return taken
        except Refused as exc:
            raise exc.reason from exc.reason.__cause__

    async def _configure(self, queue: str) -> None:
        if self._deliver is not None and queue not in self._configured:
            # This backend object delivers its queues' messages to a user's exchange:
            # say so once per queue, before its first operation.
            await self._call("configure", [queue, list(self._deliver)], 0.0)
            self._configured.add(queue)

    async def _call(self, op: str, args: list[Any], wait: float | None) -> tuple[Any, float | None]:
        loop = asyncio.get_running_loop()
        request_id = uuid.uuid4().hex
        waits = op == "reserve" and (wait is None or wait > 0)
        give_up = None if wait is None else loop.time() + wait
        future: asyncio.Future[tuple[str, bytes, float]] = loop.create_future()
        self._pending[request_id] = future
        parked = False
        try:
            if waits and self._candidacy == "auto" and not self._candidate:
                await self._stand()
            unanswered_since = loop.time()
            # Whether some send of the request may have reached a scheduler: then a
            # change that gets no reply may have run, and its caller is told so.
            may_have_run = False
            sent_before = False
            while True:
                if self._turn is None:
                    self._turn = loop.create_future()
                turn = self._turn
                sent = [*args, None if give_up is None else max(0.0, give_up - loop.time())]
                try:
                    transport = self._transport or await self._connected_within(
                        unanswered_since + self._request_timeout - loop.time()
                    )
                    left = unanswered_since + self._request_timeout - loop.time()
                    if not (sent_before or self._candidate or await self._stands(transport, left)):
                        raise self._not_running()  # nothing was sent: nothing ran
                    ttl = None if waits else int(self._request_timeout * 1000)
                    # A waiting reserve counts as parked from the moment it may be on
                    # its way: one cancelled while its publish is in flight may reach
                    # the scheduler all the same, and must be forgotten there.
                    parked = waits
                    may_have_run = may_have_run or op not in _READS
                    sent_before = True
                    await self._request(
                        transport, op, request_id, pack(sent if op == "reserve" else args), ttl
                    )
                except SchedulerNotRunning:
                    raise
                except (NoScheduler, ConnectionError, OSError) as exc:
                    left = unanswered_since + self._request_timeout - loop.time()
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
                        _remember(self._forgotten, request_id, args[0])
                    what = "no reply" if self._candidate else _NO_REPLY_HINT
                    raise self._no_reply(op, may_have_run, what, timeout)
                unanswered_since = loop.time()
        except asyncio.CancelledError:
            if parked:
                # Sent before the caller goes on, so that the scheduler drops the parked
                # reserve before it sees the caller's next request; one served meanwhile
                # is given back when its reply comes.
                _remember(self._forgotten, request_id, args[0])
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
            self._barriers.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # seen, also when the call ends another way
        kind, body, arrived = future.result()
        if kind not in {"ok", "held"}:
            raise_error(kind, unpack(body))
        if op == "put":
            self._full = False  # the scheduler took a put: there is room again
        if kind == "ok":
            return self._answer(op, args, request_id, unpack(body)), None
        # Claimed ahead of their due time: held until then, by the scheduler's clock
        # (the reply says how long, counted from when it left: it came later).
        rest, items = unpack(body)
        return self._answer(op, args, request_id, items), arrived + rest

    # -- a reserve sent with the acks -------------------------------------------------

    def _send_ahead(self, queue: str) -> None:
        """With a sequential caller's ``ack_many`` (its last call was a waiting reserve
        of ``queue`` that got messages), send that reserve again in the same batch, so
        that a message falling due during the ack's round trip finds a reserve waiting
        at the scheduler; the caller's next matching reserve takes its answer."""
        limit, lease_ms, wait = self._reserving[queue]
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._call("reserve", [queue, limit, lease_ms], wait))
        self._ahead[queue] = (limit, lease_ms, task)
        task.add_done_callback(lambda done: self._ahead_answered(queue, done))

    def _ahead_answered(self, queue: str, task: asyncio.Task[tuple[Any, float | None]]) -> None:
        ahead = self._ahead.get(queue)
        if ahead is None or ahead[2] is not task:
            return
        if task.cancelled() or task.exception() is not None or not task.result()[0]:
            return  # nothing was claimed: the caller's reserve goes as usual
        # Claimed, and not taken yet: given back unless the caller takes it soon.
        loop = asyncio.get_running_loop()
        loop.call_later(_AHEAD_KEPT, self._expire_ahead, queue, task)

    def _expire_ahead(self, queue: str, task: asyncio.Task[tuple[Any, float | None]]) -> None:
        ahead = self._ahead.get(queue)
        if ahead is not None and ahead[2] is task and not self._closed:
            del self._ahead[queue]
            self._spawn_giving(self._give_up(queue, task))

    async def _take_ahead(
        self, op: str, args: list[Any], wait: float | None
    ) -> tuple[Any, float | None] | None:
        """The answer of the reserve sent ahead, when this call is the reserve it
        stands for (same queue, limit and lease); else None, once every reserve sent
        ahead is given up (what it claimed released, logged before this call goes)."""
        queue = args[0] if args else ""
        ahead = self._ahead.get(queue) if op == "reserve" else None
        if ahead is None or ahead[:2] != (args[1], args[2]) or wait == 0:
            await self._drop_ahead()
            return None
        del self._ahead[queue]
        task = ahead[2]
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await asyncio.wait_for(asyncio.shield(task), wait)
        except asyncio.TimeoutError:
            await self._give_up(queue, task)
            return [], None
        except asyncio.CancelledError:
            await asyncio.shield(self._give_up(queue, task))
            raise
        except Exception:
            return None  # it failed: the caller's own reserve goes as usual
        outcome, until = task.result()
        if outcome:
            return outcome, until
        left = None if wait is None else wait - (loop.time() - started)
        if left is not None and left <= 0:
            return [], None
        return await self._call("reserve", args, left)

    async def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, {}
        for queue, (_, _, task) in ahead.items():
            await self._give_up(queue, task)

    async def _give_up(self, queue: str, task: asyncio.Task[tuple[Any, float | None]]) -> None:
        """Give up a reserve sent ahead: cancelled if unanswered (it sends ``forget``,
        which at the scheduler also releases what an answer on its way claimed), or
        what it got released, in both cases before the caller's next request."""
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
            return
        if task.cancelled() or task.exception() is not None:
            return
        outcome = task.result()[0]
        releases = [self._call("release", [queue, r.id, r.lease], 0.0) for r in outcome]
        await asyncio.gather(*releases, return_exceptions=True)

    def _answer(self, op: str, args: list[Any], request_id: str, body: Any) -> Any:
        """The decoded outcome of a call; that of a reserve is remembered with its
        leases (a second answer to it gives back only what its caller did not get)."""
        outcome = decode_outcome(op, body)
        if op == "reserve":
            leases = frozenset(record.lease or "" for record in outcome)
            _remember(self._answered, request_id, (args[0], leases))
        return outcome

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
            self._spawn_giving(self._quiet("release", [queue, record.id, record.lease]))

    # -- the outbox ----------------------------------------------------------------------

    async def _request(
        self, transport: Transport, op: str, request_id: str, body: bytes, ttl: int | None
    ) -> None:
        """Publish a request through the outbox, in call order: a task of the link
        (:meth:`_drain`) publishes what gathered there, so the requests of callers that
        run in the same turn of the loop, or come while a publish is on its way, leave
        as one message (16 producers on one link cost the broker one message a round,
        not 16). Returns once it is sent; an error when it was not."""
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outbox.append(_Outgoing(transport, op, request_id, body, ttl, sent))
        if not self._publishing:
            self._publishing = True
            self._spawn(self._drain())
        await sent

    async def _drain(self) -> None:
        """Publish what waits in the outbox until it is empty: one message per run of
        requests for the same connection and time to live (a ``batch`` of them when
        there are several, up to MAX_GROUP_BYTES; a larger request goes alone)."""
        try:
            while self._outbox:
                batch = self._take_outbox()
                if not batch:
                    continue
                first = batch[0]
                # Read-your-writes: held at the scheduler until it folded what this
                # link appended to the intake (until a reply says it has).
                after = self._confirmed_seq if self._confirmed_seq > self._folded_seq else 0
                for item in batch:
                    if item.request_id in self._pending:
                        self._barriers.setdefault(item.request_id, after)
                try:
                    if len(batch) == 1 and not after:
                        await first.transport.request(
                            first.op, first.request_id, first.body, first.ttl
                        )
                    else:
                        parts = [["after", "", pack([self._client, after])]] if after else []
                        parts += [[item.op, item.request_id, item.body] for item in batch]
                        await first.transport.request(
                            "batch", uuid.uuid4().hex, pack(parts), first.ttl
                        )
                except BaseException as exc:
                    failure = exc if isinstance(exc, Exception) else None
                    for item in batch:
                        if not item.sent.done():
                            item.sent.set_exception(
                                failure or ConnectionError("the request was not sent")
                            )
                    if failure is None:
                        raise  # this link is being closed
                    continue
                for item in batch:
                    if not item.sent.done():
                        item.sent.set_result(None)
        finally:
            self._publishing = False
            self._fail_outbox()

    def _take_outbox(self) -> list[_Outgoing]:
        """The outbox's first requests that leave together (those whose caller gave up
        before they left are dropped: a cancelled publish need not go)."""
        batch: list[_Outgoing] = []
        size = 0
        while self._outbox:
            item = self._outbox[0]
            if item.sent.done():
                del self._outbox[0]
                continue
            if batch and (
                item.transport is not batch[0].transport
                or item.ttl != batch[0].ttl
                or size + len(item.body) > MAX_GROUP_BYTES
            ):
                break
            batch.append(item)
            size += len(item.body)
            del self._outbox[0]
        return batch

    def _fail_outbox(self) -> None:
        """Fail what is left in the outbox once nothing drains it (a close): each caller
        sees an outage, and resends or gives up as for any failed publish."""
        outbox, self._outbox = self._outbox, []
        for item in outbox:
            if not item.sent.done():
                item.sent.set_exception(ConnectionError("the request was not sent"))

    # -- fast puts -----------------------------------------------------------------------

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
        put = _FastPut(uuid.uuid4().hex, queue, requests, size, _soon(requests), appended)
        if self._appending:  # an append is on its way: this put leaves with the next
            self._intake.append(put)
        else:
            # Nothing on its way: appended by this caller's task (no task of the link
            # to start and switch to); what gathers meanwhile, by the drain task.
            self._appending = True
            try:
                await self._send_intake([put])
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
                puts: list[_FastPut] = []
                size = 0
                while self._intake and (not puts or size + self._intake[0].size <= MAX_GROUP_BYTES):
                    put = self._intake.pop(0)
                    if not put.appended.done():  # its caller gave up before it left
                        puts.append(put)
                        size += put.size
                if puts:
                    await self._send_intake(puts)
        finally:
            self._appending = False
            self._fail_intake()

    async def _send_intake(self, puts: list[_FastPut]) -> None:
        """Append ``puts`` as the link's next intake message and settle their futures
        (an error of the append: each put's; a cancellation is raised too)."""
        seq, nudge = self.next_intake(any(p.soon for p in puts))
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
        self.intake_confirmed(seq)
        for put in puts:
            if not put.appended.done():
                put.appended.set_result(None)

    def _fail_intake(self) -> None:
        """Fail the puts left in the intake box once nothing appends them (a close)."""
        left, self._intake = self._intake, []
        for put in left:
            if not put.appended.done():
                put.appended.set_exception(QueueClosed("the queue was closed"))

    # -- fast puts appended from a ThreadLink's callers' threads ---------------------------
    # The ThreadLink numbers and appends them itself (BlockingIntake), one at a time, so
    # this link appends none of its own: each number is this link's and the scheduler
    # sees them in order, as it does this link's own.

    def blocking_intake(self) -> BlockingIntake | None:
        """A publisher of the intake for a caller's thread, on a connection of its own
        (None: the transport has none)."""
        return self._make_transport().blocking_intake()

    def intake_ready(self, queues: list[str]) -> bool:
        """Whether a fast put into ``queues`` may be appended from a caller's thread
        (a connection opened once and each queue configured): else
        :meth:`prepare_intake` first."""
        return self._declared and (
            self._deliver is None or all(queue in self._configured for queue in queues)
        )

    async def prepare_intake(self, queues: list[str]) -> None:
        """Open a connection (declaring the namespace) and configure ``queues``, with
        the errors a fast put on this loop would raise."""
        if self._closed:
            raise QueueClosed("the queue is closed")
        try:
            for queue in queues:
                await self._configure(queue)
            await self._connected_within(self._request_timeout)
        except Refused as exc:
            raise exc.reason from exc.reason.__cause__
        except NoScheduler:
            raise
        except (ConnectionError, OSError) as exc:
            raise self._no_reply("put", False, "no intake append") from exc

    def next_intake(self, soon: bool) -> tuple[int, bool]:
        """Number the next intake message; and whether the scheduler gets a copy at
        once (``soon``: some fall due within FIRE_AHEAD_MS, and no ``quiet`` holds)."""
        self._intake_seq += 1
        return self._intake_seq, soon and time.monotonic() >= self._quiet_until

    def intake_body(self, seq: int, parts: list[Any]) -> bytes:
        """The intake message ``seq`` of ``parts`` (``[request id, queue, encoded
        requests]`` each), stamped with the moment it is sent."""
        now = Now.of_seconds(time.time())
        return pack([self._client, seq, now.floor, now.ceil, parts])

    def intake_confirmed(self, seq: int) -> None:
        """The broker confirmed intake message ``seq``: this link's next requests wait
        for it at the scheduler."""
        self._confirmed_seq = max(self._confirmed_seq, seq)

    @property
    def request_timeout(self) -> float:
        return self._request_timeout

    @property
    def close_settle(self) -> float:
        """How long each step of a close waits for the broker (CLOSE_SETTLE, or the
        request timeout if shorter)."""
        return min(CLOSE_SETTLE, self._request_timeout)

    def no_reply(self, op: str, may_have_run: bool, what: str) -> NoScheduler:
        """See :meth:`_no_reply`."""
        return self._no_reply(op, may_have_run, what)

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
        if self._confirmed_seq > self._folded_seq:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._call("sync", [], 0.0), until - loop.time())

    async def _append(self, seq: int, parts: list[Any], *, nudge: bool) -> None:
        """Append the intake message ``seq`` of ``parts`` (puts), on a new connection
        when one goes, for up to the request timeout (the same puts: the scheduler folds
        each once). The message carries the moment it is sent (as the put's arrival is
        for a plain put): the scheduler decides its puts as of then. With ``nudge``, the
        broker hands the scheduler a copy at once too (docs/rabbitmq.md, "Fast put")."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._request_timeout
        may_have_run = False
        while True:
            left = deadline - loop.time()
            try:
                transport = self._transport or await self._connected_within(left)
                may_have_run = True
                body = self.intake_body(seq, parts)
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
        time), the connection then given up (it may be dead without a reset). Bounded by
        a timer that cancels this task, not by wait_for (a task per put)."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            self._abandon(transport)
            if task is not None:
                task.cancel()

        timer = loop.call_at(deadline, expire)
        try:
            await transport.append_intake(body, nudge=nudge)
        except asyncio.CancelledError:
            if not expired:
                raise
            uncancel = getattr(task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            raise self._no_reply("put", True, "no confirm from the intake") from None
        finally:
            timer.cancel()

    def _no_reply(
        self, op: str, may_have_run: bool, what: str, seconds: float | None = None
    ) -> NoScheduler:
        """The error of a call that got no reply within the request timeout (or
        ``seconds``: a waiting reserve's wait and the request timeout): ReplyLost (an
        OutcomeUnknown) when it may have run, else NoScheduler."""
        message = f"{what} in {self._request_timeout if seconds is None else seconds:.3g} s"
        if may_have_run:
            return ReplyLost(f"{message}: the {op} may or may not have run", op)
        return NoScheduler(message)

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
            await asyncio.wait_for(self._drop_ahead(), until - loop.time())
            await asyncio.wait_for(self._call("sync", [], 0.0), until - loop.time())
        while self._giving and loop.time() < until:
            # The late answers the round trip let in give back what they claimed.
            await asyncio.wait(set(self._giving), timeout=until - loop.time())

    async def close(self) -> None:
        """Fail every call in flight with QueueClosed and close the connection (a
        scheduler so hands over to the next candidate)."""
        if self._closed:
            return
        if self._ahead or self._giving:
            await self._give_back_all()
        if self._intake or self._confirmed_seq > self._folded_seq:
            await self._settle()
        self._closed = True
        if self._closed_signal is not None and not self._closed_signal.done():
            self._closed_signal.set_result(None)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(QueueClosed("the queue was closed"))
        if self._scheduler is not None:
            scheduler, self._scheduler = self._scheduler, None
            scheduler.stop()
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
            await asyncio.wait(set(self._closing), timeout=_CLOSE_WAIT)
        for task in [*self._tasks, *self._closing]:
            task.cancel()


class _Waiting:
    """A sync fast put waiting for its turn in the intake (:meth:`ThreadLink.put_fast`)."""

    __slots__ = ("error", "lead", "queue", "request_id", "requests", "size", "soon", "woken")

    def __init__(self, queue: str, requests: list[Any]) -> None:
        self.request_id = uuid.uuid4().hex
        self.queue = queue
        self.requests = requests
        self.size = sum(len(request[1]) for request in requests)  # the payloads
        self.soon = _soon(requests)
        #: Released once its outcome is known, or once its thread is to lead.
        self.woken = threading.Lock()
        self.woken.acquire()
        self.lead = False
        self.error: BaseException | None = None


class ThreadLink:
    """A :class:`LoopLink` on a private event loop thread, for the sync face: each call
    blocks its thread until the loop has its outcome; a fast put is appended from its
    caller's thread instead, when the transport offers a :class:`BlockingIntake`.

    A forked child has no such thread (only the forking thread survives a fork), and
    the connection it would find is its parent's. Its first call starts afresh: a new
    link, loop and thread, which connect on their own. The parent's are left as they
    are, never closed from the child (a close would end the parent's connection), and
    a child never inherits its parent's scheduler."""

    def __init__(
        self,
        make_transport: Callable[[], Transport],
        *,
        scheduler: Candidacy,
        request_timeout: float,
        deliver: tuple[str, str] | None = None,
        fast_put: bool = False,
        url: str = "",
    ) -> None:
        self._options = (make_transport, scheduler, request_timeout, deliver, fast_put, url)
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        make_transport, scheduler, request_timeout, deliver, fast_put, url = self._options
        self._link = LoopLink(
            make_transport,
            scheduler=scheduler,
            request_timeout=request_timeout,
            deliver=deliver,
            fast_put=fast_put,
            url=url,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="delayq-amqp-link", daemon=True
        )
        self._thread.start()
        self._fork = generation()
        # Fast puts (put_fast): those waiting, whether a thread leads (appends the next
        # message of them), the publisher it appends with (made on the first; None
        # after the transport offered none: they go through the loop).
        self._intake_lock = threading.Lock()
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._leading = False
        self._closing = False
        self._blocking: BlockingIntake | None = None
        self._by_loop = False

    @property
    def closed(self) -> bool:
        return self._link.closed

    def _current(self) -> LoopLink:
        if self._fork != generation():
            self._after_fork()
        return self._link

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread and block until its outcome. One wake-up
        each way: the coroutine's own task releases a plain lock as it ends (no
        concurrent future, no done callback a loop turn later), and the caller holds
        the task, so a pending one is not collected."""
        if self._loop.is_closed():
            coro.close()
            raise QueueClosed("the queue is closed")
        done = threading.Lock()
        done.acquire()
        outcome: list[tuple[bool, Any]] = []  # (raised, its result or exception)

        async def hop() -> None:
            try:
                outcome.append((False, await coro))
            except BaseException as exc:
                # A cancelled call raises as a cancelled concurrent future did.
                cancelled = isinstance(exc, asyncio.CancelledError)
                outcome.append((True, concurrent.futures.CancelledError() if cancelled else exc))
                if not isinstance(exc, Exception):
                    raise  # a cancellation, or a KeyboardInterrupt of the loop thread
            finally:
                done.release()

        tasks: list[asyncio.Task[None]] = []
        self._loop.call_soon_threadsafe(lambda: tasks.append(self._loop.create_task(hop())))
        done.acquire()
        raised, value = outcome[0]
        if raised:
            raise value
        return value  # type: ignore[no-any-return]

    def _after_fork(self) -> None:
        with _after_fork_lock:
            if self._fork == generation():
                return  # another thread of the child started afresh meanwhile
            # The lock may have been held by a thread of the parent at the fork.
            self._lock = threading.Lock()
            if self._loop.is_closed() or self._link.closed:
                self._fork = generation()  # closed before the fork: it stays closed
                return
            self._start()

    def call(self, op: str, args: list[Any], wait: float | None = 0.0) -> Any:
        """See :meth:`LoopLink.call`. Messages got ahead of their due time are held in
        the calling thread (its sleep is precise to the kernel's timer; the loop's
        timers count whole milliseconds), which so wakes with them."""
        link = self._current()
        outcome, until = self._run(link.call_held(op, args, wait))
        if until is not None:
            try:
                while (rest := until - time.monotonic()) > 0:
                    time.sleep(rest)
            except BaseException:
                if not self._loop.is_closed():
                    self._loop.call_soon_threadsafe(link.give_back, args[0], outcome)
                raise
            if link.closed:
                raise QueueClosed("the queue was closed")
        return outcome

    @property
    def fast(self) -> bool:
        """See :attr:`LoopLink.fast`."""
        return self._current().fast

    def put_fast(self, queue: str, requests: list[Any]) -> None:
        """See :meth:`LoopLink.put_fast`: the same outcome and errors, the put appended
        from this thread (docs/rabbitmq.md, "Fast put from a thread"). The puts of
        several threads at once are appended a message at a time, in order: the thread
        whose turn it is (the lead) appends every put waiting then, up to
        MAX_GROUP_BYTES, wakes their threads, and hands the lead to the next put still
        waiting. No thread appends puts that came after its own."""
        link = self._current()
        if self._by_loop:
            self._run(link.put_fast(queue, requests))
            return
        put = _Waiting(queue, requests)
        with self._intake_lock:
            if self._closing or link.closed:
                raise QueueClosed("the queue is closed")
            self._waiting.append(put)
            put.lead = not self._leading
            self._leading = True
        if not put.lead:
            try:
                put.woken.acquire()
            except BaseException:
                self._leave(put)
                raise
        if put.lead:
            self._lead(link)
        if put.error is not None:
            raise put.error

    def _leave(self, put: _Waiting) -> None:
        """``put``'s caller gave up before its outcome (an interrupt): it leaves, and
        the lead, if it was given it, goes on."""
        with self._intake_lock:
            if put in self._waiting:
                self._waiting.remove(put)
            handed = put.lead
        if handed:
            self._hand_on()

    def _lead(self, link: LoopLink) -> None:
        """Append the puts waiting (this thread's first), wake their threads, and hand
        the lead on."""
        with self._intake_lock:
            batch: list[_Waiting] = []
            size = 0
            while self._waiting and (not batch or size + self._waiting[0].size <= MAX_GROUP_BYTES):
                put = self._waiting.popleft()
                batch.append(put)
                size += put.size
        try:
            self._append(link, batch)
        except BaseException as exc:
            for put in batch:
                put.error = exc if isinstance(exc, Exception) else QueueClosed("closed")
            raise
        finally:
            for put in batch[1:]:
                put.woken.release()
            self._hand_on()
            if link.closed and self._blocking is not None:
                self._blocking.close()  # reopened by a retry that raced the close

    def _hand_on(self) -> None:
        with self._intake_lock:
            if self._waiting:
                following = self._waiting[0]
                following.lead = True
                following.woken.release()
            else:
                self._leading = False

    def _append(self, link: LoopLink, batch: list[_Waiting]) -> None:
        """Append ``batch`` as this link's next intake message, on a new connection when
        one fails, for up to the request timeout (as :meth:`LoopLink._append` does)."""
        queues = [put.queue for put in batch]
        if not link.intake_ready(queues):
            self._run(link.prepare_intake(queues))
        if self._blocking is None:
            self._blocking = link.blocking_intake()
            if self._blocking is None:  # none offered: through the loop from now on
                self._by_loop = True
                for put in batch:
                    self._run(link.put_fast(put.queue, put.requests))
                return
        seq, nudge = link.next_intake(any(put.soon for put in batch))
        parts = [[put.request_id, put.queue, put.requests] for put in batch]
        deadline = time.monotonic() + link.request_timeout
        may_have_run = False
        while True:
            try:
                self._blocking.connect(deadline)
                may_have_run = True
                self._blocking.append(link.intake_body(seq, parts), nudge=nudge, deadline=deadline)
                break
            except (ConnectionError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise link.no_reply("put", may_have_run, "no intake append") from exc
                if link.closed:
                    raise QueueClosed("the queue was closed") from None
                time.sleep(min(max(deadline - time.monotonic(), 0.0), 0.1))
        link.intake_confirmed(seq)

    def close(self) -> None:
        """See :meth:`LoopLink.close`, once the fast puts of this link's threads are
        appended (for up to CLOSE_SETTLE s); then the loop thread ends."""
        link = self._current()
        with self._lock:
            if self._loop.is_closed():
                return
            with self._intake_lock:
                self._closing = True
            until = time.monotonic() + link.close_settle
            while self._leading and time.monotonic() < until:
                time.sleep(0.005)
            if self._blocking is not None:
                self._blocking.close()
            self._run(link.close())
            self._run(_settle_loop(_CLOSE_WAIT))
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()


async def _settle_loop(seconds: float) -> None:
    """Let the loop's other tasks end (the broker library's, closing a connection),
    for up to ``seconds``, then cancel what is left: a task still pending when its
    loop is closed would be reported as destroyed, on stderr, at exit."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    # Again while ending tasks start others (a reader's end starts the writer's close).
    while (others := asyncio.all_tasks() - {asyncio.current_task()}) and loop.time() < until:
        await asyncio.wait(others, timeout=until - loop.time())
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=seconds)


#: Serialises a forked child's fresh starts; made anew in each child (a thread of the
#: parent may have held it at the fork).
_after_fork_lock = threading.Lock()


def _new_after_fork_lock() -> None:
    global _after_fork_lock
    _after_fork_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_after_fork_lock)
