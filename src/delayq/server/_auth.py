"""Token authentication of every request, as an ASGI middleware, with the dashboard's
sessions and the throttle of failed token attempts.

With a token configured, a request passes with ``Authorization: Bearer <token>`` or
with a live dashboard session in :data:`SESSION_HEADER` (see :class:`Sessions`);
secrets are compared in constant time. ``/healthz``, ``/openapi.json`` (the API's
description, no data: so that clients can be generated from a protected server), the
dashboard's ``/login`` and ``/logout`` and ``/static/`` files are open. An API call
that changes something (not GET/HEAD) on the strength of the session alone must also
send ``X-Requested-With`` (as the dashboard's script does). A refused API request is a
401 with ``WWW-Authenticate: Bearer``; a browser asking for a dashboard page (``GET``
accepting HTML, outside the API, with no credential) is sent to ``/login``, whose
script fetches the page again with the session it keeps.

The session is never a cookie: a browser sends a cookie to every port of its host
(RFC 6265 8.5), so any other server on the machine would receive it on one visit. The
dashboard's script keeps the session in the origin's ``localStorage`` (scheme, host
and port) and sends it only in its own requests.

A wrong token, as a bearer or in the login form, is logged (``auth.failed``) and
counted against the client's address (:class:`AttemptThrottle`): past a burst, that
address's token attempts are a 429 until the throttle refills. Sessions are not
throttled: they cannot be guessed.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import quote, urlencode

from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .._log import log_event
from ._constants import (
    SERVE_AUTH_FAILURE_BURST,
    SERVE_AUTH_FAILURE_REFILL,
    SERVE_AUTH_TRACKED_CLIENTS,
)
from ._errors import error_response

__all__ = [
    "OPEN_PATHS",
    "OPEN_PREFIXES",
    "SESSION_HEADER",
    "AttemptThrottle",
    "Sessions",
    "TokenAuth",
    "client_key",
    "header",
    "token_matches",
]

#: The request header that carries a dashboard session (lowercase, as in an ASGI scope).
SESSION_HEADER = "x-delayq-session"
#: Paths served without a token.
OPEN_PATHS = frozenset(("/healthz", "/openapi.json", "/login", "/logout"))
#: Path prefixes served without a token.
OPEN_PREFIXES = ("/static/",)
_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_API_PREFIX = "/v1/"
# Paths a browser is never redirected from: machines read them.
_MACHINE_PREFIXES = ("/v1/", "/metrics", "/openapi.json", "/docs", "/redoc")
# A session value longer than this is not one of ours (and is not looked at further).
_MAX_SESSION_VALUE = 128
_SESSION_HEADER_KEY = SESSION_HEADER.encode()
# What a path keeps unencoded in the login page's ``next``.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"
_NO_TOKEN = "missing or wrong token: send 'Authorization: Bearer <token>'"
_SESSION_OVER = (
    "the dashboard session has ended or expired: sign in again, or send "
    "'Authorization: Bearer <token>'"
)
# The CSRF guard of a write on the session alone.
_SESSION_WRITE = (
    "the dashboard session alone cannot change anything: send 'X-Requested-With' "
    "with it, or 'Authorization: Bearer <token>'"
)


def header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header of the request (lowercase ``name``), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def token_matches(given: str, token: str) -> bool:
    """``given == token``, in time independent of where they differ."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())


def client_key(scope: Scope) -> str:
    """The address the throttles count a request against: the client's IP, or its
    /64 network for IPv6 (one host usually holds a whole /64)."""
    client = scope.get("client")
    if not client:
        return "unknown"
    host = str(client[0])
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else address)


class Sessions:
    """The dashboard's sessions: signed values that expire, and can be ended.

    A value is ``<expires>.<nonce>.<mac>``: the unix second it ends, 16 random bytes,
    and an HMAC-SHA256 of both under a key derived from the token (a new token ends
    every session). :meth:`end` (``/logout``) remembers the nonce until it would
    have expired, so a copied value stops working at logout. Ended sessions are kept
    in this process: another replica of the server honours a session until it
    expires.
    """

    def __init__(self, token: str, ttl: float, clock: Callable[[], float] = time.time) -> None:
        self._key = hmac.new(token.encode(), b"delayq dashboard session key", "sha256").digest()
        self.ttl = ttl
        self._clock = clock
        self._ended: dict[str, int] = {}

    def _mac(self, expires: str, nonce: str) -> str:
        message = f"{expires}.{nonce}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def start(self) -> str:
        """A new session's value."""
        expires = str(math.ceil(self._clock() + self.ttl))
        nonce = secrets.token_urlsafe(16)
        return f"{expires}.{nonce}.{self._mac(expires, nonce)}"

    def _parse(self, value: str | None) -> tuple[int, str] | None:
        if not value or len(value) > _MAX_SESSION_VALUE:
            return None
        parts = value.split(".")
        if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 12:
            return None
        expires, nonce, mac = parts
        if not hmac.compare_digest(mac.encode(), self._mac(expires, nonce).encode()):
            return None
        return int(expires), nonce

    def live(self, value: str | None) -> bool:
        """True when ``value`` is a session this server started, not expired or ended."""
        parsed = self._parse(value)
        if parsed is None:
            return False
        expires, nonce = parsed
        return expires > self._clock() and nonce not in self._ended

    def end(self, value: str | None) -> None:
        """End the session ``value`` (nothing when it is not a live one)."""
        parsed = self._parse(value)
        if parsed is None:
            return
        now = self._clock()
        expires, nonce = parsed
        if expires > now:
            self._ended[nonce] = expires
            if len(self._ended) > 1024:
                self._ended = {n: e for n, e in self._ended.items() if e > now}


