"""The guard's refusals on every unsafe method of every path the app has, routed or
not: a cross-site write is a 403, a foreign ``Host`` a 400, a token server's request
without its token a 401, and nothing is written.

The paths are read from ``create_app(...).routes`` when the tests are collected, so a
route added later is covered without a line here. Each path is tried with every
unsafe method, including those it does not route: the guard answers before the
router, and a 405 must not be where a write slips through."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from starlette.routing import BaseRoute, Mount, Route

try:  # FastAPI of late keeps an included router whole: this walks into it
    from fastapi.routing import iter_route_contexts
except ImportError:  # FastAPI before it flattens included routers into app.routes
    iter_route_contexts = None

from delayq.server import ServeConfig, create_app
from delayq.server._auth import OPEN_PATHS, OPEN_PREFIXES, SESSION_HEADER

from ._helpers import JSON_TYPE, TOKEN, error_of, put, signed_in
from .conftest import MakeClient

EVIL = "https://evil.example"
#: Every method that may change something, as the guard sees it (all but GET, HEAD,
#: OPTIONS), and one no route knows.
UNSAFE = ("POST", "PUT", "PATCH", "DELETE", "PROPPATCH")
#: The message the tests' paths name.
MESSAGE = "m"
_PARAM = re.compile(r"\{([^}:]+)(?::[^}]+)?\}")


def _concrete(template: str) -> str:
    """A path of the template that names queue ``q`` and message :data:`MESSAGE`."""

    def value(found: re.Match[str]) -> str:
        name = found.group(1)
        return {"queue": "q", "id": MESSAGE, "message_id": MESSAGE}.get(name, "x")

    return _PARAM.sub(value, template)


def _app_paths() -> dict[str, frozenset[str]]:
    """Each concrete path of the app's routes -> the methods routed there (a mount's
    path gets a file name under it, and no method)."""
    app = create_app(ServeConfig(url=f"memory://routes-{uuid.uuid4().hex}"))
    paths: dict[str, set[str]] = {}

    def walk(routes: list[BaseRoute], prefix: str) -> None:
        # Starlette's public route types, so the walk holds on every FastAPI the
        # server supports (FastAPI flattens included routers into app.routes).
        for route in routes:
            if isinstance(route, Mount):
                inner = route.routes
                if inner:
                    walk(list(inner), prefix + route.path)
                else:
                    paths.setdefault(prefix + route.path.rstrip("/") + "/any-file", set())
            elif isinstance(route, Route):
                template = prefix + route.path
                paths.setdefault(_concrete(template), set()).update(route.methods or ())

    if iter_route_contexts is None:
        walk(list(app.routes), "")
    else:
        for context in iter_route_contexts(app.routes):
            if isinstance(context.original_route, Mount):
                paths.setdefault(context.path.rstrip("/") + "/any-file", set())
            else:
                paths.setdefault(_concrete(context.path), set()).update(context.methods or ())
    return {path: frozenset(methods) for path, methods in paths.items()}


PATHS = _app_paths()
ALL = sorted(PATHS)


def test_the_routes_were_found() -> None:
    """The walk sees every kind of route: the API's, the dashboard's, the mounts."""
    assert PATHS["/v1/queues/q/messages/m"] >= {"GET", "DELETE"}
    assert "POST" in PATHS["/v1/queues/q/purge"]
    assert "POST" in PATHS["/logout"]
    assert "/static/any-file" in PATHS
    assert len(ALL) >= 25


def _seeded(client: Any, **headers: str) -> Any:
    """Put a message due in an hour (:data:`MESSAGE`) and a ready one; return the
    snapshot :func:`_state` gives."""
    for body in ({"id": MESSAGE, "payload": 1, "delay": "1h"}, {"id": "r", "payload": 2}):
        response = client.post("/v1/queues/q/messages", json=body, headers=headers)
        assert response.status_code == 201, response.text
    return _state(client, **headers)


def _state(client: Any, **headers: str) -> Any:
    """What a leaked write would change: the queue's counts and the message."""
    stats = client.get("/v1/queues/q/stats", headers=headers)
    message = client.get(f"/v1/queues/q/messages/{MESSAGE}", headers=headers)
    assert stats.status_code == 200, stats.text
    assert message.status_code == 200, message.text
    counts = {key: value for key, value in stats.json().items() if isinstance(value, int)}
    return counts, message.json()


