"""The sync face's calls made in the caller's thread (docs/rabbitmq.md, "The sync face's
path"): a request published from that thread on the
:class:`~.._transport.BlockingTransport`, and its reply waited for there, the thread
taking its turn to read the connection. The decisions are the link core's
(:class:`~._core.LinkCore`, shared with the loop's link of the same backend object):
the ``after`` barrier behind this link's fast puts, the announcements (read from this
connection only, in order: :meth:`Direct.heard` before each decision), late answers.
The requests of threads that call at once leave as one message (as the loop's outbox
does), and a request is resent with the same id on a new connection, or to a newly
elected scheduler, until the request timeout.

Reserves go this way too, as the loop's link sends them (``_calls``): a waiting one
parks at the scheduler until something is due or its wait ends, the caller's thread
reading the connection meanwhile; one interrupted (KeyboardInterrupt, a timeout's
exception) is forgotten at the scheduler, which gives back what it claimed; a late
answer (a resend both schedulers served, a forgotten reserve served meanwhile) gives
back what no caller got. The hold of messages claimed ahead of their due time is the
caller's (:class:`~._thread_link.ThreadLink`), which gives them back here if it is
interrupted.

So does the reserve a sequential consumer sends with its acks (docs/rabbitmq.md, "A
reserve sent with the acks"), on the same rules as the loop's (``_ahead``; the
decisions are the core's): it leaves right after its ``ack_many``, from that thread;
the caller's next call, if it is the same reserve, takes its answer, reading the
connection for it; any other call gives it up first. An answer nobody takes within
AHEAD_KEPT is given back by a watcher thread (started by the first such reserve, one
a backend object), which reads the connection, in turns as any caller, only once a
reserve sent ahead was not taken for that long.

A first call goes this way too, with the link core's decisions: while no connection of
the backend object ever opened, one that fails is said at once (the URL's mistake, a
:class:`~.._transport.ServerRefused`); while no scheduler ever answered, a process that
does not stand first asks the broker who does, and nobody: SchedulerNotRunning at once,
nothing sent; a queue delivered to a user's exchange is ``configure``d before its
first call. A ThreadLink keeps to its loop only standing for election (a waiting
reserve of a backend object with ``scheduler=auto``, or the first call of one with
``on``, starts it there first: :meth:`~._state.LinkState.stands_first`) and the
scheduler.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ....errors import QueueClosed, SchedulerNotRunning
from .._codec import pack, raise_error, unpack
from .._constants import FOLDING, RESEND_FOR
from .._transport import BlockingTransport, NoScheduler, OnReply, Refused
from ._core import READS, LinkCore, Reserving, take_group, unclaim

__all__ = ["Direct"]

#: ``no_reply(op, may_have_run, sent, seconds)``: the error of a call that got no reply
#: (``seconds``: the time it waited, None: the request timeout).
NoReply = Callable[[str, bool, bool, float | None], NoScheduler]
#: The longest single wait of a reserve that waits without limit (it then waits again).
_LONG_WAIT = 60.0


class _Call:
    """A request of a caller's thread: in the outbox until sent, then its reply."""

    __slots__ = ("arrived", "body", "error", "kind", "op", "reply", "request_id", "sent", "ttl")

    def __init__(self, op: str, request_id: str, body: bytes, ttl: int | None) -> None:
        self.op = op
        self.request_id = request_id
        self.body = body
        self.ttl = ttl
        self.sent = False
        self.error: BaseException | None = None
        self.kind = ""
        self.reply: bytes | None = None
        self.arrived = 0.0


class _Ahead:
    """A reserve sent ahead with a sequential caller's ``ack_many`` (docs/rabbitmq.md, "A
    reserve sent with the acks"), until a call takes it or gives it up, or the watcher
    gives back what it got (:meth:`Direct._watch`)."""

    __slots__ = ("call", "elections", "limits", "opened", "queue", "until")

    def __init__(
        self, queue: str, limits: tuple[int, int], call: _Call, opened: int, elections: int
    ) -> None:
        self.queue = queue
        self.limits = limits
        self.call = call
        #: The connection it left on (``BlockingTransport.opened``) and the schedulers
        #: elected then: its answer comes only from that one, on that connection.
        self.opened = opened
        self.elections = elections
        #: When it is answered at the latest: its wait, and the request timeout (a
        #: :func:`time.monotonic` time).
        self.until = float("inf")


