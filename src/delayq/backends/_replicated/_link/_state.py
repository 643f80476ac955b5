"""What a :class:`~._loop_link.LoopLink` holds (its connection, the calls in flight,
its intake messages' numbers, the reserves sent ahead, its tasks), the steps every
concern shares (a task, the error of a call that got no reply), and the seams between
the modules that each take one concern of it (:class:`LinkState`)."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, NamedTuple, TypeVar

from ....errors import QueueClosed
from .._constants import CLOSE_SETTLE
from .._scheduler import Scheduler
from .._transport import BlockingTransport, NoScheduler, OnReply, Refused, ReplyLost, Transport
from ._core import LinkCore

__all__ = ["NO_REPLY_HINT", "Candidacy", "FastPut", "LinkState", "Outgoing", "T"]

#: What a call that got no reply says when its process does not stand for election: the
#: likeliest cause is that nothing does (a producer's first hour).
NO_REPLY_HINT = (
    "no reply from a scheduler (none may run for this namespace: `delayq scheduler`, "
    "`delayq worker` or a queue opened with scheduler=on runs one)"
)

T = TypeVar("T")
#: Who stands for election: ``on`` at once, ``auto`` once this backend object runs a
#: waiting reserve (a consumer, never a pure producer), ``off`` never.
Candidacy = Literal["auto", "on", "off"]


class FastPut(NamedTuple):
    """A fast put waiting for the link's intake append."""

    request_id: str
    queue: str
    requests: list[Any]  # encoded PutRequests
    size: int  # their payloads' bytes
    soon: bool  # some fall due within FIRE_AHEAD_MS: the scheduler gets a copy at once
    appended: asyncio.Future[None]


class Outgoing(NamedTuple):
    """A request in the outbox, until the link's drain task publishes it."""

    transport: Transport
    op: str
    request_id: str
    body: bytes
    ttl: int | None
    sent: asyncio.Future[None]  # resolved once published (an exception: it was not)


