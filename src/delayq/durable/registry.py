"""Queue URLs: which backend module serves which scheme, imported only when used.

``open_backend(url)`` / ``open_async_backend(url)`` find the scheme in
:data:`SCHEMES`, import ``delayq.backends.<module>`` and call its opener of the
same name (see :mod:`delayq.durable.backend`). :func:`outage_errors` says which
exceptions mean "the backend of a URL does not answer": the network's and timeouts,
and those its module lists as ``OUTAGE_ERRORS``.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from .._redact import redact_url
from ..errors import UnsupportedURL
from ._constants import DEFAULT_QUEUE_URL, QUEUE_URL_ENV

if TYPE_CHECKING:  # for annotations only: the queue faces import the registry
    from .backend import AsyncBackend, Backend

__all__ = [
    "BASE_OUTAGE_ERRORS",
    "SCHEMES",
    "consumer_options",
    "database_file",
    "default_url",
    "open_async_backend",
    "open_backend",
    "outage_errors",
    "redact_url",
    "register_scheme",
    "scheme_of",
]

#: URL scheme -> module (under ``delayq.backends`` unless it contains a dot).
SCHEMES: dict[str, str] = {
    "memory": "memory",
    "sqlite": "sqlite",
    "redis": "redis",
    "rediss": "redis",
    "redis+cluster": "redis",
    "redis+unix": "redis",
    "postgresql": "postgres",
    "postgres": "postgres",
    "amqp": "amqp",
    "amqps": "amqp",
}


def register_scheme(scheme: str, module: str) -> None:
    """Serve ``scheme://`` URLs with ``module`` (``"sqlite"`` means
    ``delayq.backends.sqlite``; a dotted name is imported as is)."""
    SCHEMES[scheme.lower()] = module


def default_url() -> str:
    """``$DELAYQ_URL`` when set and not empty, else ``sqlite:///delayq.db``."""
    return os.environ.get(QUEUE_URL_ENV) or DEFAULT_QUEUE_URL


def _supported() -> str:
    return ", ".join(f"{scheme}://" for scheme in SCHEMES)


def scheme_of(url: object) -> str:
    """The lower-cased scheme of ``url``; :class:`UnsupportedURL` if it is not a
    well-formed URL of a scheme delayq knows."""
    if not isinstance(url, str):
        raise UnsupportedURL(f"a queue URL is a str, not {type(url).__name__}")
    if "://" not in url:
        raise UnsupportedURL(
            f"malformed queue URL {redact_url(url)!r}: expected scheme://..., "
            f"one of the supported schemes: {_supported()}"
        )
    failure = None
    try:
        parts = urlsplit(url)
        if "," not in parts.netloc:  # a host list (cluster) is checked by its backend
            _ = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        failure = _parse_failure(exc)
    if failure is not None:  # raised here, so that urllib's error is not its context
        raise UnsupportedURL(f"malformed queue URL {redact_url(url)!r}: {failure}")
    scheme = parts.scheme.lower()
    if not scheme or scheme not in SCHEMES:
        raise UnsupportedURL(
            f"unsupported queue URL {redact_url(url)!r}: the supported schemes are {_supported()}"
        )
    return scheme


def _parse_failure(exc: ValueError) -> str:
    """What urllib found wrong, in words that quote no part of the URL: its messages
    quote the port or the host as it split them, which, when a password holds ``/``,
    ``#`` or ``?``, is a piece of the password."""
    text = str(exc)
    if text.startswith("Port out of range"):
        return "its port is not in 0-65535"
    if text.startswith("Port could not be cast"):
        return "its port is not a number (a '/', '?' or '#' in a password must be %-escaped)"
    if "IPv6" in text or "IPv4" in text:
        return "its bracketed host is not an IPv6 address, or a bracket is not closed"
    return "it does not parse as scheme://[user:password@]host[:port]/..."


def _module(url: str) -> Any:
    name = SCHEMES[scheme_of(url)]
    return importlib.import_module(name if "." in name else f"delayq.backends.{name}")


def open_backend(url: str, **options: Any) -> Backend:
    """Open the sync backend that serves ``url``."""
    return cast("Backend", _module(url).open_backend(url, **options))


def open_async_backend(url: str, **options: Any) -> AsyncBackend:
    """Open the async backend that serves ``url``."""
    return cast("AsyncBackend", _module(url).open_async_backend(url, **options))


#: What any backend raises when it does not answer: the network's errors and timeouts.
BASE_OUTAGE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncio.TimeoutError,  # not TimeoutError before Python 3.11
)


def outage_errors(url: str) -> tuple[type[Exception], ...]:
    """The exceptions that mean "the backend of ``url`` does not answer" (Redis down, a
    SQLite file locked or gone), not a bug of delayq: an outage to wait out, or a 503
    over HTTP, never a 500. :data:`BASE_OUTAGE_ERRORS` and the ``OUTAGE_ERRORS`` of the
    backend's module (imported for it; a module without that attribute adds none)."""
    own: tuple[type[Exception], ...] = getattr(_module(url), "OUTAGE_ERRORS", ())
    return BASE_OUTAGE_ERRORS + own


def consumer_options(url: str) -> dict[str, Any]:
    """Options with which a long-running consumer process (``delayq worker``, ``delayq
    serve``) opens the queues of ``url``, its startup check included: the backend
    module's ``CONSUMER_OPTIONS`` (``amqp://``: stand for the namespace's scheduler at
    once); none for a module without it."""
    return dict(getattr(_module(url), "CONSUMER_OPTIONS", {}))


def database_file(url: str) -> str | None:
    """The absolute path of the local file that holds the queues of ``url`` (the
    backend module's own ``database_file``: ``sqlite:///``), None for a backend that
    keeps no file; :class:`UnsupportedURL` for a malformed URL."""
    find = getattr(_module(url), "database_file", None)
    return None if find is None else cast(str, find(url))
