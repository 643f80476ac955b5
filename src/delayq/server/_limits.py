"""The request body rules of the HTTP API, as an ASGI middleware.

A body is read in full before the route sees it, counting bytes as they arrive: more
than the route's cap is a 413 as soon as it is known (a ``Content-Length`` above it is
refused unread; a body longer than its ``Content-Length`` says, or a chunked one, is
cut off at the cap). The cap is ``max_body`` for the API (``/v1/...``) and
:data:`SERVE_MAX_PAGE_BODY` for everything else (the dashboard's forms), so an open
route never buffers an API-sized body. How long a body may take is the connection's
business (:mod:`.protocol`). The route then reads the buffered body; later
``receive`` calls reach the client connection, so a route can still learn that the
client went away. (That the API's bodies are JSON is :class:`~._guard.RequestGuard`'s
rule.)

:func:`loads` reads a body as JSON the way RFC 8259 has it: the standard library's
parser also takes ``NaN``, ``Infinity`` and ``-Infinity``, and reads a number past a
double's range (``1e400``) as infinity; here each is a :class:`json.JSONDecodeError`,
so the API answers 400 ``malformed_json`` as for any other body that is not JSON. The
API's routes read their bodies with it (:class:`JsonRoute`), and so does the fast
path of puts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._auth import header
from ._constants import SERVE_MAX_PAGE_BODY
from ._errors import error_response

__all__ = ["BodyLimit", "JsonRoute", "loads", "replaying"]

_API_PREFIX = "/v1/"


class BodyLimit:
    """Refuse bodies over the route's cap (413)."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Buffer the body within the cap, then call the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.max_body if scope["path"].startswith(_API_PREFIX) else SERVE_MAX_PAGE_BODY
        declared = header(scope, b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await error_response(400, "bad_request", "malformed Content-Length")(
                    scope, receive, send
                )
                return
            if size > cap:
                await _too_large(cap)(scope, receive, send)
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody to answer
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > cap:
                await _too_large(cap)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replaying(b"".join(chunks), receive), send)


def _too_large(cap: int) -> ASGIApp:
    return error_response(413, "body_too_large", f"the request body is larger than {cap} bytes")


def replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` that gives ``body`` first, in one message, then what the client
    sends (so that a disconnect is still seen)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _no_constant(text: str) -> Any:
    raise json.JSONDecodeError(f"{text} is not a JSON number", text, 0)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise json.JSONDecodeError(f"the number {text:.40} is past a double's range", text, 0)
    return value


# One decoder for every body (json.loads with hooks would build one per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def loads(body: bytes | str) -> Any:
    """``body`` parsed as JSON; :class:`json.JSONDecodeError` (a ``ValueError``) for
    what RFC 8259 does not take, ``NaN``, infinities and numbers past a double's range
    included. Bytes are decoded as :func:`json.loads` decodes them."""
    if isinstance(body, bytes):
        body = body.decode(json.detect_encoding(body), "surrogatepass")
    return _DECODER.decode(body)


class _JsonRequest(Request):
    async def json(self) -> Any:
        """The body, read by :func:`loads`."""
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """An API route: its JSON body is read by :func:`loads`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, given the request as a :class:`_JsonRequest`."""
        handler = super().get_route_handler()

        async def json_handler(request: Request) -> Response:
            return await handler(_JsonRequest(request.scope, request.receive))

        return json_handler
