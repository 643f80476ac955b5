"""Every error the HTTP API answers is ``{"error": {"code": ..., "message": ...}}``.

:class:`ApiError` is what a route raises on purpose; :func:`install_error_handlers`
turns it, FastAPI's validation errors, Starlette's HTTP errors (404, 405, ...) and the
delayq exceptions a route lets through into that shape, with the right status.
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
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._constants import LOGGER_NAME
from ..errors import DuplicateId, LeaseLost, PayloadTooLarge, QueueClosed

__all__ = ["ApiError", "error_response", "facade_errors", "install_error_handlers"]

_log = logging.getLogger(f"{LOGGER_NAME}.server")

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
    except (TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_argument", str(exc)) from None


def _location(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _validation_message(errors: list[dict[str, Any]]) -> str:
    parts = [
        f"{_location(tuple(error.get('loc', ())))}: {error.get('msg', '')}" for error in errors
    ]
    text = "; ".join(parts) or "invalid request"
    return text[:_MAX_MESSAGE]


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(error.get("type") == "json_invalid" for error in errors):
        return error_response(400, "malformed_json", "the request body is not valid JSON")
    return error_response(422, "invalid_request", _validation_message(errors))


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    return error_response(exc.status_code, code, message, exc.headers)


async def _on_queue_closed(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, "stopping", "the server is shutting down")


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    _log.error("request failed path=%s", request.url.path, exc_info=exc)
    return error_response(500, "internal_error", "the server failed to answer this request")


def install_error_handlers(app: FastAPI) -> None:
    """Make every error of ``app`` answer in the ``{"error": ...}`` shape."""
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(QueueClosed, _on_queue_closed)
    app.add_exception_handler(Exception, _on_unexpected)
