"""``/openapi.json`` as a contract that clients are generated from.

FastAPI writes the document from the routes and models; :func:`install_openapi`
amends it once, when it is first asked for. The document is the same whatever the
server's flags, so that a client generated from a server without a token works
against one with a token, and the other way:

* every operation is named by :func:`operation_id`, the camelCase of its route's
  name (``putMessage``, ``reserveMessages``), not FastAPI's path-derived names;
* the bearer token is a ``securitySchemes`` entry that every operation but those of
  ``/healthz`` accepts and does not demand (``security`` has ``{}`` too: a server
  started without a token needs none), with 401 and ``WWW-Authenticate`` and 429
  and ``Retry-After`` for a server that has one. ``/openapi.json`` itself is served
  without a token (see :data:`~._auth.OPEN_PATHS`);
* every request body is required, ``{}`` where every field has a default: a
  generated client then always sends JSON, which the request guard demands of every
  write (see :mod:`._guard`), with a token or without;
* each operation lists every answer it can give: 400 (a ``Host`` the server does not
  answer to, an unreadable request), 408 and 431 (the connection's limits) on all;
  403 on every write (one sent by another web site); 413 and 415 on those with a
  body; 422 where there are parameters or a body (under ``/v1`` an unknown query
  parameter is one); 503 may come with ``Retry-After``. A 405 answers a method
  the document does not list for the path, so no operation lists it;
* a request body's fields say their default in their description, not as
  ``default``: openapi-typescript (7.x, by default) makes a field with a ``default``
  required, so a client would have to send every option;
* ``OPTIONS`` is answered (204 with ``Allow``) but not listed: generators would make
  a function of each.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

__all__ = ["BEARER_SCHEME", "install_openapi", "operation_id"]

#: The name of the bearer token's entry in ``components.securitySchemes``.
BEARER_SCHEME = "bearerToken"
# Operations served without a token.
_OPEN_OPERATIONS = frozenset(("getHealth",))
# Answers only parameters or a body can cause.
_INPUT_STATUSES = ("422",)
_METHODS = ("get", "put", "post", "delete", "patch", "head")
_READS = frozenset(("get", "head"))
# What every operation, every write and every operation with a body may answer
# before it runs (the request guard, the body limit, the connection's limits).
_ANY_REQUEST = {
    "400": "The request cannot be read (bad_request), its Host is not one this server "
    "answers to (host_not_allowed), or its body is not JSON (malformed_json).",
    "408": "The request line and headers (header_timeout) or the body (body_timeout) did "
    "not arrive in time; the connection is closed.",
    "431": "The request line and headers are larger than the limit (headers_too_large).",
}
_WRITE = {
    "403": "A write sent by a page of another web site (cross_site_request).",
}
_WITH_BODY = {
    "413": "The request body (body_too_large) or the payload (payload_too_large) is too large.",
    "415": "The request is not application/json (unsupported_media_type): send that "
    "Content-Type, with {} for a body of defaults.",
}
_WITH_TOKEN = {
    "401": "Missing or wrong token (unauthorized), on a server started with one.",
    "429": "Too many wrong tokens from this address (too_many_attempts; on reserve also "
    "too_many_long_polls: too many waiting reserves from it); try again after "
    "Retry-After seconds.",
}


def operation_id(route: APIRoute) -> str:
    """The ``operationId`` of ``route``: its name in camelCase (``put_message`` is
    ``putMessage``)."""
    first, *rest = route.name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` (what ``/openapi.json`` serves) the amended document."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _amended(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]


def _header(description: str, *, example: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}, "example": example}


_HEADERS = {
    "WWW-Authenticate": _header(
        "How to authenticate: a bearer token.", example='Bearer realm="delayq"'
    ),
    "Retry-After": _header("Seconds to wait before trying again.", example="1"),
}


def _with_header(response: dict[str, Any], name: str, *, required: bool) -> None:
    response.setdefault("headers", {})[name] = {**_HEADERS[name], "required": required}


def _amended(document: dict[str, Any]) -> dict[str, Any]:
    components = document.setdefault("components", {})
    components["securitySchemes"] = {
        BEARER_SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "The server's token (--token-file or $DELAYQ_TOKEN): required by "
            "a server started with one; a server started without one takes every request "
            "without it (and ignores it when sent).",
        }
    }
    for schema in components.get("schemas", {}).values():
        if schema.get("additionalProperties") is False:  # a request's (extra="forbid")
            _defaults_described(schema)
    for path, operations in document.get("paths", {}).items():
        operations.pop("options", None)
        for method in _METHODS:
            operation = operations.get(method)
            if operation is not None:
                _amend_operation(operation, method=method, api=path.startswith("/v1/"))
    return document


def _defaults_described(schema: dict[str, Any]) -> None:
    for field in schema.get("properties", {}).values():
        if "default" in field:
            default = json.dumps(field.pop("default"))
            text = field.get("description", "").rstrip()
            field["description"] = f"{text} Default: {default}.".lstrip()


def _amend_operation(operation: dict[str, Any], *, method: str, api: bool) -> None:
    responses: dict[str, Any] = operation["responses"]
    answers = dict(_ANY_REQUEST)
    if method not in _READS:
        answers.update(_WRITE)
    body = operation.get("requestBody")
    if body is None:
        for status in _WITH_BODY:
            responses.pop(status, None)
        # An API operation refuses unknown query parameters: 422 even without any.
        if not operation.get("parameters") and not api:
            for status in _INPUT_STATUSES:
                responses.pop(status, None)
    else:
        body["required"] = True
        answers.update(_WITH_BODY)
    if operation.get("operationId") in _OPEN_OPERATIONS:
        operation["security"] = []
    else:
        operation["security"] = [{BEARER_SCHEME: []}, {}]
        answers.update(_WITH_TOKEN)
    for status, description in answers.items():
        responses[status] = _error_response(description)
    if "401" in responses:
        _with_header(responses["401"], "WWW-Authenticate", required=True)
    if "429" in responses:
        _with_header(responses["429"], "Retry-After", required=True)
    if "503" in responses:
        _with_header(responses["503"], "Retry-After", required=False)
    operation["responses"] = dict(sorted(responses.items()))


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
