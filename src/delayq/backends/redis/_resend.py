"""When a call is sent again: the one retry rule of the Redis backend, for delayq's own
links (:mod:`._link`, :mod:`._link_async`) and for the redis-py clients (the sharded
faces, the EVALSHA and RESP3 fallbacks, ``queues()``) alike.

Every call goes through one loop, :func:`~._io._async.retry.call_async` (its sync twin
``call`` is generated from it), which runs one :class:`Attempt` after another, with
backoff, up to :data:`REDIS_RETRIES` retries, as :func:`again` decides: a call is sent
again only when that is harmless,

* the script is in :data:`~._scripts.RESEND_SAFE` (its second run changes nothing), or
* the script was surely not run: the failure came before it was written to a socket
  (connecting, the look at an idle connection), or the write itself failed with a
  connection error (Redis runs only complete commands; a write that timed out may still
  complete, so it counts as sent), or the server answered that it ran nothing
  (``LOADING`` while a restarted server reads its data, ``CLUSTERDOWN``, a slot not
  covered);

a script that was written, may have run and may not run twice raises
:class:`~delayq.errors.OutcomeUnknown`; a connect that timed out, a refused password or
user, and the last retry raise the error as it is.

"Written" is known where the command is written. The links write it themselves and
mark the attempt. redis-py's clients are made without redis-py's own retries
(:func:`no_retry`: its ``Retry`` sends any command again after a connection error, even
one whose reply was lost after the server ran it) and with a connection class of
delayq's (:func:`tracked`, given to redis-py's constructors as ``connection_class=``):
a subclass of the class the URL calls for whose ``send_packed_command`` marks the
caller's :class:`Attempt` when it writes a script command (``FCALL``, ``EVALSHA``,
``EVAL``); the attempt travels in a context variable, so each thread and each task has
its own. Other commands an attempt may send (a handshake, ``SCRIPT LOAD``, a cluster's
slot refresh) are harmless and do not count. That subclass overrides one public method
of redis-py's connection classes and calls the original: the one place where delayq
rides on redis-py's classes rather than only calling them (see :mod:`._transport`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.exceptions
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from ._settings import REDIS_RETRIES, REDIS_RETRY_BASE, REDIS_RETRY_CAP
from ._transport import (
    CONNECTION_ERRORS,
    async_connection_settings,
    connection_settings,
    outcome_unknown,
    unreachable,
)

__all__ = [
    "ATTEMPT",
    "BACKOFF",
    "RETRIABLE",
    "AsyncSend",
    "Attempt",
    "Send",
    "again",
    "async_tracked_client",
    "no_retry",
    "no_retry_async",
    "not_cancelled",
    "tracked",
    "tracked_client",
]

T = TypeVar("T")

#: Errors after which a call may be sent again (when :func:`again` allows).
RETRIABLE = CONNECTION_ERRORS
#: Errors that say the command did not run, sent or not.
_RAN_NOTHING = (
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
)
#: Errors no retry mends.
_FINAL = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)
_SCRIPT_COMMANDS = frozenset((b"FCALL", b"FCALL_RO", b"EVALSHA", b"EVALSHA_RO", b"EVAL"))


class Attempt:
    """One try of a call: whether a script command was written for it."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


#: The current attempt of this thread or task (for :func:`tracked` connections).
ATTEMPT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "delayq_redis_attempt", default=None
)
#: One try of a call: sends it, marking the attempt when the script is written.
Send = Callable[[Attempt], T]
#: :data:`Send` for a coroutine function.
AsyncSend = Callable[[Attempt], Awaitable[T]]


def _writes_script(command: Any) -> bool:
    """Whether a packed command (bytes, or a list of chunks whose first holds the
    command name) is a script call."""
    head = command if isinstance(command, bytes | bytearray | str) else next(iter(command), b"")
    if isinstance(head, str):
        head = head.encode()
    parts = bytes(head[:64]).split(b"\r\n", 3)  # b"*N", b"$len", b"NAME", ...
    return len(parts) > 2 and parts[2].upper() in _SCRIPT_COMMANDS


