"""What ``delayq serve`` is configured with, checked once at start.

Every part of the server (the API, the callback dispatcher, the dashboard, the
metrics) reads this one frozen object; nothing reads the environment later.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, fields
from typing import Literal

import idna

from .._constants import (
    DEFAULT_CALLBACK_QUEUE,
    SERVE_CLIENT_TIMEOUT,
    SERVE_DEFAULT_HOST,
    SERVE_DEFAULT_PORT,
    SERVE_MAX_CONCURRENCY,
    SERVE_SESSION_TTL,
)
from .._names import QUEUE_NAME, check_stored
from .._names import check_queue_name as check_writable_queue_name
from ..durable.registry import redact_url
from ..runtime.consumer import check_prefetch
from ._constants import (
    CALLBACK_DEFAULT_TIMEOUT,
    CALLBACK_MAX_TIMEOUT,
    SERVE_DISPATCH_CONCURRENCY,
    SERVE_MAX_BODY,
    SERVE_MAX_LONG_POLLS_PER_CLIENT,
)

__all__ = [
    "AnyPort",
    "ServeConfig",
    "check_queue_name",
    "host_name",
    "idna_host",
    "is_loopback_host",
    "split_callback_host",
]


def check_queue_name(name: str) -> str:
    """``name`` if the server can serve a queue of that name: any name a backend can
    hold (see :mod:`delayq._names`), so a queue stored under a name that is refused
    today is still shown and read; a put checks the stricter rule. ``ValueError``
    (``TypeError`` for a non-str) otherwise."""
    return check_stored(QUEUE_NAME, name)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and for loopback addresses (``127.0.0.0/8``, ``::1``)."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _binds_loopback(host: str) -> bool:
    """True when binding ``host`` listens on loopback only: ``localhost`` or a loopback
    address. A name under ``.localhost`` is not: the bind resolves it, and a resolver
    may send it out and answer any address."""
    name = host.strip("[]").lower().rstrip(".")
    return name == "localhost" or (
        name != "" and is_loopback_host(name) and name[0] in "0123456789:"
    )


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an ``--allowed-host`` entry: lowercase, without
    brackets, port or trailing dot (``"[::1]:8080"`` -> ``"::1"``)."""
    text = value.strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    if text.count(":") == 1:
        text = text.partition(":")[0]
    return text.rstrip(".")


def _check_allowed_host(pattern: object) -> str:
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError(f"allowed host must be a host name, got {pattern!r}")
    text = pattern.strip().lower()
    if text == "*":
        return text
    name = text[2:] if text.startswith("*.") else text
    if not name or any(ch in name for ch in "/@*?#") or any(ch.isspace() for ch in name):
        raise ValueError(
            f"allowed host must be a host name, '*.domain' or '*', got {pattern!r:.80}"
        )
    return text


