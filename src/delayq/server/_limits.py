"""The request body rules of the HTTP API, as an ASGI middleware.

A body is read in full before the route sees it, counting bytes as they arrive: more
than ``max_body`` is a 413 as soon as it is known (a ``Content-Length`` above it is
refused unread; a body longer than its ``Content-Length`` says, or a chunked one, is
cut off at the limit). A non-empty body sent to the API (``/v1/...``) must be JSON
(``application/json`` or ``application/*+json``), else 415. The route then reads
the buffered body; later ``receive`` calls reach the client connection, so a route
can still learn that the client went away.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import error_response

__all__ = ["BodyLimit", "replaying"]

_API_PREFIX = "/v1/"
_METHODS_WITH_JSON = frozenset(("POST", "PUT", "PATCH"))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


class BodyLimit:
    """Refuse bodies over ``max_body`` bytes (413) and non-JSON API bodies (415)."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    def _too_large(self) -> str:
        return f"the request body is larger than {self.max_body} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Buffer the body within the limit, check its type, then call the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await error_response(400, "bad_request", "malformed Content-Length")(
                    scope, receive, send
                )
                return
            if size > self.max_body:
                await error_response(413, "body_too_large", self._too_large())(scope, receive, send)
                return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody to answer
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body:
                await error_response(413, "body_too_large", self._too_large())(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = _header(scope, b"content-type")
        if (
            body
            and scope["method"] in _METHODS_WITH_JSON
            and scope["path"].startswith(_API_PREFIX)
            and not _is_json(content_type)
        ):
            got = f"got {content_type[:80]!r}" if content_type else "no Content-Type was sent"
            refusal = (
                f"the request body must be JSON ({got}): send 'Content-Type: application/json'"
            )
            await error_response(415, "unsupported_media_type", refusal)(scope, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)


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
