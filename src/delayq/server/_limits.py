"""The request body rules of the HTTP API, as an ASGI middleware.

A body is read in full before the route sees it, counting bytes as they arrive: more
than the route's cap is a 413 as soon as it is known (a ``Content-Length`` above it is
refused unread; a body longer than its ``Content-Length`` says, or a chunked one, is
cut off at the cap). The cap is ``max_body`` for the API (``/v1/...``) and
:data:`SERVE_MAX_PAGE_BODY` for everything else (the dashboard's forms), so an open
route never buffers an API-sized body. Each piece of a body must arrive within
:data:`SERVE_CLIENT_TIMEOUT` seconds and the whole within
:data:`SERVE_BODY_TIMEOUT`, else 408 and the connection is closed. The route then
reads the buffered body; later ``receive`` calls reach the client connection, so a
route can still learn that the client went away. (That the API's bodies are JSON is
:class:`~._guard.RequestGuard`'s rule.)
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._constants import SERVE_BODY_TIMEOUT, SERVE_CLIENT_TIMEOUT, SERVE_MAX_PAGE_BODY
from ._auth import header
from ._errors import error_response

__all__ = ["BodyLimit", "replaying"]

_API_PREFIX = "/v1/"


class BodyLimit:
    """Refuse bodies over the route's cap (413) or too slow to arrive (408)."""

    def __init__(
        self,
        app: ASGIApp,
        max_body: int,
        *,
        read_timeout: float = SERVE_CLIENT_TIMEOUT,
        total_timeout: float = SERVE_BODY_TIMEOUT,
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.read_timeout = read_timeout
        self.total_timeout = total_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Buffer the body within the cap and the time limits, then call the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.max_body if scope["path"].startswith(_API_PREFIX) else SERVE_MAX_PAGE_BODY
        too_large = error_response(
            413, "body_too_large", f"the request body is larger than {cap} bytes"
        )
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
                await too_large(scope, receive, send)
                return
        chunks: list[bytes] = []
        total = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.total_timeout
        while True:
            try:
                timeout = min(self.read_timeout, deadline - loop.time())
                message = await asyncio.wait_for(receive(), max(timeout, 0.0))
            except asyncio.TimeoutError:
                slow = error_response(
                    408,
                    "body_timeout",
                    "the request body did not arrive in time",
                    {"Connection": "close"},
                )
                await slow(scope, receive, send)
                return
            if message["type"] == "http.disconnect":
                return  # nobody to answer
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > cap:
                await too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replaying(b"".join(chunks), receive), send)


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
