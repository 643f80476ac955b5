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

from .._names import InvalidName
from .._outage import backend_outages
from .._runtime import log_event, log_raised
from ..durable.message import HeadersTooLarge
from ..durable.serializer import PayloadTooDeep
from ..errors import DuplicateId, LeaseLost, PayloadTooLarge, QueueClosed

__all__ = [
    "BACKEND_OUTAGES",
    "ApiError",
    "error_response",
    "facade_errors",
    "install_error_handlers",
]


#: The ``code`` of a Starlette HTTP error, by status.
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
}
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


#: Exceptions a route lets through when the backend is down: answered 503.
BACKEND_OUTAGES = backend_outages()


class ApiError(Exception):
    """An error answer: ``status``, a stable machine-readable ``code``, a message."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The JSON answer of one error."""
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
    except HeadersTooLarge as exc:
        raise ApiError(422, "headers_too_large", str(exc)) from None
    except InvalidName as exc:
        raise ApiError(422, exc.code, str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_argument", str(exc)) from None


def _location(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _validation_message(errors: list[dict[str, Any]]) -> str:
    """One line for people: ``field: what is wrong`` per field. The errors of a
    union's branches (``body.delay.int``, ``body.delay.str``) become one
    ``body.delay: Input should be a number or a string``."""
    parts: dict[str, str] = {}
    branches: dict[str, list[str]] = {}
    for error in errors:
        loc = tuple(error.get("loc", ()))
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
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(error.get("type") == "json_invalid" for error in errors):
        return error_response(400, "malformed_json", "the request body is not valid JSON")
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
    code = _HTTP_CODES.get(status, "http_error")
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


def install_error_handlers(app: FastAPI) -> None:
    """Make every error of ``app`` answer in the ``{"error": ...}`` shape."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(QueueClosed, _on_queue_closed)
    for outage in BACKEND_OUTAGES:
        app.add_exception_handler(outage, _on_backend_outage)
    app.add_exception_handler(Exception, _on_unexpected)
