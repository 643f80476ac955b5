"""What a connection to RabbitMQ that failed says: in one line
(:class:`~.._replicated.ServerRefused`) a mistake of the URL, and as
:class:`~.._replicated.Refused` what no retry mends; the same for aiormq's connections
and the sync face's own (:mod:`._blocking`)."""

from __future__ import annotations

import logging
import socket
import ssl
from urllib.parse import unquote, urlsplit

import aiormq

from ..._redact import redact_url
from .._replicated import Refused, ServerRefused
from ._wire import BrokerClosed

__all__ = ["connect_error", "final", "quiet_connect_errors", "refused"]

#: The broker's reply codes to a login it refused, and to a virtual host it refused.
_ACCESS_REFUSED = 403
_NOT_ALLOWED = 530


def _where(broker_url: str) -> tuple[str, str, str]:
    """``host:port``, the user and the virtual host of one of the URL's brokers (as
    aiormq reads them)."""
    parts = urlsplit(broker_url)
    port = parts.port or (5671 if parts.scheme.lower() == "amqps" else 5672)
    path = parts.path
    vhost = "/" if path in ("", "/") else unquote(path[1:])
    return f"{parts.hostname}:{port}", unquote(parts.username or "guest"), vhost


def _reason(broker_urls: tuple[str, ...], exc: BaseException) -> str | None:
    """The cause of ``exc``, raised by a connect to ``broker_urls``, in plain words; None
    when it is none of the mistakes a user makes (an outage of some other kind)."""
    hosts = [_where(url) for url in broker_urls]
    _, user, vhost = hosts[-1]  # the host whose error this is, when several are listed
    text = str(exc)
    closed = exc.reply_code if isinstance(exc, BrokerClosed) and exc.connection else 0
    if closed == _ACCESS_REFUSED or (
        isinstance(exc, aiormq.exceptions.ProbableAuthenticationError) and "ACCESS_REFUSED" in text
    ):
        return f'the broker refused the login of user "{user}" (a wrong user name or password)'
    if closed == _NOT_ALLOWED or (
        isinstance(exc, aiormq.exceptions.InvalidFrameError)
        and ("Connection.OpenOk" in text and "Connection.Close" in text)
    ):
        # RabbitMQ closes the connection in answer to its Connection.Open: the only
        # thing that asks for is the virtual host (aiormq keeps none of its words; the
        # sync face's connection reads its reply code).
        return (
            f'the broker refused the virtual host "{vhost}" (it does not exist, or user '
            f'"{user}" has no access to it)'
        )
    cause = exc.__cause__ if isinstance(exc, aiormq.exceptions.AMQPConnectionError) else exc
    if isinstance(cause, socket.gaierror):  # the name did not resolve
        return f"unknown host: {', '.join(where.rpartition(':')[0] for where, _, _ in hosts)}"
    if isinstance(cause, (ConnectionRefusedError, TimeoutError)):
        return f"the broker is not answering at {', '.join(where for where, _, _ in hosts)}"
    return None


def refused(url: str, broker_urls: tuple[str, ...], exc: BaseException) -> ServerRefused | None:
    """The :class:`ServerRefused` of the queue URL ``url`` for ``exc``, raised by a
    connect to ``broker_urls`` (its hosts), its cause set; None when ``exc`` is none of
    the mistakes it names."""
    reason = _reason(broker_urls, exc)
    if reason is None:
        return None
    error = ServerRefused(f"cannot use the queue at {redact_url(url)}: {reason}")
    error.__cause__ = exc
    return error


def final(exc: BaseException) -> BaseException | None:
    """What no retry of a connection mends, or None (an outage): the broker's
    certificate failed its check, the broker refused the credentials, or a TLS file of
    the URL could not be read (aiormq raises those as they are, before connecting)."""
    if isinstance(exc.__cause__, ssl.SSLCertVerificationError):
        return exc.__cause__
    if isinstance(exc, aiormq.exceptions.AuthenticationError) or (
        isinstance(exc, aiormq.exceptions.ProbableAuthenticationError)
        and "ACCESS_REFUSED" in str(exc)
    ):
        return exc
    if isinstance(exc, BrokerClosed) and exc.connection and exc.reply_code == _ACCESS_REFUSED:
        return exc
    if not isinstance(exc, aiormq.exceptions.AMQPError) and isinstance(
        exc, (ssl.SSLError, FileNotFoundError, PermissionError, IsADirectoryError)
    ):
        return exc
    return None


def connect_error(url: str, broker_urls: tuple[str, ...], exc: BaseException) -> Exception | None:
    """What a connect to ``broker_urls`` (the hosts of the queue URL ``url``) that failed
    with ``exc`` raises: :class:`Refused` when no retry mends it (of the line that says
    why, or of the error itself), the :class:`ServerRefused` line of a mistake of the
    URL (the broker down, a wrong password, an unknown virtual host), else None (an
    outage, said as the caller says it)."""
    line = refused(url, broker_urls, exc)
    cause = final(exc)
    if cause is not None:
        return Refused(line or cause)
    return line


class _NoConnectErrors(logging.Filter):
    """Drops aiormq's own line for a connect that failed: the error delayq raises names
    the cause, and a caller that retries would log it once per try."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("error when creating transport")


_FILTER = _NoConnectErrors()


def quiet_connect_errors() -> None:
    """Install the filter of aiormq's connect-failure lines (once)."""
    logger = logging.getLogger("aiormq.connection")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
