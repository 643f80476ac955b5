"""What a first use whose connection failed says, in one line: :class:`ServerRefused`.

A backend object's calls go through :class:`FirstUse` (:class:`AsyncFirstUse` on the
asyncio face) until one succeeds (on a sharded queue, one ``PING``, after the cluster's
map is read for ``redis+cluster://``): a failure that says the server cannot be used is
raised as :class:`ServerRefused`, naming the URL (its password hidden) and the cause in
plain words: the server is not answering, it needs a password, the password is wrong,
it is not a cluster, it does not speak TLS. Later failures are outages, raised as
redis-py's errors.

A plain Redis given a TLS handshake (``rediss://`` to a server without TLS) reads it as
an inline command without its end and waits for the rest, so the handshake would time
out after the connect timeout with no word of TLS. So, before it, a ``rediss://`` URL's
server is sent ``PING`` in clear text: a plain Redis answers it at once (``+PONG`` or
an error), a TLS server refuses the bytes (an alert, or it closes), and then the TLS
connection goes ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from types import TracebackType
from urllib.parse import parse_qsl, urlsplit

import redis

from ... import errors
from ..._redact import redact_url
from ..._timeout import within
from ._settings import REDIS_CONNECT_TIMEOUT
from ._url import Settings

__all__ = ["AsyncFirstUse", "FirstUse", "ServerRefused", "refused"]

#: How a Redis that speaks no TLS answers a ``PING`` in clear text.
_PLAIN_ANSWERS = (b"+", b"-")
#: How long the clear-text PING waits for the first byte of an answer (a plain Redis
#: answers at once; a TLS server refuses the bytes or waits for more).
_ANSWER_WAIT = 2.0
#: The most of that answer read (its first line names what answered).
_ANSWER_BYTES = 256
#: redis-py's and Redis's words, and ours; the first that matches wins.
_REASONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"WRONGPASS|invalid username-password pair|invalid password"),
        "authentication failed: the server refused the URL's user name and password",
    ),
    (
        re.compile(r"without any password configured"),
        "the server has no password for this user, but the URL gives one",
    ),
    (
        re.compile(
            r"NOAUTH|HELLO must be called with the client already authenticated|"
            r"[Aa]uthentication required|unauthenticated (multi)?bulk"
        ),
        "the server needs a password (the URL gives none)",
    ),
    (
        re.compile(r"[Cc]luster mode is not enabled|cluster support disabled"),
        "the server is not a cluster (cluster mode is off): use redis:// for a single node",
    ),
    (
        re.compile(r"Name or service not known|nodename nor servname|name resolution"),
        "unknown host: {host}",
    ),
    (
        re.compile(
            r"Connection refused|Connect call failed|Timeout connecting|timed out|"
            r"cannot be connected|No such file or directory|Connection reset"
        ),
        "the server is not answering at {where}",
    ),
)


class ServerRefused(errors.ServerRefused, redis.ConnectionError):
    """The Redis server of a queue URL could not be used at the first call: it does not
    answer, it needs a password or refused the one given, it is not a cluster for a
    ``redis+cluster://`` URL, or it does not speak TLS for a ``rediss://`` one. The
    message names the URL (its password hidden) and the cause in plain words; redis-py's
    error is its ``__cause__``. It is a ``redis.ConnectionError`` too, so that code (a
    Worker) that waits out an outage waits this one out as well."""


def _where(settings: Settings) -> str:
    """The address of the server, or of the cluster's nodes."""
    if settings.nodes:
        return ",".join(f"{host}:{port}" for host, port in settings.nodes)
    parts = urlsplit(settings.url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname}:{parts.port or 6379}"


def refused(url: str, settings: Settings, exc: BaseException) -> ServerRefused | None:
    """The :class:`ServerRefused` for ``exc``, raised by the first call of a backend of
    ``url``; None when ``exc`` is no refusal (an error reply of a script, a reply lost)."""
    known = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)
    if isinstance(exc, errors.DelayqError) or not isinstance(exc, known):
        return None
    text = " ".join(str(exc).split())
    host = urlsplit(settings.url).hostname or ""
    for pattern, words in _REASONS:
        if pattern.search(text):
            reason = words.format(host=host, where=_where(settings))
            break
    else:
        if isinstance(exc, redis.ResponseError) or not text:
            return None  # an error reply: the server answered
        reason = text
    return ServerRefused(f"cannot use the queue at {redact_url(url)}: {reason}")


def _plain_probe(settings: Settings) -> tuple[str, int, float] | None:
    """Host, port and connect timeout of a ``rediss://`` URL's server; None for another."""
    parts = urlsplit(settings.url)
    if parts.scheme != "rediss" or not parts.hostname:
        return None
    given = dict(parse_qsl(parts.query)).get("socket_connect_timeout")
    timeout = float(given) if given else REDIS_CONNECT_TIMEOUT
    return parts.hostname, parts.port or 6379, timeout


class _FirstUseBase:
    """What both faces share: the URL, and whether the server has answered."""

    def __init__(self, url: str, settings: Settings) -> None:
        self._url = url
        self._settings = settings
        self._probe = _plain_probe(settings)
        #: The server answered a first call: later failures are outages.
        self.answered = False

    def _silent(self) -> ServerRefused:
        """A ``rediss://`` server that did not answer within the connect timeout."""
        where = _where(self._settings)
        return ServerRefused(
            f"cannot use the queue at {redact_url(self._url)}: the server is not answering "
            f"at {where}"
        )

    def _check_answer(self, answer: bytes) -> None:
        """ServerRefused when ``answer``, to a clear-text PING, is a plain Redis's."""
        if answer[:1] not in _PLAIN_ANSWERS:
            return
        seen = answer.split(b"\r\n", 1)[0].decode("ascii", "replace")
        cause = redis.ConnectionError(f"a clear-text PING was answered: {seen}")
        where = _where(self._settings)
        raise ServerRefused(
            f"cannot use the queue at {redact_url(self._url)}: the server at {where} does "
            "not speak TLS (the URL asks for it: rediss://): is the server TLS? use "
            "redis:// for a server without it"
        ) from cause

    def _exit(self, exc: BaseException | None) -> None:
        if exc is None:
            self.answered = True
            return
        failure = refused(self._url, self._settings, exc)
        if failure is not None:
            raise failure from exc


class FirstUse(_FirstUseBase):
    """``with first_use:`` around a backend object's first call (see the module
    docstring)."""

    def __enter__(self) -> None:
        if self._probe is None:
            return
        host, port, timeout = self._probe
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError as exc:  # socket.timeout
            raise self._silent() from exc
        except OSError:
            return  # the TLS connection will say what is wrong
        with sock:
            try:
                sock.settimeout(min(timeout, _ANSWER_WAIT))
                sock.sendall(b"PING\r\n")
                answer = sock.recv(_ANSWER_BYTES)
            except OSError:  # a timeout too: a TLS server waiting for more
                return
        self._check_answer(answer)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exit(exc)


class AsyncFirstUse(_FirstUseBase):
    """:class:`FirstUse` for asyncio: ``async with first_use:``."""

    async def __aenter__(self) -> None:
        if self._probe is None:
            return
        host, port, timeout = self._probe
        try:
            reader, writer = await within(asyncio.open_connection(host, port), timeout)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise self._silent() from exc
        except OSError:
            return  # the TLS connection will say what is wrong
        try:
            writer.write(b"PING\r\n")
            answer = await within(reader.read(_ANSWER_BYTES), min(timeout, _ANSWER_WAIT))
        except (OSError, asyncio.TimeoutError):  # a TLS server waiting for more
            answer = b""
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._check_answer(answer)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exit(exc)
