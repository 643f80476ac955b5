"""The exceptions delayq raises; every one of them is a :class:`DelayqError`."""

from __future__ import annotations

from ._redact import redact_text

__all__ = [
    "BackendNotInstalled",
    "DelayqError",
    "DuplicateId",
    "LeaseLost",
    "NoScheduler",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "QueueClosed",
    "SchedulerNotRunning",
    "ServerRefused",
    "UnsupportedURL",
]


class DelayqError(Exception):
    """Base class of every error delayq raises on purpose."""


class QueueClosed(DelayqError):
    """The queue was closed: no more puts, and no more gets once it is empty."""


class DuplicateId(DelayqError):
    """A message with this id exists and ``on_conflict="error"`` (or it is in flight).
    ``id`` is that id (None when unknown)."""

    def __init__(self, message: str, id: str | None = None) -> None:
        super().__init__(message)
        self.id = id


class LeaseLost(DelayqError):
    """The lease on a reserved message expired or was superseded; nothing was changed."""


class OutcomeUnknown(DelayqError):
    """A change was sent to the backend and its answer never came (the connection
    failed or timed out after the request was written): it may or may not have taken
    effect, and delayq did not send it again (a second run could store a message twice
    or ack one that another consumer now holds). ``operation`` names what was sent
    (``"put"``, ``"ack"``, ``"reserve"``...).

    A put can be retried safely with its own ``id=`` (``on_conflict="ignore"``, the
    default, keeps the message a first run stored); an ack or nack whose fate is
    unknown can be left to the lease, which expires if it did not run. The backend's
    connection error is its ``__cause__``; the Redis backend raises it as a subclass of
    redis-py's ``ConnectionError`` or ``TimeoutError`` too, so code that catches those
    catches it as before."""

    def __init__(self, message: str, operation: str | None = None) -> None:
        super().__init__(message)
        self.operation = operation


class PayloadTooLarge(DelayqError, ValueError):
    """The serialized payload is larger than the queue's size limit."""


class UnsupportedURL(DelayqError, ValueError):
    """The queue URL is malformed or names a backend delayq does not have. Its
    message shows the URL with its password and secret parameters hidden
    (:func:`~delayq.durable.registry.redact_url`), whoever raised it."""

    def __init__(self, message: str) -> None:
        super().__init__(redact_text(str(message)))


class BackendNotInstalled(DelayqError):
    """The client library of the URL's backend is not installed. The message says which
    extra installs it (``pip install 'delayq[redis]'``); the ``ModuleNotFoundError`` is
    its ``__cause__``. ``extra`` is that extra (None for a module Python lacks)."""

    def __init__(self, message: str, extra: str | None = None) -> None:
        super().__init__(redact_text(str(message)))
        self.extra = extra


class ServerRefused(DelayqError):
    """The server of a queue URL could not be used at the first call: it does not
    answer, or it refused the connection (a wrong password, an unknown database, user
    or virtual host, TLS on one side only, not a cluster). The message is one line that
    names the URL (its password hidden) and the cause in plain words, the same on every
    face; the client library's error is its ``__cause__``. Each backend raises a
    subclass that is also its client library's connection error (a
    ``psycopg.OperationalError``, a ``redis.ConnectionError``, a ``ConnectionError``),
    so that code that waits out an outage (a Worker) waits this one out as well."""


class NoScheduler(DelayqError, OSError):
    """A call to a replicated backend (``amqp://``) got no answer from its namespace's
    elected scheduler: none is elected, or it did not answer within the request timeout
    (an outage: a consumer rides it out). An ``OSError``, as the backend's other
    outages are."""


class SchedulerNotRunning(NoScheduler):
    """A call to a replicated backend needs the answer of its namespace's elected
    scheduler, and no delayq process stands for election there, so none would answer:
    the call was not sent (nothing ran). Known at once, where the call would otherwise
    wait out its request timeout. The message says how to run one (``delayq scheduler
    --url URL``; a ``delayq worker``, or any queue that waits in a reserve, stands
    too)."""
