"""Token authentication of every request, as an ASGI middleware.

With a token configured, a request passes with ``Authorization: Bearer <token>`` or
with the dashboard's session cookie (:data:`~._config.SESSION_COOKIE` equal to
:func:`~._config.session_value` of the token); both are compared in constant time.
``/healthz``, the dashboard's ``/login`` and ``/logout`` and ``/static/`` files are
open. An API call that changes something (not GET/HEAD) on the strength of the cookie
alone must also send ``X-Requested-With`` (as the dashboard's script does), which a
cross-site form cannot. A
refused API request is a 401 with ``WWW-Authenticate: Bearer``; a browser asking
for a dashboard page (``GET`` accepting HTML, outside the API) is sent to
``/login`` instead.
"""

from __future__ import annotations

import hmac
from http.cookies import CookieError, SimpleCookie
from urllib.parse import quote

from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ._config import SESSION_COOKIE, session_value
from ._errors import error_response

__all__ = ["OPEN_PATHS", "OPEN_PREFIXES", "TokenAuth"]

#: Paths served without a token.
OPEN_PATHS = frozenset(("/healthz", "/login", "/logout"))
#: Path prefixes served without a token.
OPEN_PREFIXES = ("/static/",)
_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_API_PREFIX = "/v1/"
# Paths a browser is never redirected from: machines read them.
_MACHINE_PREFIXES = ("/v1/", "/metrics", "/openapi.json", "/docs", "/redoc")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _cookie(scope: Scope, name: str) -> str | None:
    text = _header(scope, b"cookie")
    if not text:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(text)
    except CookieError:
        return None
    morsel = jar.get(name)
    return None if morsel is None else morsel.value


def _equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


class TokenAuth:
    """Refuse requests without the token (or the session cookie) when one is set."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = token
        self._session = None if token is None else session_value(token)

    def allowed(self, scope: Scope) -> bool:
        """True when the request carries the token or the session cookie."""
        assert self._token is not None
        assert self._session is not None
        authorization = _header(scope, b"authorization")
        if authorization is not None:
            scheme, _, credentials = authorization.strip().partition(" ")
            if scheme.lower() == "bearer" and _equal(credentials.strip(), self._token):
                return True
        cookie = _cookie(scope, SESSION_COOKIE)
        if cookie is None or not _equal(cookie, self._session):
            return False
        return (
            scope["method"] in _SAFE_METHODS
            or not scope["path"].startswith(_API_PREFIX)
            or _header(scope, b"x-requested-with") is not None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an authenticated (or open) request on; answer the rest."""
        if self._token is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        accept = _header(scope, b"accept") or ""
        if (
            scope["method"] == "GET"
            and "text/html" in accept
            and not path.startswith(_MACHINE_PREFIXES)
        ):
            target = f"/login?next={quote(path, safe='/')}"
            await RedirectResponse(target, status_code=303)(scope, receive, send)
            return
        message = "missing or wrong token: send 'Authorization: Bearer <token>'"
        cookie = _cookie(scope, SESSION_COOKIE)
        if cookie is not None and _equal(cookie, self._session or ""):
            # Signed in, but a write on the cookie alone (the CSRF guard): say so.
            message = (
                "the dashboard session cookie alone cannot change anything: send "
                "'X-Requested-With' with it, or 'Authorization: Bearer <token>'"
            )
        response = error_response(
            401,
            "unauthorized",
            message,
            {"WWW-Authenticate": 'Bearer realm="delayq"'},
        )
        await response(scope, receive, send)
