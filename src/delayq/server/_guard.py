"""What every request must be before anything else looks at it, as an ASGI middleware;
and the per-client bound on waiting reserves.

:class:`RequestGuard` runs first, on every request, with or without a token:

* a WebSocket is refused (the server has none; no scope type but ``http`` and
  ``lifespan`` reaches the app);
* headers over :data:`SERVE_MAX_HEADER_BYTES` are a 431 (``delayq serve``'s protocol
  already cuts them off as they arrive; this holds under any other ASGI server);
* the ``Host`` must be one the server answers to (:meth:`ServeConfig.host_allowed`),
  else 400: a page whose name was rebound to this machine's address gets nothing;
* a queue name or message id in an API path must be UTF-8 once percent-decoded
  (``a%FFb`` is not): else 422 ``invalid_queue`` or ``invalid_id``, as for any name
  that breaks the rule, not a lookup of a name with U+FFFD in it (the server decodes
  the path with replacement characters);
* a request that may change something (any method but GET, HEAD, OPTIONS) must not
  come from another site: a ``Sec-Fetch-Site`` other than ``same-origin`` or ``none``,
  or an ``Origin`` that is not this server, is a 403;
* a POST, PUT or PATCH to the API must be JSON, whatever its body, or carry
  ``X-Requested-With`` (a header no cross-site form or simple request can send: the
  dashboard's script does) with an empty body; else 415. Browsers send a cross-site
  JSON request only after a preflight, which this server never grants. A bearer
  token does not exempt a request: the same call gets the same answer from a server
  with a token and one without (``/openapi.json`` requires every body, so generated
  clients send JSON).

The request it passes on carries no Cookie header: delayq reads no cookie (the
dashboard's session travels in a header its script sends, because a browser sends a
cookie to every port of its host), and the framework underneath parses every
request's cookies with the standard library's ``http.cookies._unquote``, which is
quadratic on backslashes on some Pythons (CVE-2024-7592: 30,000 of them held the event
loop 1.7 s).

Together these hold for a server without a token, on loopback (``make run``), where
no credential stands between a web page in the user's browser and the queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote_to_bytes, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from ._auth import client_key, header
from ._config import ServeConfig, host_name
from ._constants import SERVE_MAX_HEADER_BYTES
from ._errors import ApiError, error_response

__all__ = ["LongPolls", "RequestGuard"]

_API_PREFIX = "/v1/"
_SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
_METHODS_WITH_BODY = frozenset(("POST", "PUT", "PATCH"))
_SAME_SITE = frozenset(("same-origin", "none"))
_DEFAULT_PORTS = {"http": "80", "https": "443"}
# The headers the guard reads (``x-requested-with``: a header no cross-site form can
# send).
_WATCHED = frozenset((b"host", b"content-type", b"origin", b"sec-fetch-site", b"x-requested-with"))
# Host header values whose verdict is remembered; past it the memory starts again.
_HOSTS_REMEMBERED = 256


def _is_json(content_type: str | None) -> bool:
    """True for ``application/json`` and ``application/*+json`` (any parameters)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _origin(value: str) -> tuple[str, str] | None:
    """``(host, port)`` of an ``Origin`` header, or None for ``null`` or junk."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.hostname.lower().rstrip("."), str(port or _DEFAULT_PORTS[parts.scheme])


def _same_origin(origin: str, host: str | None, config: ServeConfig) -> bool:
    """True when ``origin`` names this server: the ``Host`` it was reached by (with
    the origin's port), or a name of ``config.allowed_hosts``."""
    parsed = _origin(origin)
    if parsed is None:
        return False
    name, port = parsed
    if host is not None:
        text = host.strip().lower()
        host_port = text.rpartition(":")[2] if not text.endswith("]") and ":" in text else ""
        if host_name(text) == name and host_port in ("", port):
            return True
    return config.listed_host(name)


def _undecodable_name(scope: Scope) -> ApiError | None:
    """The 422 of an API path whose queue name or message id is not UTF-8 once
    percent-decoded, or None. Only a path the server decoded with a replacement
    character (U+FFFD) is looked at again."""
    path: str = scope["path"]
    raw = scope.get("raw_path")
    if "\ufffd" not in path or not raw or not path.startswith(_API_PREFIX):
        return None
    # /v1/queues/{queue}/messages/{id...}: the id may hold "/", so it is the rest.
    segments = bytes(raw).split(b"?", 1)[0].split(b"/")
    if segments[2:3] != [b"queues"]:
        return None
    named = [("invalid_queue", "queue name", b"/".join(segments[3:4]))]
    if segments[4:5] == [b"messages"]:
        named.append(("invalid_id", "message id", b"/".join(segments[5:])))
    for code, what, text in named:
        try:
            unquote_to_bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            shown = text.decode("latin-1")
            return ApiError(
                422,
                code,
                f"the {what} {shown!r:.100} of the path is not UTF-8 once percent-decoded",
            )
    return None


def _body_may_follow(scope: Scope) -> bool:
    length = header(scope, b"content-length")
    if length is not None:
        return length.strip() != "0"
    return header(scope, b"transfer-encoding") is not None


def _without_cookies(scope: Scope) -> Scope:
    """``scope`` without its Cookie headers (the server reads none)."""
    headers = scope.get("headers", ())
    if not any(name == b"cookie" for name, _ in headers):
        return scope
    return {**scope, "headers": [(name, value) for name, value in headers if name != b"cookie"]}


class RequestGuard:
    """Refuse WebSockets, oversized headers, foreign ``Host`` names and cross-site
    writes before anything else runs (see the module's docstring)."""

    def __init__(self, app: ASGIApp, config: ServeConfig) -> None:
        self.app = app
        self.config = config
        # Host header value -> allowed: a server is reached by few names.
        self._hosts: dict[bytes, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a refused request; pass the others on."""
        kind = scope["type"]
        if kind == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": "no websockets"})
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await error_response(refusal.status, refusal.code, refusal.message)(
                scope, receive, send
            )
            return
        await self.app(_without_cookies(scope), receive, send)

    def _host_allowed(self, host: bytes | None) -> bool:
        if host is None:
            return True
        allowed = self._hosts.get(host)
        if allowed is None:
            if len(self._hosts) >= _HOSTS_REMEMBERED:
                self._hosts.clear()
            allowed = self._hosts[host] = self.config.host_allowed(host.decode("latin-1"))
        return allowed

    def _refusal(self, scope: Scope) -> ApiError | None:
        # One pass over the headers for the few this looks at.
        size = 0
        host = site = origin = content_type = custom = None
        for name, value in scope.get("headers", ()):
            size += len(name) + len(value)
            if name in _WATCHED:
                if name == b"host":
                    host = host if host is not None else bytes(value)
                elif name == b"content-type":
                    content_type = bytes(value).decode("latin-1")
                elif name == b"origin":
                    origin = bytes(value).decode("latin-1")
                elif name == b"sec-fetch-site":
                    site = bytes(value).decode("latin-1")
                else:
                    custom = name
        if size > SERVE_MAX_HEADER_BYTES:
            return ApiError(
                431,
                "headers_too_large",
                f"the request headers are larger than {SERVE_MAX_HEADER_BYTES} bytes",
            )
        if not self._host_allowed(host):
            shown = host_name((host or b"").decode("latin-1"))
            return ApiError(
                400,
                "host_not_allowed",
                f"this server does not answer to the host {shown!r:.100}: "
                "start it with --allowed-host NAME to reach it by that name",
            )
        undecodable = _undecodable_name(scope)
        if undecodable is not None:
            return undecodable
        method: str = scope["method"]
        if method in _SAFE_METHODS:
            return None
        host_text = None if host is None else host.decode("latin-1")
        if (site is not None and site.strip().lower() not in _SAME_SITE) or (
            origin is not None and not _same_origin(origin, host_text, self.config)
        ):
            return ApiError(
                403,
                "cross_site_request",
                "a request from another web site cannot change anything here",
            )
        if method not in _METHODS_WITH_BODY or not scope["path"].startswith(_API_PREFIX):
            return None
        if _is_json(content_type):
            return None
        if content_type is None and custom is not None and not _body_may_follow(scope):
            return None
        got = f"got {content_type[:80]!r}" if content_type else "no Content-Type was sent"
        return ApiError(
            415,
            "unsupported_media_type",
            f"a {method} to the API must be JSON ({got}): send 'Content-Type: "
            "application/json', even with no body",
        )


class LongPolls:
    """How many waiting reserves each client address holds; at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: Counter[str] = Counter()

    @property
    def waiting(self) -> int:
        """The long polls waiting now, of every client."""
        return sum(self._held.values())

    @contextmanager
    def slot(self, scope: Scope) -> Iterator[None]:
        """Hold one of the client's long-poll slots while the block runs; an
        :class:`ApiError` 429 when it holds ``limit`` already."""
        client = client_key(scope)
        if self._held[client] >= self.limit:
            raise ApiError(
                429,
                "too_many_long_polls",
                f"this address already has {self.limit} reserves waiting: wait for one "
                "to return, or reserve with wait 0",
                {"Retry-After": "1"},
            )
        self._held[client] += 1
        try:
            yield
        finally:
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]
