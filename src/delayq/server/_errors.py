"""Every error the HTTP API answers is ``{"error": {"code": ..., "message": ...}}``.

:class:`ApiError` is what a route raises on purpose; :func:`install_error_handlers`
turns it, FastAPI's validation errors, Starlette's HTTP errors (404, 405, ...) and the
delayq exceptions a route lets through into that shape, with the right status. A
backend that does not answer (Redis down, a SQLite file locked or gone) is a 503
``backend_unavailable`` with ``Retry-After``, logged in one line, never a 500.
:func:`facade_errors` wraps calls into the queue facade, whose ``TypeError`` /
``ValueError`` mean "bad argument" (a 422), never a server fault.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

from .._duration import DurationError
from .._log import log_event, log_raised
from .._names import InvalidName
from ..durable.message import HeadersTooLarge
from ..durable.serializer import PayloadTooDeep, PayloadTooManyValues
from ..errors import DuplicateId, LeaseLost, PayloadTooLarge, QueueClosed

__all__ = [
    "ERROR_CODES",
    "ApiError",
    "check_code",
    "error_response",
    "facade_errors",
    "install_error_handlers",
]


#: Every ``code`` an error answer of the server can carry: its status and what it
#: means. A closed set: :class:`ApiError` and :func:`error_response` refuse any other
#: code, ``ErrorDetail.code`` is an enum of these in ``/openapi.json``, and the README
#: lists them. One code per kind of mistake: a field's value (its type, its bounds,
#: a duration or a time it cannot read, an unknown field or query parameter) is
#: ``invalid_request``, with the field named in the message.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "malformed_json": (400, "The body is not JSON (or not UTF-8)."),
    "bad_request": (400, "The request cannot be read (e.g. a malformed Content-Length)."),
    "host_not_allowed": (400, "The Host header names a host this server does not answer to."),
    "unauthorized": (401, "The token is missing or wrong."),
    "cross_site_request": (403, "A write sent by a page of another web site."),
    "not_found": (404, "No such route, or no message of that id in the queue."),
    "method_not_allowed": (405, "The path does not take this method (Allow lists those it takes)."),
    "header_timeout": (408, "The request line and headers did not arrive in time."),
    "body_timeout": (408, "The request body did not arrive in time."),
    "duplicate_id": (409, "The id exists and on_conflict is 'error' (or it is in flight)."),
    "in_flight": (409, "The message is reserved: it cannot be cancelled or rescheduled."),
    "dead": (409, "The message is dead: retry it instead."),
    "lease_lost": (409, "The message exists, but the lease is not (or no longer) this token."),
    "body_too_large": (413, "The request body is larger than the route takes."),
    "payload_too_large": (413, "The payload is larger than a message may hold."),
    "unsupported_media_type": (415, "A write to the API that is not application/json."),
    "invalid_request": (
        422,
        "A field or query parameter is missing, unknown, of the wrong type, out of "
        "bounds, or not a duration or time; the message names it.",
    ),
    "invalid_queue": (422, "The queue name breaks the rule of names."),
    "invalid_id": (422, "The message id breaks the rule of ids."),
    "invalid_cursor": (422, "The cursor is not one this list gave (or is of another list)."),
    "missing_payload": (422, "A message needs payload or payload_base64."),
    "payload_conflict": (422, "Both payload and payload_base64 were given."),
    "invalid_base64": (422, "payload_base64 is not base64."),
    "payload_too_deep": (422, "The payload nests deeper than the limit."),
    "payload_too_many_values": (422, "The payload holds more values than the limit."),
    "message_headers_too_large": (422, "The message's headers are larger than the limit."),
    "reserved_header": (422, "A message header the server sets itself (delayq-callback)."),
    "invalid_callback": (422, "The callback is not valid (URL, method, headers, timeout)."),
    "callback_host_not_allowed": (422, "The callback's host is not on the allowlist."),
    "callback_queue_not_dispatched": (
        422,
        "A callback put to a queue that is not a callback queue.",
    ),
    "too_many_attempts": (429, "Too many wrong tokens from this address (see Retry-After)."),
    "too_many_long_polls": (429, "Too many waiting reserves from this address (see Retry-After)."),
    "headers_too_large": (431, "The request's line and headers are larger than the limit."),
    "internal_error": (500, "The server failed (a bug: its log says more)."),
    "backend_unavailable": (503, "The backend does not answer (see Retry-After)."),
    "stopping": (503, "The server is shutting down."),
}

#: The ``code`` of a Starlette HTTP error, by status (another status: ``bad_request``).
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}
# The fields of a request body that the facade's time parsers name as they are.
_BODY_TIMES = frozenset(("delay", "at"))
# Longest message built from pydantic's errors.
_MAX_MESSAGE = 1000
# What a union's branch is called in pydantic's error locations, said for people.
_UNION_BRANCHES = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "a boolean",
    "list": "a list",
    "dict": "an object",
}
# The message of a request body FastAPI could not decode (not UTF-8).
_UNDECODABLE_BODY = "There was an error parsing the body"
# The methods a 405 answer checks the path against, for its Allow header.
_PROBED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Seconds a client should wait before it tries again after a 503.
_RETRY_AFTER = "1"


class ApiError(Exception):
    """An error answer: ``status``, a stable machine-readable ``code``, a message;
    ``field``, the request body's field it is about, is said in front of the message
    in the answer (``body.at: ...``, as for the fields pydantic checks)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
        *,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        check_code(status, code)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.field = field

    def answer(self) -> str:
        """The message as answered: with ``body.<field>: `` in front when ``field``."""
        return self.message if self.field is None else f"body.{self.field}: {self.message}"


