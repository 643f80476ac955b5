"""What the replicated backend needs of a broker: the one part written per broker
(``delayq.backends.amqp``'s is RabbitMQ's). Everything else of the backend, the
scheduler and the client, is generic and talks to a broker only through this."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import NamedTuple, Protocol

from ... import errors
from ...durable.message import Record
from ...errors import NoScheduler, OutcomeUnknown

__all__ = [
    "BlockingTransport",
    "Delivery",
    "LogEntry",
    "LogFull",
    "NoScheduler",
    "Refused",
    "ReplyLost",
    "ServerRefused",
    "Transport",
]


class ReplyLost(OutcomeUnknown, NoScheduler):
    """A change was sent and no reply came in time: a scheduler may have applied it
    (its reply lost on the way) or not. Its resends carried the same request id, so it
    ran at most once; it is not sent again after this. A :class:`NoScheduler` too, so
    what rides out an outage rides out this."""


class Refused(Exception):
    """The broker refused the connection for a reason no retry mends: a certificate
    that does not verify, credentials it rejects, a TLS file that cannot be read. A
    call raises :attr:`reason` (the broker library's own error) at once instead of
    riding it out as an outage until its request timeout."""

    def __init__(self, reason: BaseException) -> None:
        super().__init__(str(reason))
        self.reason = reason


class ServerRefused(errors.ServerRefused, ConnectionError):
    """The broker of a queue URL could not be used on the first connection: it does not
    answer, or it refused the connection (a wrong user name or password, a virtual host
    that does not exist). The message names the URL (its password hidden) and the cause
    in plain words; the broker library's error is its ``__cause__``. Raised within the
    connect timeout by every call until a connection opens; a ``ConnectionError`` too,
    so that code (a Worker) that waits out an outage waits this one out as well."""


class LogFull(OSError):
    """The scheduler refused a put: the live messages' images would outgrow a quarter
    of the log's retention, which could then drop the last image of a live message (an
    outage to the caller: it passes once messages are acked, cancelled or purged)."""


class LogEntry(NamedTuple):
    """An entry of the log as a reader receives it."""

    offset: int
    kind: str
    reign: str
    mark: str
    """``begin:<id>`` / ``end:<id>`` on the entry that holds a checkpoint's first or last
    operation, else empty: what a reader looks for without unpacking the body."""
    body: bytes


class Delivery(NamedTuple):
    """A request as the scheduler receives it."""

    op: str
    request_id: str
    reply_to: str
    body: bytes


#: ``on_reply(request_id, kind, body)``: a reply arrived in the client's inbox (or an
#: announcement other than ``elected``: kind ``full``, the scheduler folded a fast put
#: past the live bytes' limit, request id "").
OnReply = Callable[[str, str, bytes], None]
#: ``on_put(offset, body)``: an intake message, as the scheduler tails the intake.
OnIntake = Callable[[int, bytes], None]


class BlockingTransport(Protocol):
    """One connection for the sync face's calls, used from its callers' threads (each
    blocks on it; :class:`~._link.ThreadLink`): requests and their replies, and the
    intake's appends, and a first call's question of who stands for election.
    Opened on first use, again after one failed, each time declaring the namespace's
    objects (the transport that made it may never open). The threads share it:
    :meth:`wait` reads it in turns, and ``on_reply`` / ``on_elected`` (given when it
    was made, as to :meth:`Transport.open`) are called by the thread reading. Every ``deadline`` is
    a ``time.monotonic()``."""

    def connect(self, deadline: float) -> None:
        """Open the connection unless it is open, declaring the namespace's objects
        as :meth:`Transport.open` does (a backend object whose calls all go this way
        opens no other); ConnectionError or OSError (TimeoutError past ``deadline``)
        when it cannot, said as :meth:`Transport.open` says it (a
        :class:`ServerRefused`, a :class:`Refused`)."""

    def candidates(self, deadline: float) -> int:
        """As :meth:`Transport.candidates`, opening the connection if need be;
        ConnectionError or OSError (TimeoutError past ``deadline``) when the broker
        did not say."""

    def request(
        self, op: str, request_id: str, body: bytes, ttl_ms: int | None, deadline: float
    ) -> None:
        """As :meth:`Transport.request`, returning once it is sent."""

    def append(self, body: bytes, *, nudge: bool, deadline: float) -> None:
        """As :meth:`Transport.append_intake`, blocking until the broker confirmed it;
        ConnectionError or OSError (TimeoutError past ``deadline``) when it was not,
        the connection then dropped (the next call opens another)."""

    def wait(self, done: Callable[[], bool], until: float) -> None:
        """Block until ``done()`` (checked whenever something came) or ``until``;
        ConnectionError once the connection is lost."""

    @property
    def opened(self) -> int:
        """How many connections it opened: a reply comes on the connection its request
        left on, so one awaited while nobody read (a reserve sent ahead) will not come
        once this has changed."""

    def poll(self) -> None:
        """Hand out what came already (to ``on_reply`` / ``on_elected``), without
        waiting and without opening a connection; nothing when a thread is reading
        (it hands out what comes). A failure drops the connection, silently."""

    def close(self) -> None:
        """Drop the connection, if any (a thread waiting on it wakes)."""


class Transport(Protocol):
    """One connection to the broker, shared by a process's client and, when elected,
    its scheduler. Every coroutine runs on the loop that called :meth:`open`."""

    async def open(
        self, on_reply: OnReply, on_elected: Callable[[], None], on_lost: Callable[[], None]
    ) -> None:
        """Connect, declare the namespace's objects, and listen on the client's inbox
        (replies) and for announcements of a new scheduler; ``on_lost`` once the
        connection is gone. ``ConnectionError`` (an outage, retried; a
        :class:`ServerRefused` that says why, when the broker can tell) or
        :class:`Refused` (not retried) when it cannot."""

    async def candidates(self) -> int:
        """How many processes stand for election in the namespace now (0: none, and so
        no scheduler answers a request, nor will until one stands)."""

    async def request(self, op: str, request_id: str, body: bytes, ttl_ms: int | None) -> None:
        """Send a request to the elected scheduler (its reply is the receipt: one
        that no scheduler took may be dropped, and is resent when a scheduler
        announces itself, or fails as :class:`NoScheduler` after its timeout; a
        transport may raise NoScheduler at once when it knows). ``ttl_ms``: how long
        it may wait for one (None: as long as it takes)."""

    async def campaign(self, on_token: Callable[[], None]) -> None:
        """Stand for election: ``on_token`` when this process is elected."""

    @property
    def retention_bytes(self) -> int:
        """The log's size retention in bytes (0: none): the scheduler keeps the live
        images under a quarter of it and checkpoints often enough."""

    @property
    def namespace(self) -> str:
        """The namespace this transport serves (its prefix: a shard's, ``<prefix>.<k>``,
        when the namespace has shards), as the scheduler's log lines name it."""

    async def append(self, kind: str, reign: str, body: bytes, mark: str = "") -> None:
        """Append one entry to the log, returning once the broker has confirmed it
        (replicated); an error when it was not."""

    def read_log(self, start: int | None, *, few: bool = False) -> AsyncIterator[LogEntry]:
        """Every entry of the log from offset ``start`` (None: its first; an offset the
        log no longer holds: its first too, which the caller sees), waiting for new
        ones at the end (the caller stops reading). ``few``: the caller reads only a
        few entries (the broker sends few ahead)."""

    async def append_intake(self, body: bytes, *, nudge: bool = False) -> None:
        """Append a client's fast puts to the intake (a log of its own, read by the
        scheduler only), returning once the broker has confirmed it (replicated); an
        error when it was not. With ``nudge`` (something falls due within
        FIRE_AHEAD_MS), the elected scheduler, if any, also gets the message as a
        request of op ``puts`` as soon as the broker can (a hint: the intake's copy
        is the one that counts), by the same publish."""

    def blocking(
        self, on_reply: OnReply, on_elected: Callable[[], None]
    ) -> BlockingTransport | None:
        """A connection of its own for the sync face's callers' threads, or None when
        the broker offers none: the sync face then calls through the loop thread."""

    async def tail_intake(
        self,
        start: int | None,
        on_put: OnIntake,
        on_marker: Callable[[bytes], None],
        on_gap: Callable[[int, int], None],
    ) -> None:
        """Deliver every intake message from offset ``start`` on (None: the intake's
        first), and each new one as it is appended, to ``on_put``, until the connection
        closes; the body of each marker :meth:`mark_intake` appended, to ``on_marker``;
        ``on_gap(expected, found)`` when the intake no longer holds the messages from
        offset ``expected`` (its retention dropped them before they were read) and goes
        on at ``found``. Returns once every message appended before the call was
        delivered."""

    async def mark_intake(self, body: bytes) -> None:
        """Append a marker to the intake (confirmed), read back by :meth:`tail_intake`."""

    async def warn_full(self) -> None:
        """Tell every client that the live images are past their limit: fast puts
        fall back to the plain path (which can refuse them with :class:`LogFull`)."""

    async def tell_nudges(self, wanted: bool) -> None:
        """Tell every client whether a fast put due soon should be copied to the
        scheduler (``nudge``: a reserve waits) or not (``quiet``)."""

    async def read_pointer(self) -> bytes | None:
        """The last checkpoint pointer published (None: none found)."""

    async def point(self, body: bytes) -> None:
        """Publish a checkpoint pointer, returning once the broker confirmed it."""

    async def serve(self, on_request: Callable[[Delivery], None]) -> None:
        """Take the namespace's requests from now on, and the copies of the intake
        messages appended with ``nudge`` (op ``puts``, no request id nor reply)."""

    async def reply(
        self, reply_to: str, request_id: str, kind: str, body: bytes, *, confirm: bool
    ) -> bool:
        """Send a reply. With ``confirm``, return once the broker says whether its
        client got it (False: the client is gone); without, return once it is sent
        (True)."""

    async def deliver(
        self, exchange: str, routing_key: str, queue: str, record: Record
    ) -> str | None:
        """Publish ``record``'s payload to a user's ``exchange`` with ``routing_key``,
        persistent, returning once the broker confirmed it: None, or why it was not
        taken (no queue bound, refused), for the record's ``last_error``."""

    async def announce(self, reign: str) -> None:
        """Tell every client that a scheduler was elected (they resend what is pending)."""

    async def renew(self) -> None:
        """Keep the election held (called every few minutes by the scheduler)."""

    async def close(self) -> None:
        """Close the connection (a scheduler so stops being one)."""
