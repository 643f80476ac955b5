"""The hot route of the API, ``POST /v1/queues/{queue}/messages``, as ASGI middleware.

FastAPI spends most of a small request's time in its own machinery (a ``Request``,
two exit stacks, dependency solving, content-type parsing): more than twice what
parsing and storing the message costs. :class:`FastPut` sits inside the token and
body-limit middleware and answers a put that is valid all through with the route's
own steps (:class:`~._models.PutRequestBody`, :func:`~._api.queue_named`,
:func:`~._api.put_one`), sending what the route would send: 201 (stored) or 200
(an existing message kept) and ``{"id", "queue", "created"}``.

It has no rules of its own. A request whose JSON, fields (the pydantic model) or
queue name is not valid is passed to the app unchanged, its buffered body replayed,
before anything is written: the route finds the fault and answers it. What
:func:`~._api.put_one` raises (an :class:`~._errors.ApiError` of its checks, a
duplicate id, a payload too large, the backend down) is answered by the app's
handler of that exception, as FastAPI's ``ExceptionMiddleware`` would answer it
when the route raised it; an unexpected error propagates to the outer
``ServerErrorMiddleware``, as before.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .._names import MAX_ID_LENGTH
from ._api import put_one, put_status, queue_named
from ._convert import request_trace
from ._limits import loads, replaying
from ._models import PutRequestBody

__all__ = ["FastPut"]

_PREFIX = "/v1/queues/"
_SUFFIX = "/messages"
_JSON = b"application/json"

_Handler = Callable[[Request, Exception], Awaitable[Response]]


def _queue_in(path: str) -> str | None:
    """The ``{queue}`` of a put's path as the route takes it (``[^/]+``, at most
    MAX_ID_LENGTH characters), else None."""
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    name = path[len(_PREFIX) : -len(_SUFFIX)]
    if not name or "/" in name or len(name) > MAX_ID_LENGTH:
        return None
    return name


def _plain_json(scope: Scope) -> bool:
    """True when the (first) Content-Type is ``application/json``, parameters aside."""
    for key, value in scope["headers"]:
        if key == b"content-type":
            return bytes(value).partition(b";")[0].strip().lower() == _JSON
    return False


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client went away."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _handler_of(scope: Scope, exc: Exception) -> _Handler | None:
    """The app's handler of ``exc``, found as its ExceptionMiddleware finds it (by the
    exception's class hierarchy); None for the handler of ``Exception`` itself, which
    belongs to the outer ServerErrorMiddleware."""
    handlers: dict[Any, _Handler] = scope["app"].exception_handlers
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        handler = handlers.get(cls)
        if handler is not None:
            return handler
    return None


class FastPut:
    """Answer valid single puts straight away; pass everything else to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``POST /v1/queues/{queue}/messages`` with a valid JSON body."""
        name = None
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and not scope.get("query_string")  # the put takes none: the route refuses them
            and _plain_json(scope)
        ):
            name = _queue_in(scope["path"])
        if name is None:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # nobody to answer
        try:
            state = scope["app"].state.delayq
            request = PutRequestBody.model_validate(loads(body))
            queue = queue_named(state, name)
        except Exception:  # the route finds the fault again and answers it
            await self.app(scope, replaying(body, receive), send)
            return
        try:
            answer = await put_one(state, queue, request, request_trace(scope["headers"]))
        except Exception as exc:
            handler = _handler_of(scope, exc)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)
            return
        # What the route's JSONResponse sends, without building one.
        content = json.dumps(
            answer, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": put_status(answer["created"]),
                "headers": [
                    (b"content-length", str(len(content)).encode()),
                    (b"content-type", _JSON),
                ],
            }
        )
        await send({"type": "http.response.body", "body": content})
