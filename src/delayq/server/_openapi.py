"""``/openapi.json`` as a contract that clients are generated from.

FastAPI writes the document from the routes and models; :func:`install_openapi`
amends it once, when it is first asked for:

* every operation is named by :func:`operation_id`, the camelCase of its route's
  name (``putMessage``, ``reserveMessages``), not FastAPI's path-derived names;
* the bearer token is a ``securitySchemes`` entry; when the server has a token, every
  operation but those of ``/healthz`` requires it (with 401 and ``WWW-Authenticate``,
  429 and ``Retry-After`` for a client that keeps sending a wrong one), else it is
  accepted and not needed (``security`` has ``{}`` too). ``/openapi.json`` itself is
  served without a token (see :data:`~._auth.OPEN_PATHS`);
* each operation lists the answers a client that follows the document can get: an
  operation without a request body never answers 400, 413 or 415, one without
  parameters or body never 422 (but under ``/v1`` an unknown query parameter is a
  422); 503 may come with ``Retry-After``, and so does 429
  on reserve (too many waiting reserves from one address);
* a request body's fields say their default in their description, not as
  ``default``: openapi-typescript (7.x, by default) makes a field with a ``default``
  required, so a client would have to send every option;
* each path has an ``OPTIONS`` operation: 204 with ``Allow``, the methods the path
  takes (a 405 for another method carries the same header).
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
_OPEN_PATHS = frozenset(("/healthz",))
# Answers only a request body can cause, and only parameters or a body.
_BODY_STATUSES = ("400", "413", "415")
_INPUT_STATUSES = ("422",)
_METHODS = ("get", "put", "post", "delete", "patch", "head")


def operation_id(route: APIRoute) -> str:
    """The ``operationId`` of ``route``: its name in camelCase (``put_message`` is
    ``putMessage``)."""
    first, *rest = route.name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


def install_openapi(app: FastAPI, *, token: bool) -> None:
    """Make ``app.openapi()`` (what ``/openapi.json`` serves) the amended document of
    a server with a token (``token``) or without."""

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _amended(FastAPI.openapi(app), token=token)
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]


def _header(description: str, *, example: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}, "example": example}


_HEADERS = {
    "WWW-Authenticate": _header(
        "How to authenticate: a bearer token.", example='Bearer realm="delayq"'
    ),
    "Retry-After": _header("Seconds to wait before trying again.", example="1"),
    "Allow": _header("The methods this path takes.", example="GET, HEAD, OPTIONS, POST"),
}


def _with_header(response: dict[str, Any], name: str, *, required: bool) -> None:
    response.setdefault("headers", {})[name] = {**_HEADERS[name], "required": required}


def _amended(document: dict[str, Any], *, token: bool) -> dict[str, Any]:
    components = document.setdefault("components", {})
    components["securitySchemes"] = {
        BEARER_SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "The server's token (--token-file or $DELAYQ_TOKEN); a server "
            "started without one takes every request without it.",
        }
    }
    for schema in components.get("schemas", {}).values():
        if schema.get("additionalProperties") is False:  # a request's (extra="forbid")
            _defaults_described(schema)
    for path, operations in document.get("paths", {}).items():
        path_parameters: list[dict[str, Any]] = []
        for method in _METHODS:
            operation = operations.get(method)
            if operation is None:
                continue
            _amend_operation(operation, token=token, api=path.startswith("/v1/"))
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter not in path_parameters:
                    path_parameters.append(parameter)
        operations["options"] = _options_operation(path, path_parameters, token=token)
    return document


def _defaults_described(schema: dict[str, Any]) -> None:
    for field in schema.get("properties", {}).values():
        if "default" in field:
            default = json.dumps(field.pop("default"))
            text = field.get("description", "").rstrip()
            field["description"] = f"{text} Default: {default}.".lstrip()


def _amend_operation(operation: dict[str, Any], *, token: bool, api: bool) -> None:
    responses: dict[str, Any] = operation["responses"]
    if "requestBody" not in operation:
        for status in _BODY_STATUSES:
            responses.pop(status, None)
        # An API operation refuses unknown query parameters: 422 even without any.
        if not operation.get("parameters") and not api:
            for status in _INPUT_STATUSES:
                responses.pop(status, None)
    if "429" in responses:  # reserve: too many waiting reserves from one address
        _with_header(responses["429"], "Retry-After", required=True)
    if "503" in responses:
        _with_header(responses["503"], "Retry-After", required=False)
    _secure(operation, open_=operation.get("operationId") in _OPEN_OPERATIONS, token=token)


def _secure(operation: dict[str, Any], *, open_: bool, token: bool) -> None:
    """``security`` and the answers that come with it: none for an open operation or
    a server without a token (which takes the token and needs none); else the bearer
    token, 401 with ``WWW-Authenticate``, 429 with ``Retry-After``."""
    responses: dict[str, Any] = operation["responses"]
    responses.pop("401", None)
    if open_:
        operation["security"] = []
    elif not token:
        operation["security"] = [{BEARER_SCHEME: []}, {}]
    else:
        operation["security"] = [{BEARER_SCHEME: []}]
        responses["401"] = _error_response("Missing or wrong token.")
        responses["429"] = _error_response(
            "Too many wrong tokens from this address (on reserve also: too many waiting "
            "reserves from it); try again after Retry-After seconds."
        )
        _with_header(responses["401"], "WWW-Authenticate", required=True)
        _with_header(responses["429"], "Retry-After", required=True)
    operation["responses"] = dict(sorted(responses.items()))


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }


def _options_operation(
    path: str, parameters: list[dict[str, Any]], *, token: bool
) -> dict[str, Any]:
    words = [part.strip("{}") for part in path.split("/") if part and part != "v1"]
    operation: dict[str, Any] = {
        "tags": ["operations"],
        "summary": "The methods this path takes",
        "description": "Answers 204 with Allow (a 405 for another method carries it too).",
        "operationId": "options" + "".join(word[:1].upper() + word[1:] for word in words),
        "responses": {"204": {"description": "The methods, in Allow."}},
    }
    _with_header(operation["responses"]["204"], "Allow", required=True)
    if parameters:  # any value: the answer does not look at them
        operation["parameters"] = [
            {"name": p["name"], "in": "path", "required": True, "schema": {"type": "string"}}
            for p in parameters
        ]
    _secure(operation, open_=path in _OPEN_PATHS, token=token)
    return operation
