"""The transport boundary: what delayq asks of redis-py's connections, and what a lost
connection raises.

delayq's own connections (:mod:`._link`, :mod:`._link_async`, and the listeners'
``Blocking`` / ``AsyncBlocking`` of :mod:`._io`) are redis-py ``Connection`` objects made from
a pool's ``connection_class`` and ``connection_kwargs`` (TCP or unix socket, TLS, AUTH,
SELECT, RESP version and timeouts are the URL's, as redis-py applies them) and used
through their public methods only: ``connect``, ``can_read``, ``pack_command``,
``send_command`` / ``send_packed_command``, ``read_response``, ``disconnect``; on
those, delayq writes each command itself, so it knows whether one was written.

The calls that go through redis-py's clients (the sharded faces, the EVALSHA and RESP3
fallbacks) cannot know it from outside: there delayq gives the clients, through their
constructors' ``connection_class=``, a subclass of redis-py's connection class that
overrides ``send_packed_command`` to mark the write and then calls redis-py's own
(:func:`._resend.tracked`); the asyncio ``RedisCluster``, whose constructor takes no
``connection_class``, gets it in the keyword arguments it makes its nodes from
(:class:`._clients._AsyncCluster`). That is what delayq relies on in redis-py beyond its
calls, checked at both ends of the supported range (``make test-redis-low``).
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...errors import OutcomeUnknown
from ._settings import (
    REDIS_CONNECT_TIMEOUT,
    REDIS_LISTEN_SLACK,
    REDIS_LISTEN_TIMEOUT,
    REDIS_SOCKET_TIMEOUT,
)

__all__ = [
    "CONNECTION_ERRORS",
    "LISTEN_ERRORS",
    "LOST_CONNECTION",
    "ReplyLost",
    "ReplyTimeout",
    "async_connection_settings",
    "client_options",
    "connection_settings",
    "outcome_unknown",
    "unreachable",
]

#: What a lost or unreachable Redis raises.
LOST_CONNECTION = (redis.ConnectionError, redis.TimeoutError, OSError)
#: What a lost, unreachable or recovering Redis raises: also a cluster that says it is
#: down (CLUSTERDOWN, until every slot is served again after a restart) or a slot that
#: redis-py's view of the cluster does not cover yet. None of them ran the command.
CONNECTION_ERRORS = (
    *LOST_CONNECTION,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
)


class ReplyLost(OutcomeUnknown, redis.ConnectionError):
    """A script's connection failed after it was written: it may have run."""


class ReplyTimeout(OutcomeUnknown, redis.TimeoutError):
    """A script's reply did not come within the socket timeout: it may have run."""


#: What the operations are called in :class:`OutcomeUnknown` (the rest by their script).
_OPERATIONS = {"put_one": "put"}


def outcome_unknown(exc: BaseException, script: str) -> OutcomeUnknown:
    """The error of a call of ``script`` that was written and then failed with ``exc``
    (raise it ``from exc``)."""
    operation = _OPERATIONS.get(script, script)
    timed_out = isinstance(exc, redis.TimeoutError | TimeoutError)
    kind = ReplyTimeout if timed_out else ReplyLost
    return kind(
        f"{operation} was sent to Redis but its reply was lost ({exc}): it may or may"
        " not have taken effect, and it was not sent again",
        operation,
    )


def unreachable(exc: BaseException, sent: bool) -> bool:
    """Whether ``exc`` says the server cannot be reached: a connect (or a look at an
    idle connection) that timed out before anything was sent. Such a call is not tried
    again at once: a server that does not answer a connect within the connect timeout
    will not answer the next one sooner, and each try would add a connect timeout to
    the caller's wait (a refused or reset connect, as during a restart, is retried)."""
    return not sent and isinstance(exc, redis.TimeoutError | TimeoutError)


#: What a listener rides out by connecting again: a lost connection, or bytes that are
#: no Redis reply (another service now answering at the address, as after a failover
#: or a network change; redis-py drops such a connection).
LISTEN_ERRORS = (*CONNECTION_ERRORS, redis.exceptions.InvalidResponse)


def connection_settings(url: str, **options: Any) -> tuple[Any, dict[str, Any]]:
    """The connection class and keyword arguments redis-py makes a connection of
    ``url`` with (a URL parameter overrides ``options``), without redis-py's retries
    (the callers retry, as they know what was sent)."""
    return _settings(url, asynchronous=False, **options)


def async_connection_settings(url: str, **options: Any) -> tuple[Any, dict[str, Any]]:
    """:func:`connection_settings` of an asyncio connection."""
    return _settings(url, asynchronous=True, **options)


def _settings(url: str, *, asynchronous: bool, **options: Any) -> tuple[Any, dict[str, Any]]:
    """The connection class and keyword arguments redis-py makes a connection of
    ``url`` with (a URL parameter overrides ``options``), without redis-py's retries
    (the callers retry, as they know what was sent)."""
    pool_class: Any = redis.asyncio.ConnectionPool if asynchronous else redis.ConnectionPool
    retry: Any = AsyncRetry(NoBackoff(), 0) if asynchronous else Retry(NoBackoff(), 0)
    pool = pool_class.from_url(url, **{"retry": retry, **options})
    return pool.connection_class, dict(pool.connection_kwargs)


def client_options(listener: bool) -> dict[str, Any]:
    """redis-py keyword arguments (a URL parameter overrides them)."""
    if listener:
        return {
            "socket_timeout": REDIS_LISTEN_TIMEOUT + REDIS_LISTEN_SLACK,
            "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
        }
    return {
        "socket_timeout": REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
    }
