"""``HEAD`` on every ``GET`` route, as an ASGI middleware.

FastAPI routes answer only the methods they declare, so a load balancer's or an
uptime checker's ``HEAD /healthz`` would be a 405. :class:`HeadAsGet` runs a ``HEAD``
request as the ``GET`` it stands for (a ``GET`` changes nothing) and sends the
answer's status and headers without its body, as RFC 9110 asks.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HeadAsGet"]


class HeadAsGet:
    """Answer ``HEAD`` like ``GET``, without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass other requests on; run a ``HEAD`` as ``GET`` and drop the body."""
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        # A copy: the server keeps its own scope, and must still see HEAD.
        await self.app({**scope, "method": "GET"}, receive, headers_only)
