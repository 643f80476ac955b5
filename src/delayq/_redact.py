"""Secrets kept out of what delayq prints, logs and raises: the password of a queue URL
and the values of its secret query parameters.

Both work on the text alone, with no URL parser: a URL that urllib, redis-py or libpq
refuse (a bracket left open, a bad port, a ``#`` or ``/`` in the password) is the
one whose error would otherwise show it. The userinfo is everything between
``scheme://`` and the last ``@`` (a password may hold ``@``, ``/``, ``?`` or ``#``
unescaped); when in doubt more is hidden, never less.
"""

from __future__ import annotations

import re

__all__ = ["HIDDEN", "redact_text", "redact_url"]

#: What a secret is replaced with.
HIDDEN = "***"

# A query parameter whose name says it holds a secret: password=, sslpassword=,
# auth_token=, api_key=, client_secret=... (redis-py, libpq, AMQP clients).
_SECRET_NAME = r"[\w.-]*(?:password|passwd|pwd|pass|secret|token|api_?key|credential)[\w.-]*"
_SECRET_IN_URL = re.compile(rf"(?i)((?:^|[?&;]){_SECRET_NAME}=)[^&]*")
_SECRET_IN_TEXT = re.compile(rf"(?i)(\b{_SECRET_NAME}=)[^&\s'\"]*")

# A URL inside a message: a scheme, ``://``, then up to a space or a quote (errors
# show a URL as its repr, in quotes).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]*")


def redact_url(url: object) -> str:
    """``url`` fit to print or log: its password (``user:***@``) and secret query
    parameters (``password=***``) hidden, the rest kept as given, whether or not it
    parses. Redis reads a lone userinfo as the password: ``redis://***@host``. Not
    a str: its type only."""
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _SECRET_IN_URL.sub(rf"\1{HIDDEN}", url)
    if not rest.startswith("/"):  # sqlite:///path has no userinfo, whatever its path holds
        userinfo, at, host = rest.rpartition("@")
        if at:
            user, colon, _ = userinfo.partition(":")
            if colon:
                rest = f"{user}:{HIDDEN}@{host}"
            elif scheme.lower().startswith("redis"):
                rest = f"{HIDDEN}@{host}"
    return f"{scheme}://" + _SECRET_IN_URL.sub(rf"\1{HIDDEN}", rest)


def redact_text(text: str) -> str:
    """``text`` (an error message, a log line) with every URL in it redacted as
    :func:`redact_url` does, and any ``password=...``-like pair outside them."""
    text = _URL_IN_TEXT.sub(lambda found: redact_url(found.group()), text)
    return _SECRET_IN_TEXT.sub(rf"\1{HIDDEN}", text)
