"""``postgresql://`` URLs and options (documented in :mod:`delayq.backends.postgres`)."""

from __future__ import annotations

import functools
import re
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Conninfo

from ..._duration import bounded_seconds
from ..._switch import switch
from ...durable.descriptor import check_url_options
from ...errors import UnsupportedURL

__all__ = [
    "DEFAULT_SCHEMA",
    "OPTIONS",
    "Settings",
    "check_schema",
    "libpq_parameters",
    "parse_url",
]

#: Where delayq's tables live when the URL names no ``schema``.
DEFAULT_SCHEMA = "delayq"
#: How often a waiting consumer looks for others' puts with ``notify=off``, seconds.
POLL_INTERVAL = 0.5
#: How long a waiting consumer sleeps at most with LISTEN, seconds: a re-check in case
#: a notification was lost (none should be), bounded to one cheap query per interval.
SAFETY_INTERVAL = 30.0
#: Connections of a backend object's pool at most (the LISTEN connection is its own),
#: opened as concurrent calls need them: 16 producers putting at once each have one,
#: so their commits share WAL flushes instead of queueing for a connection.
POOL_SIZE = 16
#: The application_name delayq's sessions show in pg_stat_activity, unless the URL
#: gives one.
APPLICATION_NAME = "delayq"

#: How long a call waits for a connection of the pool, seconds: all in use, or none can
#: be made (a server that does not answer a connect), it raises ``PoolTimeout``.
POOL_TIMEOUT = 10.0
#: libpq parameters delayq sets unless the URL gives them, so that a call to a server
#: that stops answering without closing (a partition, a dead host) fails in bounded
#: time instead of waiting for the kernel (~15 min): a connect fails after
#: ``connect_timeout`` s; a request or reply not acknowledged by the server's host
#: within ``tcp_user_timeout`` ms fails; an idle connection (the LISTEN one, a query
#: the server is still running) is probed after ``keepalives_idle`` s of silence, every
#: ``keepalives_interval`` s, and dropped after ``keepalives_count`` unanswered probes
#: (or the user timeout). A slow query is not cut short: the server's host answers
#: the probes. Ignored on a unix socket.
TIMEOUTS = {
    "connect_timeout": "5",
    "tcp_user_timeout": "10000",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
}

#: The options a postgresql URL's query or ``Queue(...)`` keyword may set; every other
#: query parameter goes to libpq as is (sslmode, application_name, connect_timeout...).
OPTIONS = frozenset({"schema", "notify", "poll_interval", "pool_size", "pool_timeout"})
_SCHEMES = ("postgresql", "postgres")
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")


class Settings(NamedTuple):
    """A parsed URL: libpq's connection string and delayq's own options."""

    conninfo: str
    schema: str
    notify: bool
    poll_interval: float
    pool_size: int
    pool_timeout: float


def parse_url(url: str, **options: Any) -> Settings:
    """The checked settings of a ``postgresql://`` URL (keyword ``options`` override
    its query). :class:`UnsupportedURL` for a malformed URL or a parameter libpq does
    not know, :class:`TypeError`/:class:`ValueError` for a bad option. No I/O."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in _SCHEMES:
        raise UnsupportedURL(f"not a postgresql:// URL: {url!r}")
    own: dict[str, Any] = {}
    passed: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in OPTIONS:
            own[key] = value
        else:
            passed.append((key, value))
    check_url_options(
        url,
        (key for key, _ in passed),
        OPTIONS,
        more=libpq_parameters(),
        more_are="libpq's connection parameters (sslmode, connect_timeout...)",
    )
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise TypeError(f"unknown postgresql option(s): {', '.join(unknown)}")
    own.update(options)
    given = {key for key, _ in passed}
    defaults = {"application_name": APPLICATION_NAME, **TIMEOUTS}
    passed += [(key, value) for key, value in defaults.items() if key not in given]
    # By hand: urlunsplit drops the "//" of an empty host (postgresql:///db, a socket).
    conninfo = f"postgresql://{parts.netloc}{parts.path}?{urlencode(passed)}"
    try:
        conninfo_to_dict(conninfo)  # libpq's own parser: a malformed host list or value
    except psycopg.Error as exc:
        raise UnsupportedURL(f"malformed postgresql URL: {str(exc).strip()}") from None
    return Settings(
        conninfo=conninfo,
        schema=check_schema(own.get("schema", DEFAULT_SCHEMA)),
        notify=switch("notify", own.get("notify", True)),
        poll_interval=bounded_seconds(
            "poll_interval", own.get("poll_interval", POLL_INTERVAL), 60.0
        ),
        pool_size=_count("pool_size", own.get("pool_size", POOL_SIZE), 1000),
        pool_timeout=bounded_seconds("pool_timeout", own.get("pool_timeout", POOL_TIMEOUT), 3600.0),
    )


@functools.cache
def libpq_parameters() -> frozenset[str]:
    """The connection parameters the libpq in use knows (a URL's query may set them)."""
    return frozenset(option.keyword.decode() for option in Conninfo.get_defaults())


def check_schema(schema: object) -> str:
    """``schema`` if it may name delayq's schema, else :class:`ValueError`."""
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(
            "schema must be a lower-case SQL name of at most 48 characters "
            f"(letters, digits, _; not starting with a digit), not {schema!r}"
        )
    return schema


def _count(name: str, value: object, high: int) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 1 <= value <= high:
        raise ValueError(f"{name} must be from 1 to {high}, got {value}")
    return value
