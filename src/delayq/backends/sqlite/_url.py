"""``sqlite:///`` URLs and options (documented in :mod:`.backend`)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..._duration import bounded_seconds
from ..._switch import switch
from ...durable.descriptor import check_url_options
from ...errors import UnsupportedURL
from ._constants import SQLITE_BUSY_TIMEOUT, SQLITE_POLL_INTERVAL, SQLITE_SYNCHRONOUS

__all__ = ["OPTIONS", "parse_url"]

#: The options a sqlite URL or ``Queue(...)`` keyword may set.
OPTIONS = frozenset({"busy_timeout", "synchronous", "poll_interval", "notify"})
_SYNCHRONOUS = ("off", "normal", "full", "extra")


def parse_url(url: str, **options: Any) -> tuple[str, dict[str, Any]]:
    """The absolute file path of a ``sqlite:///`` URL and its checked options
    (keyword ``options`` override the URL's query). :class:`UnsupportedURL` for a
    malformed URL, :class:`TypeError`/:class:`ValueError` for a bad option."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite":
        raise UnsupportedURL(f"not a sqlite:// URL: {url!r}")
    if parts.netloc:
        raise UnsupportedURL(
            f"a sqlite URL has no host: sqlite:///relative.db or sqlite:////abs.db, not {url!r}"
        )
    path = unquote(parts.path)[1:]
    if not path:
        raise UnsupportedURL(f"the sqlite URL {url!r} names no file: sqlite:///path/to/file.db")
    if path == ":memory:" or path.startswith("file:"):
        raise UnsupportedURL(
            f"{url!r}: an in-memory SQLite database is private to one connection, so "
            "it cannot hold a queue; use memory:// or a file path"
        )
    given: dict[str, Any] = dict(parse_qsl(parts.query, keep_blank_values=True))
    check_url_options(url, given, OPTIONS)
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise TypeError(f"unknown sqlite option(s): {', '.join(unknown)}")
    given.update(options)
    checked = {
        "busy_timeout": bounded_seconds(
            "busy_timeout", given.get("busy_timeout", SQLITE_BUSY_TIMEOUT), 3600.0
        ),
        "poll_interval": bounded_seconds(
            "poll_interval", given.get("poll_interval", SQLITE_POLL_INTERVAL), 1.0
        ),
        "synchronous": str(given.get("synchronous", SQLITE_SYNCHRONOUS)).lower(),
        "notify": switch("notify", given.get("notify", True)),
    }
    if checked["synchronous"] not in _SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {', '.join(_SYNCHRONOUS)}")
    return os.path.abspath(path), checked
