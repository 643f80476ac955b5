"""``redis://`` and ``rediss://`` URLs and options (documented in :mod:`.backend`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..._constants import REDIS_DEFAULT_PREFIX
from ...errors import UnsupportedURL

__all__ = ["OPTIONS", "Settings", "parse_url"]

#: The options a redis URL or ``Queue(...)`` keyword may set (beyond redis-py's own URL
#: parameters, which pass through).
OPTIONS = frozenset({"prefix"})
_SCHEMES = ("redis", "rediss")


@dataclass(frozen=True)
class Settings:
    """A parsed redis URL: the URL redis-py connects with and delayq's options."""

    url: str
    prefix: str


def parse_url(url: str, **options: Any) -> Settings:
    """Check a ``redis://host:port/db`` URL and the options. :class:`UnsupportedURL`
    for a malformed URL, :class:`TypeError`/:class:`ValueError` for a bad option.

    ``prefix`` (URL parameter or keyword) starts every key; other URL parameters are
    redis-py's (``socket_timeout``, ``max_connections``, ...)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in _SCHEMES:
        raise UnsupportedURL(f"not a redis:// or rediss:// URL: {url!r}")
    if not parts.hostname:
        raise UnsupportedURL(f"a redis URL names a host: redis://host:port/db, not {url!r}")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise UnsupportedURL(f"the path of a redis URL is a database number, not {path!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
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
    rest = urlencode([(key, value) for key, value in query if key not in OPTIONS])
    clean = urlunsplit((parts.scheme.lower(), parts.netloc, parts.path, rest, ""))
    return Settings(url=clean, prefix=prefix)