def _send(client: Any, method: str, path: str, headers: dict[str, str]) -> Any:
    """``method path`` with a JSON body (so the guard's JSON rule is not the reason it
    is refused) and ``headers``."""
    return client.request(method, path, json={}, headers={**JSON_TYPE, **headers})


@pytest.mark.parametrize("path", ALL)
def test_a_cross_site_write_is_a_403(client: Any, path: str) -> None:
    before = _seeded(client)
    for method in UNSAFE:
        for headers in (
            {"Origin": EVIL},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            # The browser's word wins over a same-looking origin, and the other way.
            {"Origin": "http://localhost", "Sec-Fetch-Site": "cross-site"},
            {"Origin": EVIL, "Sec-Fetch-Site": "same-origin"},
        ):
            response = _send(client, method, path, headers)
            assert error_of(response, 403) == "cross_site_request", (method, headers)
    assert _state(client) == before


@pytest.mark.parametrize("path", ALL)
def test_a_write_to_a_foreign_host_is_a_400(client: Any, path: str) -> None:
    before = _seeded(client)
    for method in UNSAFE:
        for headers in ({"Host": "evil.example"}, {"Host": "evil.example", "Origin": EVIL}):
            response = _send(client, method, path, headers)
            assert error_of(response, 400) == "host_not_allowed", (method, headers)
    assert _state(client) == before


@pytest.mark.parametrize("path", ALL)
def test_a_token_server_refuses_a_write_without_the_token(
    make_client: MakeClient, path: str
) -> None:
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        pytest.skip("served without a token (its own tests say what it does)")
    client = make_client(token=TOKEN)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    before = _seeded(client, **bearer)
    refusals: list[dict[str, str]] = [
        {},
        {"Authorization": f"Basic {TOKEN}"},
        {SESSION_HEADER: "1.2.3"},
    ]
    if path.startswith("/v1/"):
        refusals.append(signed_in(client))  # a session alone writes only with X-Requested-With
    for method in UNSAFE:
        # A wrong token counts against the throttle: one per method stays under its burst.
        for headers in [*refusals, {"Authorization": "Bearer wrong-token"}]:
            response = _send(client, method, path, headers)
            assert error_of(response, 401) == "unauthorized", (method, headers)
            assert response.headers["www-authenticate"].startswith("Bearer")
        # The guard runs before the token: a cross-site write with the token is a 403.
        crossed = _send(client, method, path, {**bearer, "Origin": EVIL})
        assert error_of(crossed, 403) == "cross_site_request", method
    assert _state(client, **bearer) == before


@pytest.mark.parametrize("path", ALL)
def test_a_method_a_path_does_not_route_writes_nothing(client: Any, path: str) -> None:
    """A same-site request of a method the path does not take is a 405 whose ``Allow``
    does not name it (a 404 under a mount, or where the path also reads as a message
    id holding a "/"), and changes nothing."""
    before = _seeded(client)
    for method in UNSAFE:
        if method in PATHS[path]:
            continue
        response = _send(client, method, path, {"Origin": "http://localhost"})
        if response.status_code == 404 and path.startswith(
            ("/static/", "/docs/assets/", "/v1/queues/q/messages/")
        ):
            continue
        assert error_of(response, 405) == "method_not_allowed", (method, response.text)
        assert method not in response.headers["allow"].split(", ")
    assert _state(client) == before


def test_the_seeded_state_does_show_a_write(client: Any) -> None:
    """The witness of the tests above sees the writes a leak would make."""
    before = _seeded(client)
    reserved = client.post("/v1/queues/q/reserve", json={}, headers=JSON_TYPE)
    assert reserved.status_code == 200, reserved.text
    assert _state(client) != before
    deleted = client.request("DELETE", f"/v1/queues/q/messages/{MESSAGE}", headers=JSON_TYPE)
    assert deleted.status_code == 200, deleted.text
    assert client.get(f"/v1/queues/q/messages/{MESSAGE}").status_code == 404
    put(client, id=MESSAGE, delay="1h")