# A DNS name as an allowlist may name it (IDNA-encoded): labels of letters, digits,
# '-' and '_', 1 to 63 characters, not starting or ending with '-'.
_HOST = re.compile(
    r"(?:[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\.)*[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def idna_host(name: str) -> str:
    """A non-ASCII host name as httpx sends and connects to it: IDNA 2008 by the
    ``idna`` package with its default options, as httpx calls it (not Python's IDNA
    2003 codec, which maps ``ß`` to ``ss``); ``UnicodeError`` when it cannot."""
    return name if name.isascii() else idna.encode(name).decode("ascii")


AnyPort = Literal["*"]


def split_callback_host(pattern: str) -> tuple[str, int | AnyPort | None] | None:
    """``"host"``, ``"host:port"``, ``"host:*"``, ``"[v6]"``, ``"[v6]:port"``,
    ``"[v6]:*"`` or a bare IPv6 -> ``(host, port)``, the port None when the pattern
    names none (the scheme's default port) and ``"*"`` for any; None when the pattern
    is malformed (it then allows nothing)."""
    text = pattern.strip().lower()
    port: str | None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, None
    host = host.rstrip(".")
    wildcard = "*." if host.startswith("*.") else ""
    try:
        host = wildcard + idna_host(host[len(wildcard) :])
    except UnicodeError:
        return None
    if not _HOST.fullmatch(host[len(wildcard) :]) and not _is_ip(host):
        return None
    if port is None or port == "*":
        return host, "*" if port else None
    if port.isascii() and port.isdigit() and 0 < int(port) <= 65535:
        return host, int(port)
    return None


def _check_callback_host(pattern: object) -> None:
    if not isinstance(pattern, str) or split_callback_host(pattern) is None:
        raise ValueError(
            "callback host must be a host name or pattern (host, *.domain, [v6], with "
            f":port or :* if you like), got {pattern!r:.80}"
        )


@dataclass(frozen=True)
class ServeConfig:
    """The server's settings.

    ``url`` is the backend (as for :class:`~delayq.Queue`). ``token``, when set, is
    required as ``Authorization: Bearer <token>`` on every endpoint but ``/healthz``
    (the dashboard has a login form for it); a bind to a non-loopback ``host``
    without a token is refused. ``dispatch`` runs the callback dispatcher in the
    server process, over ``callback_queues``: a message put with a ``callback`` must
    go to one of them. ``callback_hosts`` is the allowlist of callback hosts
    (``"api.example.com"``, ``"*.example.com"``, optionally with ``":port"`` or
    ``":*"``; without a port only the scheme's default port, 80 or 443, is allowed);
    loopback targets are allowed only with ``allow_loopback_callbacks`` (then on any
    port, listed or not); private and other non-public addresses (``10/8``,
    ``fc00::/7``, ``100.64/10``, NAT64, ...) only with ``allow_private_callbacks``
    (the host must still be listed) or when that IP is listed.
    ``signing_secret`` keys the HMAC-SHA256 signature of every callback request.
    ``dispatch_concurrency`` callback requests run at once, and up to
    ``dispatch_prefetch`` more messages (default 0: none, as measured: a request's own
    CPU bounds the dispatcher, not the claim; None: 4 x ``dispatch_concurrency``, a
    Worker's default) are reserved ahead, their leases renewed while they wait.

    ``allowed_hosts`` are the names clients may reach the server by (the ``Host``
    header): ``queue.example.com``, ``*.example.com``, or ``*`` for any. A server
    bound to loopback also answers to loopback names (``localhost``, ``127.0.0.1``,
    ``[::1]``) and to nothing else unless listed; one bound to another address
    answers to any name while none is listed (its token guards it). A dashboard
    session lasts ``session_ttl`` seconds. ``max_concurrency`` bounds the
    connections and requests served at once (503 past it) and
    ``max_long_polls_per_client`` the waiting reserves of one client address (429).
    ``forwarded_allow_ips`` are the proxies whose ``X-Forwarded-For`` and
    ``X-Forwarded-Proto`` are believed (the client's address and ``https``).
    ``client_timeout`` is how long a client may take to send a request's head, or
    each piece of its body (408 and the connection closed past it).
    """

    url: str
    host: str = SERVE_DEFAULT_HOST
    port: int = SERVE_DEFAULT_PORT
    token: str | None = None
    dispatch: bool = True
    callback_queues: tuple[str, ...] = (DEFAULT_CALLBACK_QUEUE,)
    callback_hosts: tuple[str, ...] = ()
    allow_loopback_callbacks: bool = False
    allow_private_callbacks: bool = False
    signing_secret: str | None = None
    callback_timeout: float = CALLBACK_DEFAULT_TIMEOUT
    dispatch_concurrency: int = SERVE_DISPATCH_CONCURRENCY
    dispatch_prefetch: int | None = 0
    max_body: int = SERVE_MAX_BODY
    allowed_hosts: tuple[str, ...] = ()
    session_ttl: float = SERVE_SESSION_TTL
    max_concurrency: int = SERVE_MAX_CONCURRENCY
    max_long_polls_per_client: int = SERVE_MAX_LONG_POLLS_PER_CLIENT
    forwarded_allow_ips: tuple[str, ...] = ()
    client_timeout: float = SERVE_CLIENT_TIMEOUT
    backend_options: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ValueError("url must be a backend URL")
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0 to 65535, got {self.port!r}")
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 8):
            raise ValueError("token must be a str of at least 8 characters")
        if self.token is None and not _binds_loopback(self.host):
            raise ValueError(
                f"refusing to serve on {self.host!r} without a token: a bind to another "
                "address than localhost, 127.0.0.0/8 or ::1 needs --token-file FILE (or "
                "DELAYQ_TOKEN)"
            )
        # Tuples of their own: a list the caller edits later cannot change what was
        # checked here (an unchecked callback host would allow every host).
        for name in ("callback_queues", "callback_hosts", "forwarded_allow_ips"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, (tuple, list)):
                raise ValueError(f"{name} must be a tuple of str, not {type(value).__name__}")
            object.__setattr__(self, name, tuple(value))
        if not self.callback_queues:
            raise ValueError("callback_queues must name at least one queue")
        for name in self.callback_queues:
            try:
                check_writable_queue_name(name)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"callback queue: {exc}") from None
        for pattern in self.callback_hosts:
            _check_callback_host(pattern)
        if not 0 < self.callback_timeout <= CALLBACK_MAX_TIMEOUT:
            raise ValueError(f"callback_timeout must be > 0 and <= {CALLBACK_MAX_TIMEOUT} s")
        if type(self.dispatch_concurrency) is not int or self.dispatch_concurrency < 1:
            raise ValueError("dispatch_concurrency must be an int >= 1")
        check_prefetch(self.dispatch_prefetch, self.dispatch_concurrency, "dispatch_prefetch")
        if type(self.max_body) is not int or self.max_body < 1024:
            raise ValueError("max_body must be an int >= 1024 bytes")
        object.__setattr__(
            self, "allowed_hosts", tuple(_check_allowed_host(p) for p in self.allowed_hosts)
        )
        ttl = self.session_ttl
        if type(ttl) not in (int, float) or not 60 <= ttl <= 366 * 86400:
            raise ValueError("session_ttl must be 60 seconds to 366 days")
        if type(self.max_concurrency) is not int or self.max_concurrency < 1:
            raise ValueError("max_concurrency must be an int >= 1")
        if type(self.max_long_polls_per_client) is not int or self.max_long_polls_per_client < 1:
            raise ValueError("max_long_polls_per_client must be an int >= 1")
        timeout = self.client_timeout
        if type(timeout) not in (int, float) or not 0.1 <= timeout <= 3600:
            raise ValueError("client_timeout must be 0.1 to 3600 seconds")
        for address in self.forwarded_allow_ips:
            if not isinstance(address, str) or not address.strip():
                raise ValueError(f"forwarded_allow_ips: not an address, {address!r}")

    def __repr__(self) -> str:
        # A config is printed in tracebacks and logs: its secrets are not.
        shown = {item.name: getattr(self, item.name) for item in fields(self)}
        shown["url"] = redact_url(self.url)
        for secret in ("token", "signing_secret"):
            if shown[secret] is not None:
                shown[secret] = "***"
        return f"ServeConfig({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    def listed_host(self, name: str) -> bool:
        """True when the host ``name`` matches an entry of ``allowed_hosts`` by name
        (``*`` aside)."""
        return any(
            host_name(pattern) == name or (pattern.startswith("*.") and name.endswith(pattern[1:]))
            for pattern in self.allowed_hosts
        )

    def host_allowed(self, value: str | None) -> bool:
        """True when a request whose ``Host`` header is ``value`` may be served
        (no header at all is allowed: browsers always send one)."""
        if value is None:
            return True
        name = host_name(value)
        if "*" in self.allowed_hosts or self.listed_host(name):
            return True
        if is_loopback_host(name):
            return True
        if is_loopback_host(self.host):
            return False
        return not self.allowed_hosts or name == host_name(self.host)
