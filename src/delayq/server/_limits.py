"""The request body rules of the HTTP API, as an ASGI middleware.

A body is read in full before the route sees it, counting bytes as they arrive: more
than the route's cap is a 413 as soon as it is known (a ``Content-Length`` above it is
refused unread; a body longer than its ``Content-Length`` says, or a chunked one, is
cut off at the cap). The cap is ``max_body`` for the API (``/v1/...``) and
:data:`SERVE_MAX_PAGE_BODY` for everything else (the dashboard's forms), so an open
route never buffers an API-sized body. How long a body may take is the connection's
business (:mod:`._protocol`). The route then reads the buffered body; later
``receive`` calls reach the client connection, so a route can still learn that the
client went away. (That the API's bodies are JSON is :class:`~._guard.RequestGuard`'s
rule.)
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._auth import header
from ._constants import SERVE_MAX_PAGE_BODY
from ._errors import error_response

__all__ = ["BodyLimit", "replaying"]

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