class LinkState(abc.ABC):
    """The state every concern of the link works on, and the seams: what each
    concern's module offers the others, declared here so that none imports another."""

    def __init__(
        self,
        make_transport: Callable[[], Transport],
        *,
        scheduler: Candidacy,
        request_timeout: float,
        deliver: tuple[str, str] | None = None,
        fast_put: bool = False,
        url: str = "",
        standby: bool = False,
    ) -> None:
        self._make_transport = make_transport
        #: What the link decides without I/O: a first call's errors, whether it asks who
        #: stands, its intake numbering and barriers, the announcements, late answers,
        #: the reserve sent ahead.
        self._core = LinkCore(fast_put=fast_put, url=url, deliver=deliver)
        self._intake: list[FastPut] = []
        self._appending = False
        self._candidacy = scheduler
        #: Whether this link stood for election once (``on``: it stands at its first
        #: connection, which a ThreadLink's first call opens before it goes).
        self._stood = False
        self._request_timeout = request_timeout
        self._transport: Transport | None = None
        self._counting: tuple[Transport, asyncio.Task[int]] | None = None
        self._opening: asyncio.Task[Transport] | None = None
        #: Done once this link is closed (made on its loop by the first connect).
        self._closed_signal: asyncio.Future[None] | None = None
        #: Request id -> the future of its reply: kind, body and the loop's time it came.
        self._pending: dict[str, asyncio.Future[tuple[str, bytes, float]]] = {}
        #: The reserve sent ahead with a sequential consumer's ``ack_many`` (the core's
        #: ``reserving``), until the caller's next call takes or drops it.
        self._ahead: dict[str, tuple[int, int, asyncio.Task[tuple[Any, float | None]]]] = {}
        self._turn: asyncio.Future[None] | None = None
        self._candidate = False
        self._scheduler: Scheduler | None = None
        #: Whether a candidate folds the log while it waits (a hot standby), and that
        #: scheduler, not elected yet.
        self._standby_hot = standby
        self._standby: Scheduler | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The tasks giving back what a reserve claimed for a caller that will not take
        #: it (a subset of ``_tasks``): a close lets them finish before it cuts calls.
        self._giving: set[asyncio.Task[Any]] = set()
        self._publishing = False
        self._outbox: list[Outgoing] = []
        #: Connections being closed after they were given up (a close waits for them).
        self._closing: set[asyncio.Task[None]] = set()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def fast(self) -> bool:
        """Whether a put whose outcome nobody reads may go through the intake now."""
        return self._core.fast

    @property
    def core(self) -> LinkCore:
        """What the link decides without I/O (a :class:`ThreadLink` numbers the fast
        puts it appends from its callers' threads there)."""
        return self._core

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _spawn_giving(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self._spawn(coro)
        self._giving.add(task)
        task.add_done_callback(self._giving.discard)

    @property
    def request_timeout(self) -> float:
        return self._request_timeout

    @property
    def close_settle(self) -> float:
        """How long each step of a close waits for the broker (CLOSE_SETTLE, or the
        request timeout if shorter)."""
        return min(CLOSE_SETTLE, self._request_timeout)

    @property
    def standing(self) -> bool:
        """Whether this process stands for election on this link's connection now."""
        return self._candidate

    @property
    def candidacy(self) -> Candidacy:
        """Whether this link stands for election: ``on``, ``off``, or ``auto`` (once it
        runs a waiting reserve)."""
        return self._candidacy

    def blocking(
        self, on_reply: OnReply, on_elected: Callable[[], None]
    ) -> BlockingTransport | None:
        """A connection for the callers' threads (:meth:`Transport.blocking`; None:
        the transport has none)."""
        return self._make_transport().blocking(on_reply, on_elected)

    def stands_first(self, op: str, wait: float | None) -> bool:
        """Whether this process stands for election before the call ``op`` goes: with
        the ``on`` candidacy, before its first call; with ``auto``, before a waiting
        reserve while it does not stand. See :meth:`stand_for`."""
        if self._candidacy == "on":
            return not self._stood
        waits = op == "reserve" and (wait is None or wait > 0)
        return waits and self._candidacy == "auto" and not self._candidate

    async def stand_for(self) -> None:
        """Stand for election on this link's connection, as a waiting reserve of the
        loop does before it is sent (a consumer: its process may run the scheduler)."""
        if self._closed:
            raise QueueClosed("the queue is closed")
        try:
            await self._stand()
        except Refused as exc:
            raise exc.reason from exc.reason.__cause__
        except Exception:
            if self._closed:
                raise QueueClosed("the queue was closed") from None
            raise

    def no_answer(
        self, op: str, may_have_run: bool, sent: bool, seconds: float | None = None
    ) -> NoScheduler:
        """The error of a call from a caller's thread that got no reply in time
        (``sent``: its request left; ``seconds``: how long it waited, None: the request
        timeout), as :meth:`_call` says it."""
        if not sent:
            return self._no_reply(op, may_have_run, "no scheduler answered")
        what = "no reply" if self._candidate else NO_REPLY_HINT
        return self._no_reply(op, may_have_run, what, seconds)

    def no_reply(self, op: str, may_have_run: bool, what: str) -> NoScheduler:
        """See :meth:`_no_reply`."""
        return self._no_reply(op, may_have_run, what)

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

    # -- the seams: each is defined by the module named above it ---------------------

    # _election.py

    @abc.abstractmethod
    async def _connected(self) -> Transport:
        raise NotImplementedError

    @abc.abstractmethod
    async def _connected_within(self, seconds: float) -> Transport:
        raise NotImplementedError

    @abc.abstractmethod
    async def _stands(self, transport: Transport, seconds: float) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    async def _stand(self) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _abandon(self, transport: Transport) -> None:
        raise NotImplementedError

    # _calls.py

    @abc.abstractmethod
    def _on_reply(self, request_id: str, kind: str, body: bytes) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    async def _call(self, op: str, args: list[Any], wait: float | None) -> tuple[Any, float | None]:
        raise NotImplementedError

    @abc.abstractmethod
    async def _configure(self, queue: str) -> None:
        raise NotImplementedError

    # _ahead.py

    @abc.abstractmethod
    async def _take_ahead(
        self, op: str, args: list[Any], wait: float | None
    ) -> tuple[Any, float | None] | None:
        raise NotImplementedError

    @abc.abstractmethod
    def _send_ahead(self, queue: str) -> None:
        raise NotImplementedError

    # _outbox.py

    @abc.abstractmethod
    async def _request(
        self, transport: Transport, op: str, request_id: str, body: bytes, ttl: int | None
    ) -> None:
        raise NotImplementedError
