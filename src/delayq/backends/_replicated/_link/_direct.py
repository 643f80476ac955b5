"""The sync face's calls made in the caller's thread (docs/rabbitmq.md, "The sync face's
path"): a request published from that thread on the
:class:`~.._transport.BlockingTransport`, and its reply waited for there, the thread
taking its turn to read the connection. The decisions are the link core's
(:class:`~._core.LinkCore`, shared with the loop's link of the same backend object):
the ``after`` barrier behind this link's fast puts, the announcements. The requests of
threads that call at once leave as one message (as the loop's outbox does), and a
request is resent with the same id on a new connection, or to a newly elected
scheduler, until the request timeout.

A :class:`~._thread_link.ThreadLink` sends a call this way once its loop's link was
answered once (a first call says, at once, what a URL's mistake or a namespace with no
scheduler is), and keeps to its loop the calls that need it: a reserve (its wait, the
candidacy it may start, its hold and late answers), an ``ack_many`` that sends the
next reserve ahead, and a queue's first call that must be configured.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ....errors import QueueClosed
from .._codec import pack, raise_error, unpack
from .._constants import RESEND_FOR
from .._transport import BlockingTransport, NoScheduler, OnReply
from ._core import ANNOUNCEMENTS, READS, LinkCore, take_group

__all__ = ["Direct"]


class _Call:
    """A request of a caller's thread: in the outbox until sent, then its reply."""

    __slots__ = ("body", "error", "kind", "op", "reply", "request_id", "sent")

    def __init__(self, op: str, request_id: str, body: bytes) -> None:
        self.op = op
        self.request_id = request_id
        self.body = body
        self.sent = False
        self.error: BaseException | None = None
        self.kind = ""
        self.reply: bytes | None = None


def _groups(waiting: list[_Call]) -> list[list[_Call]]:
    """``waiting`` cut into the runs that leave as one message each."""
    rest = list(waiting)
    groups = []
    while rest:
        groups.append(take_group(rest, lambda item: len(item.body)))
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
        no_reply: Callable[[str, bool, bool], NoScheduler],
    ) -> Direct | None:
        """The calls over the transport ``make(on_reply, on_elected)`` gives (None
        when it gives none). ``no_reply(op, may_have_run, sent)``: the error of a call
        that got no reply within ``request_timeout`` (``sent``: its request left)."""
        direct = cls(core, request_timeout, no_reply)
        transport = make(direct._on_reply, direct._on_elected)
        if transport is None:
            return None
        direct.transport = transport
        return direct

    def __init__(
        self,
        core: LinkCore,
        request_timeout: float,
        no_reply: Callable[[str, bool, bool], NoScheduler],
    ) -> None:
        self._core = core
        self._request_timeout = request_timeout
        self._no_reply = no_reply
        self._pending: dict[str, _Call] = {}
        #: Bumped by every scheduler elected: the calls waiting resend.
        self._elections = 0
        self._closed = False
        self._lock = threading.Lock()
        self._outbox: list[_Call] = []
        self._sending = threading.Lock()

    def call(self, op: str, args: list[Any]) -> Any:
        """Send ``op`` with ``args`` (no reserve) and return its decoded outcome, as
        :meth:`~._calls.Calls.call` does."""
        call = _Call(op, uuid.uuid4().hex, pack(args))
        self._pending[call.request_id] = call
        may_have_run = False
        unanswered_since = time.monotonic()
        # A change is not sent again past RESEND_FOR s (or the request timeout) since
        # its first send, as :meth:`~._calls.Calls._call` says.
        resend_until = float("inf")
        try:
            while True:
                elections = self._elections
                if time.monotonic() >= resend_until:
                    raise self._no_reply(op, may_have_run, True)
                deadline = min(unanswered_since + self._request_timeout, resend_until)
                sent = False
                try:
                    if self._closed:
                        raise QueueClosed("the queue was closed")
                    may_have_run = may_have_run or op not in READS
                    if may_have_run and resend_until == float("inf"):
                        resend_until = time.monotonic() + min(self._request_timeout, RESEND_FOR)
                    self._send(call, deadline)
                    sent = True
                    unanswered_since = time.monotonic()
                    deadline = unanswered_since + self._request_timeout
                    self.transport.wait(functools.partial(self._over, call, elections), deadline)
                except (ConnectionError, OSError) as exc:
                    # Resent on a new connection, until the request timeout.
                    if self._closed:
                        raise QueueClosed("the queue was closed") from None
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._no_reply(op, may_have_run, False) from exc
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
                    # opens a new one.
                    self.transport.close()
                    raise self._no_reply(op, may_have_run, True)
                unanswered_since = time.monotonic()  # a new scheduler: sent again
        finally:
            self._pending.pop(call.request_id, None)
            self._core.ended(call.request_id)
        kind, body = call.kind, unpack(call.reply)
        if kind != "ok":
            raise_error(kind, body)
        if op == "put":
            self._core.put_taken()
        outcome = self._core.answer(op, args, call.request_id, body)
        self._core.called(op, args, 0.0, outcome, True)
        return outcome

    def _over(self, call: _Call, elections: int) -> bool:
        """Whether ``call``'s wait is over: its reply came, a scheduler was elected
        since ``elections`` (it is sent again), or the link closed."""
        return call.reply is not None or self._elections != elections or self._closed

    def _send(self, call: _Call, deadline: float) -> None:
        """Publish ``call``'s request. The thread that takes the turn to send publishes
        every request waiting then (those of threads that called meanwhile), as one
        message up to MAX_GROUP_BYTES a message; a thread whose request it took finds
        it sent (or its error) once its own turn comes."""
        call.sent = False
        call.error = None
        with self._lock:
            self._outbox.append(call)
        with self._sending:
            if call.sent:
                if call.error is not None:
                    raise call.error
                return
            with self._lock:
                waiting, self._outbox = self._outbox, []
            try:
                self._publish(waiting, deadline)
            finally:
                # Interrupted: the requests of other threads not sent yet wait for the
                # next thread's turn.
                left = [item for item in waiting if not item.sent and item is not call]
                if left:
                    with self._lock:
                        self._outbox[:0] = left
        if call.error is not None:
            raise call.error

    def _publish(self, waiting: list[_Call], deadline: float) -> None:
        """Publish the requests ``waiting``, as few messages as MAX_GROUP_BYTES allows,
        each marked sent (with its error, if its message failed)."""
        ttl = int(min(self._request_timeout, RESEND_FOR) * 1000)
        for group in _groups(waiting):
            op, request_id, body = self._core.message(
                [(item.op, item.request_id, item.body) for item in group], self._pending
            )
            error: BaseException | None = None
            try:
                self.transport.request(op, request_id, body, ttl, deadline)
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
        if not request_id and kind in ANNOUNCEMENTS:
            # Taken by the loop's link, whose connection is read at once: this one is
            # read only while a call waits, so what it brings may be stale (a ``quiet``
            # the loop already saw undone by a ``nudge``).
            return
        call = self._pending.get(request_id)
        if call is not None and call.reply is None:
            self._core.replied(request_id)
            call.kind = kind
            call.reply = body
        # Else a second reply to a call answered (a resend both schedulers served):
        # no reserve goes this way, so nothing is to be given back.

    def _on_elected(self) -> None:
        self._elections += 1
        self._core.elected()

    def close(self) -> None:
        """Fail the calls in flight with QueueClosed and drop the connection."""
        self._closed = True
        self.transport.close()