def _groups(waiting: list[_Call]) -> list[list[_Call]]:
    """``waiting`` cut into the runs that leave as one message each (one time to live
    a message)."""
    rest = list(waiting)
    groups = []
    while rest:
        groups.append(
            take_group(
                rest, lambda item: len(item.body), joins=lambda first, item: item.ttl == first.ttl
            )
        )
    return groups


class Direct:
    """Calls from the callers' threads over one :class:`BlockingTransport` (see
    :meth:`over`)."""

    transport: BlockingTransport

    @classmethod
    def over(
        cls,
        make: Callable[[OnReply, Callable[[], None]], BlockingTransport | None],
        core: LinkCore,
        request_timeout: float,
        no_reply: NoReply,
        standing: Callable[[], bool],
    ) -> Direct | None:
        """The calls over the transport ``make(on_reply, on_elected)`` gives (None
        when it gives none); the core's announcements are read from it from then on.
        ``no_reply``: the error of a call that got no reply in time; ``standing``:
        whether this process stands for election now."""
        direct = cls(core, request_timeout, no_reply, standing)
        transport = make(direct._on_reply, direct._on_elected)
        if transport is None:
            return None
        direct.transport = transport
        core.announcer = direct
        return direct

    def __init__(
        self,
        core: LinkCore,
        request_timeout: float,
        no_reply: NoReply,
        standing: Callable[[], bool],
    ) -> None:
        self._core = core
        self._standing = standing
        self._request_timeout = request_timeout
        #: How long a send lives, and a change is sent again at most (the scheduler
        #: remembers its id for a bounded time only, _constants.RESEND_FOR).
        self._ttl = int(min(request_timeout, RESEND_FOR) * 1000)
        self._no_reply = no_reply
        self._pending: dict[str, _Call] = {}
        #: Bumped by every scheduler elected: the calls waiting resend.
        self._elections = 0
        self._closed = False
        self._lock = threading.Lock()
        self._outbox: list[_Call] = []
        self._sending = threading.Lock()
        #: The releases (``[queue, id, lease]`` each) late answers ask, sent by the
        #: thread that read them once its wait is over (the turn to read released).
        self._giving: list[list[Any]] = []
        #: The reserve sent ahead (under ``_lock``), and the thread that gives back its
        #: answer when no call takes it in time, started by the first (it waits on
        #: ``_watching``, notified when it is ``_idle``: no reserve sent ahead).
        self._ahead: _Ahead | None = None
        self._watcher: threading.Thread | None = None
        self._watching = threading.Condition(self._lock)
        self._idle = False

    def connect(self, deadline: float) -> None:
        """Open the connection unless it is open (it declares the namespace's objects).
        While no connection of the backend object ever opened, a failure is a mistake
        of the URL more likely than an outage: a :class:`Refused` of the line that says
        it (:meth:`LinkCore.refused`), which its caller raises at once."""
        try:
            self.transport.connect(deadline)
        except (ConnectionError, OSError) as exc:
            if self._core.declared:
                raise
            if isinstance(exc, TimeoutError):  # as the loop's link says it
                late = ConnectionError(
                    f"no connection to the broker in {self._request_timeout:g} s"
                )
                raise Refused(self._core.refused(late)) from exc
            raise Refused(self._core.refused(exc)) from exc
        self._core.declared = True

    def configure(self, queue: str) -> None:
        """Tell the scheduler, before the first call of ``queue``, where its messages are
        delivered (:meth:`LinkCore.to_configure`), as the loop's link does."""
        configure = self._core.to_configure(queue)
        if configure is not None:
            self.call("configure", configure, 0.0)
            self._core.configured.add(queue)

    def settle(self, seconds: float) -> None:
        """Before a close: give up the reserve sent ahead (what it claimed goes back
        rather than wait out its lease), and wait, for up to ``seconds``, until this
        link's fast puts are folded (so that what a process put before it closed is
        seen by the next one), by a request that waits behind them (and behind the
        give-back: the scheduler took it before this link goes, and perhaps the
        scheduler with it); with no scheduler running they stay in the intake, folded
        once one is elected."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self._give_up(ahead)
        if (ahead is not None or self._core.unfolded) and not self._closed:
            with contextlib.suppress(Exception):
                self._call("sync", [], 0.0, seconds)

    def heard(self) -> None:
        """Take the announcements that came on the connection (before a decision
        they bear on: whether a put is fast, whether its copy goes to the
        scheduler)."""
        self.transport.poll()

    def call(self, op: str, args: list[Any], wait: float | None = 0.0) -> tuple[Any, float | None]:
        """Send ``op`` with ``args`` and return its decoded outcome, as
        :meth:`~._calls.Calls.call_held` does: a ``reserve`` waits up to ``wait``
        seconds (None: no limit) at the scheduler; with the outcome, the
        :func:`time.monotonic` time until which the caller holds messages claimed ahead
        of their due time (None: none to hold), which it gives back
        (:meth:`give_back`) if it gives up before. A sequential caller's ``ack_many``
        sends its next reserve ahead (:meth:`LinkCore.ahead_of`), whose answer the
        caller's next call takes, if it is that reserve (:meth:`_take_ahead`)."""
        try:
            taken = self._take_ahead(op, args, wait) if self._ahead is not None else None
            if taken is None:
                ahead = self._core.ahead_of(op, args, bool(self._pending))
                taken = self._call(op, args, wait, ahead=ahead)
        except Refused as exc:
            raise exc.reason from exc.reason.__cause__
        try:
            self._core.called(op, args, wait, taken[0], bool(self._pending))
        except BaseException:
            if op == "reserve" and taken[0]:  # interrupted: its caller never gets them
                self.give_back(args[0], taken[0])
            raise
        return taken

    def _call(
        self,
        op: str,
        args: list[Any],
        wait: float | None,
        within: float | None = None,
        ahead: Reserving | None = None,
    ) -> tuple[Any, float | None]:
        """:meth:`call`; ``within``: the seconds it waits for a reply (None: the request
        timeout); ``ahead``: the reserve sent after its first send (:meth:`_send_ahead`)."""
        request_timeout = self._request_timeout if within is None else within
        reserve = op == "reserve"
        waits = reserve and (wait is None or wait > 0)
        give_up = None if wait is None else time.monotonic() + wait
        call = _Call(
            op, uuid.uuid4().hex, b"" if reserve else pack(args), None if waits else self._ttl
        )
        self._pending[call.request_id] = call
        if reserve:
            self._core.reserves[call.request_id] = args[0]
        may_have_run = False
        #: Whether a send of it may have left (a reserve interrupted then is forgotten).
        left_once = False
        unanswered_since = time.monotonic()
        # A change is not sent again past RESEND_FOR s (or the request timeout) since
        # its first send, as :meth:`~._calls.Calls._call` says.
        resend_until = float("inf")
        try:
            while True:
                elections = self._elections
                if time.monotonic() >= resend_until:
                    raise self._no_reply(op, may_have_run, True, self._ttl / 1000)
                deadline = min(unanswered_since + request_timeout, resend_until)
                timeout: float | None = request_timeout
                sent = False
                try:
                    if self._closed:
                        raise QueueClosed("the queue was closed")
                    self.connect(deadline)
                    asks = self._core.asks_who_stands(left_once, self._standing())
                    if asks and self.transport.candidates(deadline) == 0:
                        raise self._core.not_running()  # nothing was sent: nothing ran
                    may_have_run = may_have_run or op not in READS
                    if may_have_run and resend_until == float("inf"):
                        resend_until = time.monotonic() + self._ttl / 1000
                        if waits:  # and for its wait (none: while it waits)
                            resend_until += float("inf") if give_up is None else (wait or 0.0)
                    if reserve:  # what is left of its wait goes with each send
                        rest = None if give_up is None else max(0.0, give_up - time.monotonic())
                        call.body = pack([*args, rest])
                    left_once = True
                    sending = [call]
                    if ahead is not None:  # with its first send only
                        sending.append(self._send_ahead(args[0], ahead))
                        ahead = None
                    self._send(sending, deadline)
                    sent = True
                    unanswered_since = time.monotonic()
                    if waits:
                        # Answered by the end of its wait; the request timeout more
                        # covers the trips (an answer lost must not hold it for ever).
                        timeout = (
                            None
                            if give_up is None
                            else max(give_up - unanswered_since, 0.0) + request_timeout
                        )
                    waited_from = time.monotonic()
                    self._wait(call, elections, timeout)
                    # Held behind this link's intake messages while the scheduler's
                    # fold of them advances (it said so meanwhile): a request timeout
                    # more (not for a call bounded ``within`` its own time: a close's).
                    while (
                        within is None
                        and not self._over(call, elections)
                        and (told := self._core.folding_since(call.request_id, waited_from))
                    ):
                        waited_from = told
                        timeout = max(told + request_timeout - time.monotonic(), 0.0)
                        self._wait(call, elections, timeout)
                except SchedulerNotRunning:
                    raise
                except (ConnectionError, OSError) as exc:
                    # Resent on a new connection, until the request timeout.
                    if self._closed:
                        raise QueueClosed("the queue was closed") from None
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._no_reply(op, may_have_run, False, None) from exc
                    if not sent:  # else its connection went: sent again at once
                        time.sleep(min(left, 0.1))
                    continue
                if call.reply is not None:
                    break
                if self._closed:
                    raise QueueClosed("the queue was closed")
                if self._elections == elections:
                    # No reply in time: the connection may be dead without a reset (TCP
                    # then holds every send behind its retransmissions): the next call
                    # opens a new one. An answer still on its way gives back what it
                    # claimed; one that reaches the closed inbox is returned to the
                    # scheduler, which releases it.
                    self.transport.close()
                    if reserve:
                        self._core.forget(call.request_id, args[0])
                    raise self._no_reply(op, may_have_run, True, timeout)
                unanswered_since = time.monotonic()  # a new scheduler: sent again
            # Decoded here, where an interruption still forgets it (and so gives back
            # what it claimed): after the return, its caller would never get them.
            return self._outcome(call, op, args)
        except BaseException as exc:
            if reserve and left_once and not isinstance(exc, Exception):
                # Interrupted (KeyboardInterrupt, a timeout's exception): forgotten at
                # the scheduler before the caller goes on, which drops it if parked
                # and gives back what it claimed if answered (a reply already read
                # included: its caller does not get it); a later answer is given back.
                self._forget(call.request_id, args[0])
            raise
        finally:
            self._pending.pop(call.request_id, None)
            self._core.ended(call.request_id)
            if self._giving:
                self._give_back_waiting()

    def _outcome(self, call: _Call, op: str, args: list[Any]) -> tuple[Any, float | None]:
        """The decoded outcome of ``call`` (``op`` of ``args``), answered; and the time
        until which what it got is held (None: nothing to hold)."""
        assert call.reply is not None
        kind, body = call.kind, unpack(call.reply)
        if kind not in ("ok", "held"):
            raise_error(kind, body)
        if op == "put":
            self._core.put_taken()
        until = None
        if kind == "held":
            # Claimed ahead of their due time: held until then, by the scheduler's clock
            # (the reply says how long, counted from when it left: it came later).
            rest, body = body
            until = call.arrived + rest
        return self._core.answer(op, args, call.request_id, body), until

    def _wait(self, call: _Call, elections: int, timeout: float | None) -> None:
        """Wait for ``call``'s reply (see :meth:`_over`) for up to ``timeout`` seconds
        (None: without limit)."""
        until = float("inf") if timeout is None else time.monotonic() + timeout
        self._read_until(functools.partial(self._over, call, elections), until)

    def _read_until(self, over: Callable[[], bool], until: float) -> None:
        """Read the connection in this thread's turns until ``over()`` or ``until`` (a
        :func:`time.monotonic` time, infinite: no limit)."""
        while not over() and (now := time.monotonic()) < until:
            self.transport.wait(over, min(until, now + _LONG_WAIT))

    def _over(self, call: _Call, elections: int) -> bool:
        """Whether ``call``'s wait is over: its reply came, a scheduler was elected
        since ``elections`` (it is sent again), or the link closed."""
        return call.reply is not None or self._elections != elections or self._closed

    def _forget(self, request_id: str, queue: str) -> None:
        """Forget reserve ``request_id`` of ``queue`` here and at the scheduler."""
        self._core.forget(request_id, queue)
        self._quietly([("forget", [queue, request_id])], None)

    def give_back(self, queue: str, records: list[Any]) -> None:
        """Release ``records``, got by a reserve whose caller gave up while they were
        held, or did not take them (a failure leaves them to their lease)."""
        self._quietly([("release", unclaim(queue, record)) for record in records], self._ttl)

    # -- a reserve sent with the acks ------------------------------------------------

    def _send_ahead(self, queue: str, reserving: Reserving) -> _Call:
        """The reserve sent ahead of ``queue`` with ``reserving`` (its previous one's
        limit, lease and wait): sent after the ``ack_many`` it goes with, as the
        caller's next reserve, so that a message falling due during their round trips
        finds a reserve waiting at the scheduler."""
        limit, lease_ms, wait = reserving
        call = _Call("reserve", uuid.uuid4().hex, pack([queue, limit, lease_ms, wait]), None)
        self._pending[call.request_id] = call
        self._core.reserves[call.request_id] = queue
        ahead = _Ahead(queue, (limit, lease_ms), call, self.transport.opened, self._elections)
        if wait is not None:
            ahead.until = time.monotonic() + wait + self._request_timeout
        with self._lock:
            self._ahead = ahead
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="delayq-amqp-ahead", daemon=True
                )
                self._watcher.start()
            elif self._idle:
                self._watching.notify()
        return call

    def _lost(self, ahead: _Ahead) -> bool:
        """Whether ``ahead`` will get no answer: it did not leave, or its connection or
        scheduler is gone since (or this link closed)."""
        return (
            not ahead.call.sent
            or ahead.call.error is not None
            or self.transport.opened != ahead.opened
            or self._elections != ahead.elections
            or self._closed
        )

    def _take_ahead(
        self, op: str, args: list[Any], wait: float | None
    ) -> tuple[Any, float | None] | None:
        """The answer of the reserve sent ahead, when this call is the reserve it stands
        for (:meth:`LinkCore.takes_ahead`), read from this thread: at once if it came,
        else when it comes, within this call's wait (an empty one that came sooner: a
        reserve of its own for the rest). Else None, once it is given up (before this
        call goes): then, or when it will get no answer, this call goes as usual."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if args[:1] != [ahead.queue] or not self._core.takes_ahead(op, args, wait, ahead.limits):
            self._give_up(ahead)
            return None
        call = ahead.call
        started = time.monotonic()
        give_up = float("inf") if wait is None else started + wait
        try:
            with contextlib.suppress(ConnectionError, OSError):  # lost: checked below
                self._read_until(
                    lambda: call.reply is not None or self._lost(ahead),
                    min(give_up, ahead.until),
                )
        except BaseException:
            self._give_up(ahead)
            raise
        if call.reply is None:
            self._give_up(ahead)
            if self._closed:
                raise QueueClosed("the queue was closed")
            return None if self._lost(ahead) or time.monotonic() < give_up else ([], None)
        self._pending.pop(call.request_id, None)
        self._core.ended(call.request_id)
        try:
            outcome, until = self._outcome(call, "reserve", args)
        except Exception:
            return None  # it failed: the caller's own reserve goes
        if outcome:
            return outcome, until
        if (left := give_up - time.monotonic()) <= 0:
            return [], None
        return self._call("reserve", args, None if wait is None else left)

    def _give_up(self, ahead: _Ahead) -> None:
        """Give up a reserve sent ahead: forgotten at the scheduler if its answer was not
        read (which there also releases what an answer on its way claimed), else what
        it got released; either sent before the caller's next request."""
        call = ahead.call
        if call.reply is None:
            self._forget(call.request_id, ahead.queue)
        self._pending.pop(call.request_id, None)
        self._core.ended(call.request_id)
        if call.reply is not None:
            with contextlib.suppress(Exception):
                records, _ = self._outcome(call, "reserve", [ahead.queue, *ahead.limits])
                self.give_back(ahead.queue, records)

    def _watch(self) -> None:
        """The watcher's thread: a reserve sent ahead that its caller did not take
        within ``ahead_kept`` s (it does something else) is watched: its answer read
        from the connection (in turns, as a caller's thread reads) and given back
        unless a call takes it within ``ahead_kept`` s more; a reserve taken sooner
        (a consumer's loop) costs it a look every ``ahead_kept`` s, no read."""
        seen: _Ahead | None = None
        while True:
            with self._lock:
                while self._ahead is None and not self._closed:
                    self._idle = True
                    self._watching.wait()
                self._idle = False
                ahead = self._ahead
                if ahead is None:  # closed
                    return
                if ahead is not seen:
                    seen = ahead
                    self._watching.wait(self._core.ahead_kept)
                    continue
            self._expire(ahead)

    def _expire(self, ahead: _Ahead) -> None:
        """Read the connection until ``ahead`` is answered (or taken, given up, lost),
        then give it back unless a call takes it within ``ahead_kept`` s."""
        call = ahead.call
        with contextlib.suppress(ConnectionError, OSError):  # lost: given up below
            self._read_until(
                lambda: call.reply is not None or self._ahead is not ahead or self._lost(ahead),
                ahead.until,
            )
        if self._giving:
            self._give_back_waiting()
        with self._lock:
            if call.reply is not None and self._ahead is ahead:
                self._watching.wait_for(
                    lambda: self._ahead is not ahead or self._closed, self._core.ahead_kept
                )
            if self._ahead is not ahead:
                return  # a call took it, or gave it up
            self._ahead = None
        self._give_up(ahead)

    def _give_back_waiting(self) -> None:
        with self._lock:
            releases, self._giving = self._giving, []
        self._quietly([("release", release) for release in releases], self._ttl)

    def _quietly(self, requests: list[tuple[str, list[Any]]], ttl: int | None) -> None:
        """Send ``requests`` (``(op, args)`` each) as one run, without waiting for
        their replies (nobody reads them: their outcome changes nothing for a
        caller); a failure is let be."""
        if not requests or self._closed:
            return
        calls = [_Call(op, uuid.uuid4().hex, pack(args), ttl) for op, args in requests]
        with contextlib.suppress(ConnectionError, OSError):
            self._send(calls, time.monotonic() + self._request_timeout)

    def _send(self, calls: list[_Call], deadline: float) -> None:
        """Publish the requests ``calls``, in order (the first's error raised). The
        thread that takes the turn to send publishes every request waiting then (those
        of threads that called meanwhile), as one message up to MAX_GROUP_BYTES a
        message; a thread whose requests it took finds them sent (or their error) once
        its own turn comes."""
        for call in calls:
            call.sent = False
            call.error = None
        with self._lock:
            self._outbox += calls
        with self._sending:
            if not all(call.sent for call in calls):
                with self._lock:
                    waiting, self._outbox = self._outbox, []
                try:
                    self._publish(waiting, deadline)
                finally:
                    # Interrupted: the requests of other threads not sent yet wait for
                    # the next thread's turn.
                    left = [item for item in waiting if not item.sent and item not in calls]
                    if left:
                        with self._lock:
                            self._outbox[:0] = left
        if calls[0].error is not None:
            raise calls[0].error

    def _publish(self, waiting: list[_Call], deadline: float) -> None:
        """Publish the requests ``waiting``, as few messages as MAX_GROUP_BYTES allows,
        each marked sent (with its error, if its message failed)."""
        for group in _groups(waiting):
            op, request_id, body = self._core.message(
                [(item.op, item.request_id, item.body) for item in group], self._pending
            )
            error: BaseException | None = None
            try:
                self.transport.request(op, request_id, body, group[0].ttl, deadline)
            except (ConnectionError, OSError) as exc:
                error = exc
            for item in group:
                item.error = error
                item.sent = True

    def _on_reply(self, request_id: str, kind: str, body: bytes) -> None:
        if kind == "batch":  # the replies to several requests of this link, in order
            for part_id, part_kind, part_body in unpack(body):
                self._on_reply(part_id, part_kind, part_body)
            return
        if kind == FOLDING and not request_id:
            self._core.told_folding(body, time.monotonic(), self._pending)
            return
        if self._core.announced(request_id, kind, time.monotonic(), self):
            return
        call = self._pending.get(request_id)
        if call is None:
            # No call waits for it: a reserve forgotten, or answered already (a resend
            # both schedulers served), gives back what no caller received.
            releases = self._core.give_back(request_id, kind, body)
        elif call.reply is None:
            self._core.served = True
            self._core.replied(request_id)
            call.kind = kind
            call.reply = body
            call.arrived = time.monotonic()  # a held reply is counted from here
            return
        else:  # a second answer before the call took the first
            releases = self._core.answered_again(request_id, (call.kind, call.reply), kind, body)
        if releases:
            with self._lock:
                self._giving += releases

    def _on_elected(self) -> None:
        self._core.served = True
        self._elections += 1
        self._core.elected(self)

    def close(self) -> None:
        """Give back what late answers claimed, then fail the calls in flight with
        QueueClosed and drop the connection."""
        if self._giving:
            self._give_back_waiting()
        with self._lock:
            self._closed = True
            self._watching.notify_all()
        self.transport.close()
