"""The link's state transitions without I/O: no asyncio, no thread, no clock (each
step is given the time it needs). What a driver does with a connection (send, wait,
resend) stays with the driver; what it decides from what it holds is here, once for
every driver: what a first call says (a URL's mistake, a namespace where nobody stands
for election) and when it asks, a queue's ``configure`` before its first call, the
numbering of the intake messages and the read-your-writes barrier (``after``) the
requests carry behind them, the scheduler's announcements, the message a run of
requests leaves as, which late answer gives back what, and when a sequential
consumer's next reserve is sent ahead with its acks."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Container, Sequence
from typing import Any, TypeVar

from ...._redact import redact_url
from ....durable.message import Now, Record
from ....errors import SchedulerNotRunning
from .._codec import decode_outcome, decode_record, pack, reserve_items, unpack
from .._constants import MAX_GROUP_BYTES, QUIET_HOLD
from .._transport import ServerRefused

__all__ = [
    "AHEAD_KEPT",
    "ANNOUNCEMENTS",
    "READS",
    "LinkCore",
    "remember",
    "take_group",
    "unclaim",
]

#: The operations that change nothing: one that got no reply just failed (NoScheduler);
#: any other may have run (ReplyLost, an OutcomeUnknown).
READS = frozenset({"get", "stats", "peek", "dead", "queues", "due_counts", "sync"})

T = TypeVar("T")
#: How many answered (and abandoned) reserves a link remembers, for a late answer.
_REMEMBERED = 1024
#: A waiting reserve's ``(limit, lease_ms, wait)``.
Reserving = tuple[int, int, float | None]
#: The scheduler's announcements to every client (no request id).
ANNOUNCEMENTS = frozenset({"full", "quiet", "nudge"})
#: Seconds a reserve sent ahead keeps what it claimed for its caller's next reserve
#: (given back after: the caller is doing something else).
AHEAD_KEPT = 0.05


def remember(table: collections.OrderedDict[str, T], key: str, value: T) -> None:
    """Note ``key`` in ``table``, forgetting the oldest past :data:`_REMEMBERED`."""
    table[key] = value
    if len(table) > _REMEMBERED:
        table.popitem(last=False)


def take_group(
    waiting: list[T],
    size_of: Callable[[T], int],
    *,
    gone: Callable[[T], bool] | None = None,
    joins: Callable[[T, T], bool] | None = None,
    limit: int = MAX_GROUP_BYTES,
) -> list[T]:
    """Take from the front of ``waiting`` what leaves as one message: the first item,
    and those after it while their sizes stay within ``limit`` (and each ``joins``
    the first); the items ``gone`` (their callers gave up) are dropped on the way."""
    group: list[T] = []
    size = 0
    while waiting:
        item = waiting[0]
        if gone is not None and gone(item):
            del waiting[0]
            continue
        if group and (
            size + size_of(item) > limit or (joins is not None and not joins(group[0], item))
        ):
            break
        group.append(item)
        size += size_of(item)
        del waiting[0]
    return group


def unclaim(queue: str, record: Record) -> list[Any]:
    """The arguments of the ``release`` that gives back ``record`` of ``queue``, claimed
    for a caller that did not receive it: with ``unclaim`` set, the scheduler undoes
    the claim even if its lease has run out meanwhile (a caller's short lease, a late
    give-back), where a plain release would fail and leave the attempt charged."""
    return [queue, record.id, record.lease, True]


def _releases(queue: str, received: frozenset[str], kind: str, body: bytes) -> list[list[Any]]:
    """The releases (:func:`unclaim` each) of what a reserve's reply (``kind``,
    ``body``) claimed and its caller did not receive (leases ``received``)."""
    if kind not in ("ok", "held"):
        return []
    releases = []
    for item in reserve_items(kind, body):
        record = decode_record(item)
        if record.lease not in received:
            releases.append(unclaim(queue, record))
    return releases


class LinkCore:
    """What a link decides by itself, for every connection of its backend object (the
    sync face's two: its callers' threads' and its loop's). ``fast_put``: whether its
    puts may go through the intake (docs/rabbitmq.md, "Fast put"); ``url``: the queue
    URL its errors name; ``deliver``: the user's exchange and routing key its queues'
    messages are delivered to (None: none)."""

    def __init__(
        self, *, fast_put: bool, url: str = "", deliver: tuple[str, str] | None = None
    ) -> None:
        self._fast_put = fast_put
        self._url = url
        self._deliver = deliver
        #: Whether a connection of this backend object opened once (the namespace's
        #: objects are declared): until then, a connection that fails is a mistake of
        #: the URL more likely than an outage, said at once (:meth:`refused`).
        self.declared = False
        #: Whether a scheduler answered this backend object once (or announced itself).
        #: Until then, a call from a process that does not stand first asks the broker
        #: whether any process does (:meth:`asks_who_stands`): if none, none would
        #: answer it. After, a scheduler that does not answer is an outage, ridden out
        #: as ever (a broker's restart: the candidates come back after the clients).
        self.served = False
        #: The queues told where their messages are delivered (``configure``).
        self.configured: set[str] = set()
        #: This link's name in the intake, and its intake messages: the last numbered,
        #: the last confirmed, the last known folded (a reply to a request that waited
        #: behind it came back); the first ``after`` each request in flight was sent with.
        self.client = uuid.uuid4().hex
        self.intake_seq = 0
        self.confirmed_seq = 0
        self.folded_seq = 0
        self._barriers: dict[str, int] = {}
        #: Request id -> when (a monotonic time) the scheduler last said that the fold
        #: of the intake it waits behind advances (FOLDING): it waits for its reply a
        #: request timeout more from then.
        self.folding: dict[str, float] = {}
        #: Set by the scheduler's ``full`` announcement: puts take the plain path (which
        #: may refuse them) until one of them is taken.
        self.full = False
        #: Until when (a monotonic time) the scheduler said ``quiet``: no reserve waits,
        #: so a put due soon is not copied to it (the intake's tail brings it).
        self.quiet_until = 0.0
        #: Whose announcements count (None: the loop's link): a backend object that
        #: has two connections takes them from one, in the order it reads them (two
        #: connections' reads interleave: a ``quiet`` read late on one would undo the
        #: ``nudge`` after it read on the other).
        self.announcer: object | None = None
        #: Request id -> queue, of reserves their callers abandoned; and -> queue and the
        #: leases its caller got, of reserves answered: a late answer to either (a resend
        #: that a new scheduler served too) gives back what no caller received.
        self.forgotten: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.answered: collections.OrderedDict[str, tuple[str, frozenset[str]]] = (
            collections.OrderedDict()
        )
        #: Request id -> queue, of reserves in flight: a second answer that comes before
        #: its call took the first gives back what the first did not hand over.
        self.reserves: dict[str, str] = {}
        #: A sequential consumer's loop (docs/rabbitmq.md, "A reserve sent with the
        #: acks"): per queue, the ``(limit, lease_ms, wait)`` of the last call, when it
        #: was a waiting reserve that got messages.
        self.reserving: dict[str, Reserving] = {}
        #: How long the answer of a reserve sent ahead waits to be taken (AHEAD_KEPT).
        self.ahead_kept = AHEAD_KEPT

    @property
    def fast(self) -> bool:
        """Whether a put whose outcome nobody reads may go through the intake now."""
        return self._fast_put and not self.full

    # -- a first call ----------------------------------------------------------------

    def refused(self, exc: BaseException) -> ServerRefused:
        """``exc``, the failure of a connection while none ever opened, as the
        :class:`ServerRefused` every call raises at once (each tries again)."""
        if isinstance(exc, ServerRefused):
            return exc
        error = ServerRefused(f"cannot use the queue at {redact_url(self._url)}: {exc}")
        error.__cause__ = exc
        return error

    def asks_who_stands(self, sent_before: bool, candidate: bool) -> bool:
        """Whether a call asks the broker who stands for election before it is sent:
        its first send (``sent_before``: not), from a process that does not stand
        (``candidate``), while no scheduler ever answered; then it raises
        :meth:`not_running` at once when nobody stands."""
        return not (sent_before or candidate or self.served)

    def not_running(self) -> SchedulerNotRunning:
        """The error of a call that nothing would answer (nobody stands)."""
        return SchedulerNotRunning(
            f"cannot use the queue at {redact_url(self._url)}: no scheduler runs for its "
            "namespace (no delayq process stands for election): start one with `delayq "
            "scheduler --url URL` (a `delayq worker`, or a consumer waiting in a reserve, "
            "stands too)"
        )

    def to_configure(self, queue: str) -> list[Any] | None:
        """The arguments of the ``configure`` a call of ``queue`` sends first (its
        messages are delivered to a user's exchange, and it was not told yet), else
        None; :attr:`configured` once it was answered."""
        if self._deliver is None or queue in self.configured:
            return None
        return [queue, list(self._deliver)]

    @property
    def unfolded(self) -> bool:
        """Whether an intake message this link appended may not be folded yet."""
        return self.confirmed_seq > self.folded_seq

    # -- fast puts -------------------------------------------------------------------

    def next_intake(self, soon: bool, now: float) -> tuple[int, bool]:
        """Number the next intake message; and whether the scheduler gets a copy at
        once (``soon``: some fall due within FIRE_AHEAD_MS, and no ``quiet`` holds at
        ``now``, a monotonic time)."""
        self.intake_seq += 1
        return self.intake_seq, soon and now >= self.quiet_until

    def intake_body(self, seq: int, parts: list[Any], wall: float) -> bytes:
        """The intake message ``seq`` of ``parts`` (``[request id, queue, encoded
        requests]`` each), stamped with ``wall`` (epoch seconds), the moment it is sent."""
        now = Now.of_seconds(wall)
        return pack([self.client, seq, now.floor, now.ceil, parts])

    def intake_confirmed(self, seq: int) -> None:
        """The broker confirmed intake message ``seq``: this link's next requests wait
        for it at the scheduler."""
        self.confirmed_seq = max(self.confirmed_seq, seq)

    # -- requests --------------------------------------------------------------------

    def message(
        self, requests: Sequence[tuple[str, str, bytes]], pending: Container[str]
    ) -> tuple[str, str, bytes]:
        """``(op, request id, body)`` of the one message a run of ``requests`` (``(op,
        request id, body)`` each) leaves as: a lone request as itself, else a ``batch``,
        led by an ``after`` part while an intake message of this link may not be
        folded (read-your-writes: the scheduler holds the requests until it has). The
        barrier each request still ``pending`` was first sent behind is noted."""
        after = self.confirmed_seq if self.confirmed_seq > self.folded_seq else 0
        for _, request_id, _ in requests:
            if request_id in pending:
                self._barriers.setdefault(request_id, after)
        if len(requests) == 1 and not after:
            return requests[0]
        parts: list[list[Any]] = [["after", "", pack([self.client, after])]] if after else []
        parts += [[op, request_id, body] for op, request_id, body in requests]
        return "batch", uuid.uuid4().hex, pack(parts)

    def announced(self, request_id: str, kind: str, now: float, by: object = None) -> bool:
        """Whether a reply is the scheduler's announcement (then taken, when read by
        the :attr:`announcer` ``by``: ``full`` turns fast puts to the plain path;
        ``quiet``, at ``now`` a monotonic time, holds their copies to the scheduler for
        QUIET_HOLD; ``nudge`` lets them go)."""
        if request_id or kind not in ANNOUNCEMENTS:
            return False
        if by is not self.announcer:
            return True
        if kind == "full":
            self.full = self._fast_put
        else:
            self.quiet_until = now + QUIET_HOLD if kind == "quiet" else 0.0
        return True

    def replied(self, request_id: str) -> None:
        """A reply to a request in flight came: every send of it waited behind the
        intake message it was first sent after, which is so folded."""
        self.folded_seq = max(self.folded_seq, self._barriers.pop(request_id, 0))

    def ended(self, request_id: str) -> None:
        """A call is over (answered or not): its barrier is forgotten."""
        self._barriers.pop(request_id, None)
        self.reserves.pop(request_id, None)
        self.folding.pop(request_id, None)

    def told_folding(self, body: bytes, now: float, pending: Container[str]) -> None:
        """The scheduler's FOLDING word (``body``: the ids of requests it holds behind
        this link's intake messages while its fold of them advances), at ``now``, a
        monotonic time: noted for those of ``pending`` (calls in flight); a body that is
        no list of ids (no scheduler of delayq sends it) is ignored."""
        try:
            ids = unpack(body)
        except Exception:
            return
        if isinstance(ids, list):
            for request_id in ids:
                if isinstance(request_id, str) and request_id in pending:
                    self.folding[request_id] = now

    def folding_since(self, request_id: str, since: float) -> float | None:
        """When the scheduler last said, after ``since``, that ``request_id`` waits
        behind a fold that advances (None: it did not)."""
        told = self.folding.get(request_id)
        return told if told is not None and told > since else None

    def put_taken(self) -> None:
        """The scheduler took a plain put: there is room again for fast ones."""
        self.full = False

    def elected(self, by: object = None) -> None:
        """A scheduler was elected (read by ``by``): it says ``quiet`` again if no
        reserve waits."""
        if by is self.announcer:
            self.quiet_until = 0.0

    # -- late answers to reserves ----------------------------------------------------

    def forget(self, request_id: str, queue: str) -> None:
        """The caller of reserve ``request_id`` of ``queue`` gave it up: an answer
        that comes all the same is given back."""
        remember(self.forgotten, request_id, queue)

    def answer(self, op: str, args: list[Any], request_id: str, body: Any) -> Any:
        """The decoded outcome of a call; that of a reserve is remembered with its
        leases (a second answer to it gives back only what its caller did not get)."""
        outcome = decode_outcome(op, body)
        if op == "reserve":
            leases = frozenset(record.lease or "" for record in outcome)
            remember(self.answered, request_id, (args[0], leases))
        return outcome

    def give_back(self, request_id: str, kind: str, body: bytes) -> list[list[Any]]:
        """The releases (:func:`unclaim` each) a reply that no call waits for
        asks: a reserve abandoned by its caller was served after all, or one answered
        was served again (its resend reached a scheduler that did not know of the
        first answer); what its caller did not receive goes back."""
        queue = self.forgotten.pop(request_id, None)
        received: frozenset[str] = frozenset()
        if queue is None and request_id in self.answered:
            queue, received = self.answered[request_id]
        return [] if queue is None else _releases(queue, received, kind, body)

    def answered_again(
        self, request_id: str, first: tuple[str, bytes] | None, kind: str, body: bytes
    ) -> list[list[Any]]:
        """The releases a second answer to a reserve in flight asks when it comes before
        the call took the first (``(kind, body)``; None: the call failed), both in one
        turn of the loop (a resend served again): what the first did not hand over."""
        queue = self.reserves.get(request_id)
        if queue is None:
            return []
        received: frozenset[str] = frozenset()
        if first is not None and first[0] in ("ok", "held"):
            items = reserve_items(*first)
            received = frozenset(decode_record(item).lease or "" for item in items)
        return _releases(queue, received, kind, body)

    # -- a reserve sent with the acks ------------------------------------------------

    def ahead_of(self, op: str, args: list[Any], busy: bool) -> Reserving | None:
        """The reserve to send ahead with this call: with a sequential caller's
        ``ack_many`` (``busy``: no other call of the link in flight) when its last call
        was a waiting reserve of the queue that got messages; else None."""
        if op != "ack_many" or busy:
            return None
        return self.reserving.get(args[0])

    @staticmethod
    def takes_ahead(op: str, args: list[Any], wait: float | None, sent: tuple[int, int]) -> bool:
        """Whether the call ``op`` of ``args`` takes the answer of the reserve sent ahead
        of its queue with ``sent`` (its ``(limit, lease_ms)``): a waiting reserve with
        the same ones. Any other call gives that reserve up before it goes."""
        return op == "reserve" and wait != 0 and (args[1], args[2]) == sent

    def called(self, op: str, args: list[Any], wait: float | None, got: Any, busy: bool) -> None:
        """A call is over with ``got``: a waiting reserve that got messages, from a
        sequential caller (not ``busy``), is what its next ``ack_many`` sends again."""
        self.reserving.clear()
        if op == "reserve" and got and wait != 0 and not busy:
            self.reserving[args[0]] = (args[1], args[2], wait)
