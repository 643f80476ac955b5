"""What ``delayq serve`` is configured with, checked once at start.

Every part of the server (the API, the callback dispatcher, the dashboard, the
metrics) reads this one frozen object; nothing reads the environment later.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass, field

from .._constants import (
    CALLBACK_DEFAULT_TIMEOUT,
    CALLBACK_MAX_TIMEOUT,
    DEFAULT_CALLBACK_QUEUE,
    SERVE_DEFAULT_HOST,
    SERVE_DEFAULT_PORT,
    SERVE_DISPATCH_CONCURRENCY,
    SERVE_MAX_BODY,
)
from ..durable._facade import check_identifier

__all__ = [
    "SESSION_COOKIE",
    "ServeConfig",
    "check_queue_name",
    "is_loopback_host",
    "session_value",
]

#: The dashboard's login cookie; its value is :func:`session_value` of the token.
SESSION_COOKIE = "delayq_session"


def session_value(token: str) -> str:
    """The cookie value that stands for ``token``: an HMAC of it, so the cookie never
    carries the token itself and changes when the token does."""
    return hmac.new(token.encode(), b"delayq dashboard session", hashlib.sha256).hexdigest()


def check_queue_name(name: str) -> str:
    """``name`` if the server can serve a queue of that name, else ``ValueError``
    (``TypeError`` for a non-str): 1 to 255 characters, no NUL, no ``{``, ``}`` or
    ``/``, no leading or trailing space, and not ``.`` or ``..`` (URL paths drop those
    segments, so no client could name the queue)."""
    check_identifier("queue name", name)
    if any(ch in name for ch in "{}/") or name != name.strip() or name in (".", ".."):
        raise ValueError(
            f"queue name must not contain '{{', '}}' or '/', start or end with spaces, "
            f"or be '.' or '..', got {name!r:.80}"
        )
    return name


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and for loopback addresses (``127.0.0.0/8``, ``::1``)."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


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
    max_body: int = SERVE_MAX_BODY
    backend_options: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ValueError("url must be a backend URL")
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0 to 65535, got {self.port!r}")
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 8):
            raise ValueError("token must be a str of at least 8 characters")
        if self.token is None and not is_loopback_host(self.host):
            raise ValueError(
                f"refusing to serve on {self.host!r} without a token: a non-loopback "
                "bind needs --token (or DELAYQ_TOKEN)"
            )
        if not self.callback_queues:
            raise ValueError("callback_queues must name at least one queue")
        for name in self.callback_queues:
            try:
                check_queue_name(name)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"callback queue: {exc}") from None
        for pattern in self.callback_hosts:
            if not isinstance(pattern, str) or not pattern or "/" in pattern:
                raise ValueError(f"callback host must be a host name or pattern, got {pattern!r}")
        if not 0 < self.callback_timeout <= CALLBACK_MAX_TIMEOUT:
            raise ValueError(f"callback_timeout must be > 0 and <= {CALLBACK_MAX_TIMEOUT} s")
        if type(self.dispatch_concurrency) is not int or self.dispatch_concurrency < 1:
            raise ValueError("dispatch_concurrency must be an int >= 1")
        if type(self.max_body) is not int or self.max_body < 1024:
            raise ValueError("max_body must be an int >= 1024 bytes")
