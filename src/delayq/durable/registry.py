"""Queue URLs: which backend module serves which scheme, imported only when used.

``open_backend(url)`` / ``open_async_backend(url)`` find the scheme in
:data:`SCHEMES`, import ``delayq.backends.<module>`` and call its opener of the
same name (see :mod:`delayq.durable.backend`). A backend that is not written yet
is listed with ``None`` so the error can say so.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any, cast
from urllib.parse import urlsplit

from ..errors import UnsupportedURL
from ._constants import DEFAULT_QUEUE_URL, QUEUE_URL_ENV
from .backend import AsyncBackend, Backend

__all__ = [
    "SCHEMES",
    "default_url",
    "open_async_backend",
    "open_backend",
    "redact_url",
    "register_scheme",
    "scheme_of",
]

#: URL scheme -> module (under ``delayq.backends`` unless it contains a dot), or None
#: for a backend delayq will have but does not have yet.
SCHEMES: dict[str, str | None] = {
    "memory": "memory",
    "sqlite": "sqlite",
    "redis": "redis",
    "rediss": "redis",
    "redis+cluster": "redis",
    "redis+unix": "redis",
    "postgresql": None,
    "postgres": None,
    "amqp": None,
    "amqps": None,
}


# A query parameter whose value is a secret (redis-py takes password=..., TLS key
# passphrases and the like).
_SECRET_PARAMETER = re.compile(
    r"(?i)([?&](?:password|passwd|pass|pwd|secret|token|ssl_password|api_key)=)[^&#]*"
)


def redact_url(url: str) -> str:
    """``url`` fit to print or log: its password (``user:***@``) and secret query
    parameters (``password=***``) hidden, the rest kept as given."""
    if not isinstance(url, str):
        return repr(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _SECRET_PARAMETER.sub(r"\1***", url)
    authority_end = len(rest)
    for mark in "/?#":
        found = rest.find(mark)
        if found != -1:
            authority_end = min(authority_end, found)
    authority, tail = rest[:authority_end], rest[authority_end:]
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        authority = f"{user}:***@{host}" if colon else f"{user}@{host}"
        if not colon and user and scheme.startswith("redis"):
            # redis://secret@host: redis-py reads a lone userinfo as the password.
            authority = f"***@{host}"
    return f"{scheme}://{authority}" + _SECRET_PARAMETER.sub(r"\1***", tail)


def register_scheme(scheme: str, module: str | None) -> None:
    """Serve ``scheme://`` URLs with ``module`` (``"sqlite"`` means
    ``delayq.backends.sqlite``; a dotted name is imported as is)."""
    SCHEMES[scheme.lower()] = module


def default_url() -> str:
    """``$DELAYQ_URL`` when set and not empty, else ``sqlite:///delayq.db``."""
    return os.environ.get(QUEUE_URL_ENV) or DEFAULT_QUEUE_URL


def _supported() -> str:
    return ", ".join(f"{scheme}://" for scheme, module in SCHEMES.items() if module)


def scheme_of(url: object) -> str:
    """The lower-cased scheme of ``url``; :class:`UnsupportedURL` if it is not a
    well-formed URL of a scheme delayq knows."""
    if not isinstance(url, str):
        raise UnsupportedURL(f"a queue URL is a str, not {type(url).__name__}")
    if "://" not in url:
        raise UnsupportedURL(
            f"malformed queue URL {url!r}: expected scheme://..., "
            f"one of the supported schemes: {_supported()}"
        )
    try:
        parts = urlsplit(url)
        if "," not in parts.netloc:  # a host list (cluster) is checked by its backend
            _ = parts.port  # raises ValueError on a bad port
    except ValueError as exc:
        raise UnsupportedURL(f"malformed queue URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if not scheme or scheme not in SCHEMES:
        raise UnsupportedURL(
            f"unsupported queue URL {url!r}: the supported schemes are {_supported()}"
        )
    if SCHEMES[scheme] is None:
        raise UnsupportedURL(
            f"the {scheme}:// backend is not yet available; "
            f"the supported schemes are {_supported()}"
        )
    return scheme


def _module(url: str) -> Any:
    name = cast(str, SCHEMES[scheme_of(url)])
    return importlib.import_module(name if "." in name else f"delayq.backends.{name}")


def open_backend(url: str, **options: Any) -> Backend:
    """Open the sync backend that serves ``url``."""
    return cast(Backend, _module(url).open_backend(url, **options))


def open_async_backend(url: str, **options: Any) -> AsyncBackend:
    """Open the async backend that serves ``url``."""
    return cast(AsyncBackend, _module(url).open_async_backend(url, **options))