def check_code(status: int, code: str) -> None:
    """Refuse a code (or a status) that :data:`ERROR_CODES` does not have for it."""
    expected = ERROR_CODES.get(code, (None, ""))[0]
    if expected != status:
        raise ValueError(f"error code {code!r} is not one of ERROR_CODES at status {status}")


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The JSON answer of one error (``code`` one of :data:`ERROR_CODES`)."""
    check_code(status, code)
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


@contextmanager
def facade_errors() -> Iterator[None]:
    """Map what the queue facade raises for bad input to :class:`ApiError`."""
    try:
        yield
    except ApiError:
        raise
    except DuplicateId as exc:
        raise ApiError(409, "duplicate_id", str(exc) or "duplicate id") from None
    except PayloadTooLarge as exc:
        raise ApiError(413, "payload_too_large", str(exc)) from None
    except LeaseLost as exc:
        raise ApiError(409, "lease_lost", str(exc) or "the lease is no longer held") from None
    except PayloadTooDeep as exc:
        raise ApiError(422, "payload_too_deep", str(exc)) from None
    except PayloadTooManyValues as exc:
        raise ApiError(422, "payload_too_many_values", str(exc)) from None
    except HeadersTooLarge as exc:
        raise ApiError(422, "message_headers_too_large", str(exc)) from None
    except InvalidName as exc:
        code = exc.code if exc.code in ("invalid_queue", "invalid_id") else "invalid_request"
        raise ApiError(422, code, str(exc)) from None
    except DurationError as exc:
        # Only these body fields reach the facade under their own name (lease_seconds
        # is "lease" there, horizon a query parameter).
        field = exc.argument if exc.argument in _BODY_TIMES else None
        raise ApiError(422, "invalid_request", str(exc), field=field) from None
    except (TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None


def _location(loc: tuple[Any, ...]) -> str:
    """A field's name in a message: ``body.delay``, ``query.limit``; a batch item's
    field as every batch error names it, ``item 3: delay``."""
    if len(loc) >= 3 and loc[:2] == ("body", "messages") and isinstance(loc[2], int):
        rest = ".".join(str(part) for part in loc[3:])
        return f"item {loc[2]}: {rest}" if rest else f"item {loc[2]}"
    return ".".join(str(part) for part in loc)


def _validation_message(errors: list[dict[str, Any]]) -> str:
    """One line for people: ``field: what is wrong`` per field. The errors of a
    union's branches (``body.delay.int``, ``body.delay.str``) become one
    ``body.delay: Input should be a number or a string``."""
    parts: dict[str, str] = {}
    branches: dict[str, list[str]] = {}
    for error in errors:
        loc = tuple(error.get("loc", ()))
        if error.get("type") == "null_time":  # a model's check of one of its fields
            loc = (*loc, error.get("ctx", {}).get("field", ""))
        if len(loc) > 1 and loc[-1] in _UNION_BRANCHES and error.get("type") != "missing":
            field = _location(loc[:-1])
            branches.setdefault(field, []).append(_UNION_BRANCHES[str(loc[-1])])
            parts.setdefault(field, "")
            continue
        if loc == ("body",) and error.get("type") == "missing":
            parts["body"] = "the request body is empty: send a JSON object"
            continue
        parts.setdefault(_location(loc), str(error.get("msg", "")))
    for field, kinds in branches.items():
        wanted = list(dict.fromkeys(kinds))
        if "a number" in wanted and "an integer" in wanted:
            wanted.remove("an integer")
        parts[field] = "Input should be " + " or ".join(wanted)
    text = "; ".join(f"{field}: {message}" for field, message in parts.items())
    return (text or "invalid request")[:_MAX_MESSAGE]


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.answer(), exc.headers)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    for error in errors:
        if error.get("type") == "json_invalid":
            reason = str(error.get("ctx", {}).get("error", ""))[:200]
            message = "the request body is not valid JSON" + (f": {reason}" if reason else "")
            return error_response(400, "malformed_json", message)
    return error_response(422, "invalid_request", _validation_message(errors))


def _allowed_methods(request: Request, fallback: str) -> str:
    """Every method some route of the app takes at the request's path (several routes
    may share a path, e.g. peek and put), ``HEAD`` with ``GET``, and ``OPTIONS``;
    ``fallback`` (the ``Allow`` of the one route Starlette matched) when no route is
    found that way (a mount, such as ``/static``)."""
    methods: set[str] = set()
    for method in _PROBED_METHODS:
        probe = {**request.scope, "method": method}
        for route in request.app.router.routes:
            if isinstance(route, Mount):
                continue
            if route.matches(probe)[0] is Match.FULL:
                methods.add(method)
                break
    if not methods:
        methods.update(part.strip() for part in fallback.split(",") if part.strip())
    if "GET" in methods:
        methods.add("HEAD")
    methods.add("OPTIONS")
    return ", ".join(sorted(methods))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status not in _HTTP_CODES:  # Starlette raises none other: one code, one status
        status = 400
    code = _HTTP_CODES[status]
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    where = f"{request.method} {request.url.path}"
    if status == 404 and message == "Not Found":
        message = f"no route {where} (the API is documented at /openapi.json)"
    elif status == 405:
        allowed = _allowed_methods(request, (exc.headers or {}).get("allow", ""))
        if request.method == "OPTIONS":
            # OPTIONS asks which methods a path takes: the answer, not an error.
            return Response(status_code=204, headers={"Allow": allowed})
        message = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
        return error_response(status, code, message, {"Allow": allowed})
    elif status == 400 and message == _UNDECODABLE_BODY:
        code, message = (
            "malformed_json",
            "the request body is not valid UTF-8 JSON (or nests too deep to read)",
        )
    return error_response(status, code, message, exc.headers)


async def _on_queue_closed(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "stopping", "the server is shutting down")


async def _on_backend_outage(request: Request, exc: Exception) -> JSONResponse:
    # The error's text names addresses and file paths: the log gets it, the client
    # only its kind (as /healthz).
    kind = type(exc).__name__
    detail = " ".join(str(exc).split())[:300]
    log_event(logging.WARNING, "api.backend_unavailable", path=request.url.path, error=kind,
              detail=detail)  # fmt: skip
    return error_response(
        503,
        "backend_unavailable",
        f"the backend does not answer ({kind}): see the server's log",
        {"Retry-After": _RETRY_AFTER},
    )


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log_raised(logging.ERROR, "api.failed", exc, path=request.url.path)
    return error_response(500, "internal_error", "the server failed to answer this request")


def install_error_handlers(app: FastAPI, outages: tuple[type[Exception], ...]) -> None:
    """Make every error of ``app`` answer in the ``{"error": ...}`` shape; ``outages``
    (what its backend raises when it does not answer) are a 503."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(QueueClosed, _on_queue_closed)
    for outage in outages:
        app.add_exception_handler(outage, _on_backend_outage)
    app.add_exception_handler(Exception, _on_unexpected)
