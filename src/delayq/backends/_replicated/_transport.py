"""What the replicated backend needs of a broker: the one part written per broker
(``delayq.backends.amqp``'s is RabbitMQ's). Everything else of the backend, the
scheduler and the client, is generic and talks to a broker only through this."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import NamedTuple, Protocol

from ...durable.message import Record

__all__ = ["Delivery", "NoScheduler", "Refused", "Transport"]


class NoScheduler(OSError):
    """No scheduler took a request: none is elected, or it did not answer in time (an
    outage: a consumer rides it out)."""


class Refused(Exception):
    """The broker refused the connection for a reason no retry mends: a certificate
    that does not verify, credentials it rejects, a TLS file that cannot be read. A
    call raises :attr:`reason` (the broker library's own error) at once instead of
    riding it out as an outage until its request timeout."""

    def __init__(self, reason: BaseException) -> None:
        super().__init__(str(reason))
        self.reason = reason


class Delivery(NamedTuple):
    """A request as the scheduler receives it."""

    op: str
    request_id: str
    reply_to: str
    body: bytes


#: ``on_reply(request_id, kind, body)``: a reply arrived in the client's inbox.
OnReply = Callable[[str, str, bytes], None]


class Transport(Protocol):
    """One connection to the broker, shared by a process's client and, when elected,
    its scheduler. Every coroutine runs on the loop that called :meth:`open`."""

    async def open(
        self, on_reply: OnReply, on_elected: Callable[[], None], on_lost: Callable[[], None]
    ) -> None:
        """Connect, declare the namespace's objects, and listen on the client's inbox
        (replies) and for announcements of a new scheduler; ``on_lost`` once the
        connection is gone. ``ConnectionError`` (an outage, retried) or
        :class:`Refused` (not retried) when it cannot."""

    async def request(self, op: str, request_id: str, body: bytes, ttl_ms: int | None) -> None:
        """Send a request to the elected scheduler; :class:`NoScheduler` when none
        is there to take it. ``ttl_ms``: how long it may wait for one (None: as long
        as it takes)."""

    async def campaign(self, on_token: Callable[[], None]) -> None:
        """Stand for election: ``on_token`` when this process is elected."""

    async def append(self, kind: str, reign: str, body: bytes) -> None:
        """Append one entry to the log, returning once the broker has confirmed it
        (replicated); an error when it was not."""

    def read_log(self) -> AsyncIterator[tuple[str, str, bytes]]:
        """Every entry of the log from its first, as ``(kind, reign, body)``, waiting
        for new ones at the end (the caller stops reading)."""

    async def serve(self, on_request: Callable[[Delivery], None]) -> None:
        """Take the namespace's requests from now on."""

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
