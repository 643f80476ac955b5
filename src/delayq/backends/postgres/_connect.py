"""What a first connection that failed says, in one line: :class:`ServerRefused`."""

from __future__ import annotations

import re

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ... import errors
from ..._redact import redact_url

__all__ = ["ServerRefused", "refused"]

#: libpq's words for a server that refused us, and ours; the first that matches wins.
_REASONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r'role "[^"]*" does not exist'), "{0}"),
    (re.compile(r'database "[^"]*" does not exist'), "{0}"),
    (re.compile(r'password authentication failed for user "[^"]*"'), "{0}"),
    (re.compile(r"no password supplied|password is required"), "the server needs a password"),
    (
        re.compile(r"server does not support SSL"),
        "the server does not support SSL (the URL asks for it: sslmode)",
    ),
    (re.compile(r"could not translate host name \"[^\"]*\""), "unknown host: {0}"),
)
#: libpq's words for a server that does not answer at all.
_SILENT = re.compile(r"Connection refused|timeout expired|No such file or directory|timed out")


class ServerRefused(errors.ServerRefused, psycopg.OperationalError):
    """The PostgreSQL server of a queue URL could not be used: it does not answer, or it
    refused the connection (an unknown role or database, a TLS the server lacks). The
    message names the URL (its password hidden) and the cause in plain words; psycopg's
    error is its ``__cause__``. It is a ``psycopg.OperationalError`` too, so that code
    (a Worker) that waits out an outage waits this one out as well."""


def refused(url: str, conninfo: str, exc: psycopg.Error) -> ServerRefused:
    """The :class:`ServerRefused` for ``exc``, raised by a connect to ``conninfo`` (the
    libpq form of ``url``)."""
    text = str(exc)
    for pattern, words in _REASONS:
        found = pattern.search(text)
        if found:
            reason = words.format(found.group(0))
            break
    else:
        if _SILENT.search(text):
            params = conninfo_to_dict(conninfo)
            host = params.get("host") or "localhost"
            port = params.get("port") or "5432"
            reason = f"the server is not answering at {host}:{port}"
        else:  # libpq's own words, past its "connection to server at ... failed:"
            last = text.strip().splitlines()[0].rsplit("failed:", 1)[-1]
            reason = last.replace("FATAL:", "").strip() or type(exc).__name__
    return ServerRefused(f"cannot use the queue at {redact_url(url)}: {reason}")
