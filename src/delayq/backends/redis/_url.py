"""``redis://``, ``rediss://``, ``redis+unix://`` and ``redis+cluster://`` URLs and
options (documented in :mod:`._async.backend`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...durable.descriptor import check_url_options
from ...errors import UnsupportedURL
from ._settings import REDIS_DEFAULT_PREFIX

__all__ = ["CLIENT_OPTIONS", "OPTIONS", "TLS_OPTIONS", "Settings", "parse_url", "url_options"]

#: The options a redis URL or ``Queue(...)`` keyword may set (beyond redis-py's own URL
#: parameters, which pass through).
OPTIONS = frozenset({"prefix", "shards"})
#: The parameters of redis-py that a ``redis://`` or ``redis+unix://`` URL may pass to
#: its connections; ``rediss://`` takes the TLS ones too. A ``redis+cluster://`` URL
#: takes delayq's options alone (its clients are made from its nodes).
CLIENT_OPTIONS = frozenset(
    {
        "db",
        "username",
        "password",
        "client_name",
        "protocol",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "health_check_interval",
        "max_connections",
    }
)
TLS_OPTIONS = frozenset(
    {
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_cert_reqs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
    }
)
_SCHEMES = ("redis", "rediss")
_CLUSTER = "redis+cluster"
#: A Unix domain socket: ``redis+unix://[user:password@]/path/to/redis.sock[?db=N]``,
#: which redis-py spells ``unix://``.
_UNIX = "redis+unix"
#: More shards than this is a mistake (each costs a listener connection per consumer).
MAX_SHARDS = 1024


@dataclass(frozen=True)
class Settings:
    """A parsed redis URL: the URL redis-py connects with and delayq's options.

    ``nodes`` is empty for a single node, else the cluster's startup nodes."""

    url: str
    prefix: str
    shards: int = 1
    nodes: tuple[tuple[str, int], ...] = ()

    @property
    def cluster(self) -> bool:
        """True for ``redis+cluster://``."""
        return bool(self.nodes)


def _shards(value: Any) -> int:
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise ValueError(f"shards must be a whole number, got {value!r}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"shards must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_SHARDS:
        raise ValueError(f"shards must be between 1 and {MAX_SHARDS}, got {value}")
    return value


def _nodes(url: str, netloc: str) -> tuple[tuple[str, int], ...]:
    """The ``host:port`` list of a ``redis+cluster://`` URL."""
    nodes = []
    for item in netloc.rpartition("@")[2].split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise UnsupportedURL(f"a redis+cluster URL lists host:port,..., not {url!r}")
        nodes.append((host.strip("[]"), int(port)))
    return tuple(nodes)


def url_options(scheme: str) -> frozenset[str]:
    """The query parameters a URL of ``scheme`` (lower case) may carry."""
    if scheme == _CLUSTER:
        return OPTIONS
    if scheme == "rediss":
        return OPTIONS | CLIENT_OPTIONS | TLS_OPTIONS
    return OPTIONS | CLIENT_OPTIONS


def parse_url(url: str, **options: Any) -> Settings:
    """Check a ``redis://host:port/db`` URL and the options. :class:`UnsupportedURL`
    for a malformed URL, :class:`TypeError`/:class:`ValueError` for a bad option.

    ``prefix`` (URL parameter or keyword) starts every key; other URL parameters are
    redis-py's (:func:`url_options`: ``socket_timeout``, ``max_connections``, ...),
    any other is :class:`UnsupportedURL`."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    cluster = scheme == _CLUSTER
    if scheme not in _SCHEMES and not cluster and scheme != _UNIX:
        raise UnsupportedURL(
            f"not a redis://, rediss://, redis+unix:// or redis+cluster:// URL: {url!r}"
        )
    nodes = _nodes(url, parts.netloc) if cluster else ()
    query = parse_qsl(parts.query, keep_blank_values=True)
    check_url_options(url, (key for key, _ in query), url_options(scheme))
    if scheme == _UNIX:
        if parts.hostname or parts.port or not parts.path.strip("/"):
            raise UnsupportedURL(
                f"a redis+unix URL names a socket file: redis+unix:///path/to/redis.sock"
                f"?db=0, not {url!r}"
            )
        db = dict(query).get("db", "0")
        if not db.isdigit():
            raise UnsupportedURL(f"the db of a redis+unix URL is a number, not {db!r}")
        scheme = "unix"  # redis-py's name for it
    else:
        if not cluster and not parts.hostname:
            raise UnsupportedURL(f"a redis URL names a host: redis://host:port/db, not {url!r}")
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise UnsupportedURL(f"the path of a redis URL is a database number, not {path!r}")
    given = {key: value for key, value in query if key in OPTIONS}
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise TypeError(f"unknown redis option(s): {', '.join(unknown)}")
    given.update(options)
    prefix = given.get("prefix", REDIS_DEFAULT_PREFIX)
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix or "{" in prefix or "}" in prefix:
        raise ValueError(f"prefix must be a non-empty str without braces, got {prefix!r}")
    shards = _shards(given.get("shards", 1))
    rest = urlencode([(key, value) for key, value in query if key not in OPTIONS])
    if scheme == "unix":  # urlunsplit would drop the empty host: unix:/path
        clean = f"unix://{parts.netloc}{parts.path}" + (f"?{rest}" if rest else "")
    else:
        clean = urlunsplit((scheme, parts.netloc, parts.path, rest, ""))
    return Settings(url=clean, prefix=prefix, shards=shards, nodes=nodes)