class _SyncMarks:
    """Mixin of a sync redis-py connection: marks the attempt when a script is written."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        attempt = ATTEMPT.get()
        send = super().send_packed_command  # type: ignore[misc]
        if attempt is None or attempt.sent or not _writes_script(command):
            send(command, check_health)
            return
        self.connect()  # type: ignore[attr-defined]  # failures here sent nothing
        if check_health:
            self.check_health()  # type: ignore[attr-defined]
        attempt.sent = True
        try:
            send(command, False)
        except redis.ConnectionError:
            attempt.sent = False  # the socket failed under the write: incomplete
            raise


class _AsyncMarks:
    """:class:`_SyncMarks` for asyncio connections, which also replace a connection the
    server closed while it sat idle (a cluster node's pool does not look)."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        attempt = ATTEMPT.get()
        send = super().send_packed_command  # type: ignore[misc]
        if attempt is None or attempt.sent or not _writes_script(command):
            await send(command, check_health)
            return
        this: Any = self
        # can_read (redis-py 8), can_read_destructive before it: the same question.
        can_read = getattr(this, "can_read", None) or this.can_read_destructive
        if this.is_connected and await can_read():
            await this.disconnect()  # end of file or stray bytes: not ready to send
        await this.connect()
        if check_health:
            await this.check_health()
        attempt.sent = True
        try:
            await send(command, False)
        except redis.ConnectionError:
            attempt.sent = False
            raise


@cache
def tracked(base: type[Any]) -> type[Any]:
    """The subclass of connection class ``base`` that marks script writes."""
    asynchronous = issubclass(base, redis.asyncio.connection.AbstractConnection)
    mixin: type[Any] = _AsyncMarks if asynchronous else _SyncMarks
    return type(f"Tracked{base.__name__}", (mixin, base), {})


def no_retry() -> Retry:
    """A redis-py ``Retry`` that never retries (the retries happen here)."""
    return Retry(NoBackoff(), 0)


def no_retry_async() -> AsyncRetry:
    """:func:`no_retry` for asyncio clients."""
    return AsyncRetry(NoBackoff(), 0)


def tracked_client(url: str, **options: Any) -> Any:
    """A redis-py ``Redis`` of the single node at ``url`` (see :func:`_tracked_client`)."""
    return _tracked_client(url, asynchronous=False, **options)


def async_tracked_client(url: str, **options: Any) -> Any:
    """An asyncio ``Redis`` of the single node at ``url`` (see :func:`_tracked_client`)."""
    return _tracked_client(url, asynchronous=True, **options)


def _tracked_client(url: str, *, asynchronous: bool, **options: Any) -> Any:
    """A redis-py client (``Redis``, or asyncio's) of the single node at ``url``, without
    redis-py's retries, made with the :func:`tracked` subclass of the connection class
    the URL calls for (``connection_class=``); ``options``: redis-py's keyword arguments
    (a URL parameter overrides them)."""
    settings = async_connection_settings if asynchronous else connection_settings
    base, _ = settings(url, **options)
    if asynchronous:
        return redis.asyncio.Redis.from_url(
            url, retry=no_retry_async(), connection_class=tracked(base), **options
        )
    return redis.Redis.from_url(url, retry=no_retry(), connection_class=tracked(base), **options)


def again(exc: BaseException, attempt: Attempt, safe: bool, failures: int, operation: str) -> bool:
    """Whether to send a call again after ``exc``, its ``failures``-th failure;
    ``safe``: it may run twice; :class:`~delayq.errors.OutcomeUnknown` (``operation``
    names it) when it was sent, may have run, and may not run twice."""
    maybe_ran = attempt.sent and not isinstance(exc, _RAN_NOTHING)
    if maybe_ran and not safe:
        raise outcome_unknown(exc, operation) from exc
    if failures > REDIS_RETRIES or isinstance(exc, _FINAL) or unreachable(exc, attempt.sent):
        return False
    return safe or not maybe_ran


#: How long to wait before the next attempt.
BACKOFF = ExponentialBackoff(REDIS_RETRY_CAP, REDIS_RETRY_BASE)


def _cancel_requests() -> int:
    """How many cancellations of the current task are pending (0 before Python 3.11)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return int(cancelling()) if cancelling is not None else 0


async def not_cancelled(call: Awaitable[T]) -> T:
    """``await call``, a call through redis-py, raising ``CancelledError`` when the
    task was cancelled meanwhile: redis-py sends with ``asyncio.wait_for``, which before
    Python 3.12 returns the result and drops a cancel that comes as the send completes
    (the script ran, as for any call cancelled in flight)."""
    cancels = _cancel_requests()
    result = await call
    if _cancel_requests() > cancels:
        raise asyncio.CancelledError
    return result