class AttemptThrottle:
    """Failed token attempts per client address, as a token bucket: ``burst``
    failures at once, then one more each ``refill`` seconds. Bounded: it remembers the
    ``tracked`` addresses that failed most recently."""

    def __init__(
        self,
        burst: int = SERVE_AUTH_FAILURE_BURST,
        refill: float = SERVE_AUTH_FAILURE_REFILL,
        tracked: int = SERVE_AUTH_TRACKED_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill = refill
        self.tracked = tracked
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _tokens(self, client: str) -> float:
        entry = self._buckets.get(client)
        if entry is None:
            return float(self.burst)
        tokens, since = entry
        return min(float(self.burst), tokens + (self._clock() - since) / self.refill)

    def retry_after(self, client: str) -> float:
        """0 when ``client`` may try a token now, else the seconds until it may."""
        tokens = self._tokens(client)
        return 0.0 if tokens >= 1 else (1 - tokens) * self.refill

    def failed(self, client: str, *, via: str, path: str) -> None:
        """Count (and log) a wrong token from ``client``."""
        tokens = self._tokens(client) - 1
        self._buckets[client] = (tokens, self._clock())
        self._buckets.move_to_end(client)
        while len(self._buckets) > self.tracked:
            self._buckets.popitem(last=False)
        log_event(logging.WARNING, "auth.failed", client=client, via=via, path=path)
        if tokens < 1:
            log_event(
                logging.WARNING,
                "auth.throttled",
                client=client,
                retry_after=f"{(1 - tokens) * self.refill:.0f}s",
            )


def too_many_attempts(retry_after: float) -> ASGIApp:
    """The 429 answer to a token attempt of a throttled client."""
    seconds = max(1, math.ceil(retry_after))
    return error_response(
        429,
        "too_many_attempts",
        f"too many wrong tokens from this address: try again in {seconds} s",
        {"Retry-After": str(seconds)},
    )


class TokenAuth:
    """Refuse requests without the token (or a live session) when one is set."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        sessions: Sessions | None = None,
        throttle: AttemptThrottle | None = None,
    ) -> None:
        self.app = app
        self._token = token
        self._sessions = sessions
        self._throttle = throttle if throttle is not None else AttemptThrottle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an authenticated (or open) request on; answer the rest."""
        if self._token is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        authorization = header(scope, b"authorization")
        if authorization is not None:
            scheme, _, credentials = authorization.strip().partition(" ")
            if scheme.lower() == "bearer":
                client = client_key(scope)
                wait = self._throttle.retry_after(client)
                if wait > 0:
                    await too_many_attempts(wait)(scope, receive, send)
                    return
                if token_matches(credentials.strip(), self._token):
                    await self.app(scope, receive, send)
                    return
                self._throttle.failed(client, via="bearer", path=path)
                await self._refuse(scope, receive, send, message=_NO_TOKEN, may_redirect=True)
                return
        session = header(scope, _SESSION_HEADER_KEY)
        if session is None:
            await self._refuse(scope, receive, send, message=_NO_TOKEN, may_redirect=True)
            return
        if self._sessions is None or not self._sessions.live(session):
            # A session was sent and is over: the script signs in again, no redirect.
            await self._refuse(scope, receive, send, message=_SESSION_OVER, may_redirect=False)
            return
        if (
            scope["method"] in _SAFE_METHODS
            or not path.startswith(_API_PREFIX)
            or header(scope, b"x-requested-with") is not None
        ):
            await self.app(scope, receive, send)
            return
        await self._refuse(scope, receive, send, message=_SESSION_WRITE, may_redirect=False)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, *, message: str, may_redirect: bool
    ) -> None:
        path: str = scope["path"]
        accept = header(scope, b"accept") or ""
        if (
            may_redirect
            and scope["method"] == "GET"
            and "text/html" in accept
            and not path.startswith(_MACHINE_PREFIXES)
        ):
            # As sent (an id may hold an encoded "/" or "?"), for the login page to fetch.
            raw = scope.get("raw_path")
            here = bytes(raw).decode("latin-1") if raw else quote(path, safe=_PATH_SAFE)
            if scope.get("query_string"):
                here += "?" + bytes(scope["query_string"]).decode("latin-1")
            target = "/login?" + urlencode({"next": here})
            await RedirectResponse(target, status_code=303)(scope, receive, send)
            return
        response = error_response(
            401,
            "unauthorized",
            message,
            {"WWW-Authenticate": 'Bearer realm="delayq"'},
        )
        await response(scope, receive, send)
