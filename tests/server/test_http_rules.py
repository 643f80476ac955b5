"""The rules every request meets: the token, the body limit, JSON only, and errors
in one shape (400, 401, 404, 405, 413, 415) that change nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ._helpers import TOKEN, error_of, signed_in, stats
from .conftest import MakeClient

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def locked(make_client: MakeClient) -> TestClient:
    """A client of an app that requires TOKEN."""
    return make_client(token=TOKEN)


def test_without_a_token_configured_everything_is_open(client: TestClient) -> None:
    assert client.get("/v1/queues").status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-123"}, {"Authorization": f"Basic {TOKEN}"}],
)
def test_missing_or_wrong_token_is_401(locked: TestClient, headers: dict[str, str]) -> None:
    for method, path in (
        ("GET", "/v1/queues"),
        ("POST", "/v1/queues/q/messages"),
        ("GET", "/metrics"),
        ("GET", "/v1/nothing-here"),
    ):
        response = locked.request(method, path, headers=headers, json={"payload": 1})
        assert error_of(response, 401) == "unauthorized", path
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert locked.get("/v1/queues/q/stats", headers=BEARER).json()["ready"] == 0


def test_right_token_passes(locked: TestClient) -> None:
    response = locked.post("/v1/queues/q/messages", json={"payload": 1}, headers=BEARER)
    assert response.status_code == 201
    assert locked.get("/metrics", headers=BEARER).status_code == 200


def test_healthz_needs_no_token(locked: TestClient) -> None:
    assert locked.get("/healthz").json() == {"status": "ok"}


def test_the_api_description_needs_no_token(locked: TestClient) -> None:
    """Clients are generated from /openapi.json, protected server or not: it holds no
    data, and it says which operations take the token."""
    document = locked.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"
    put = document["paths"]["/v1/queues/{queue}/messages"]["post"]
    assert put["security"] == [{"bearerToken": []}, {}]
    assert "WWW-Authenticate" in put["responses"]["401"]["headers"]
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert error_of(locked.get("/docs"), 401) == "unauthorized"


def test_one_document_whatever_the_flags(client: TestClient, locked: TestClient) -> None:
    """A client generated from a server without a token knows the 401 and 429 of one
    with a token, and no OPTIONS operation (generators would make a function of
    each); every operation lists what the guard and the connection may answer."""
    document = client.get("/openapi.json").json()
    assert locked.get("/openapi.json").json() == document
    for path, operations in document["paths"].items():
        assert "options" not in operations, path
        for method, operation in operations.items():
            where = f"{method.upper()} {path}"
            answers = operation["responses"]
            assert {"400", "408", "431"} <= answers.keys(), where
            if method != "get":
                assert "403" in answers, where
            if "requestBody" in operation:
                assert operation["requestBody"]["required"] is True, where
                assert {"413", "415"} <= answers.keys(), where
            if path == "/healthz":
                continue
            assert operation["security"] == [{"bearerToken": []}, {}], where
            assert {"401", "429"} <= answers.keys(), where
            assert answers["429"]["headers"]["Retry-After"]["required"] is True, where
    options = client.options("/v1/queues/q/purge")
    assert options.status_code == 204
    assert options.headers["allow"] == "OPTIONS, POST"


@pytest.mark.parametrize("action", ["reserve", "dead/retry", "purge"])
def test_a_write_without_content_type_is_415_with_a_token_or_without(
    client: TestClient, locked: TestClient, action: str
) -> None:
    """The operations whose fields all have defaults: the document requires their
    body, and a request without one (or without Content-Type) is refused alike by a
    server without a token, sent or not, and by one with it: a bearer token exempts
    nothing, so code written against one server works against the other."""
    for round_, (app, headers) in enumerate(((client, {}), (client, BEARER), (locked, BEARER))):
        queue = f"q{round_}"
        app.post(f"/v1/queues/{queue}/messages", json={"payload": 1}, headers=headers)
        path = f"/v1/queues/{queue}/{action}"
        response = app.post(path, headers=headers)
        assert error_of(response, 415) == "unsupported_media_type", headers
        counts = app.get(f"/v1/queues/{queue}/stats", headers=headers).json()
        assert counts["ready"] == 1, headers  # nothing reserved, nothing purged
        assert app.post(path, json={}, headers=headers).status_code == 200, headers


def test_session_header_passes(locked: TestClient) -> None:
    cookie = signed_in(locked)
    assert locked.get("/v1/queues", headers=cookie).status_code == 200
    wrong = {name: value[:-4] + "0000" for name, value in cookie.items()}
    assert error_of(locked.get("/v1/queues", headers=wrong), 401) == "unauthorized"
    # A write on the strength of the session alone also needs X-Requested-With (no CSRF).
    bare = locked.post("/v1/queues/q/messages", json={"payload": 1}, headers=cookie)
    assert error_of(bare, 401) == "unauthorized"
    dashboard = {**cookie, "X-Requested-With": "delayq-dashboard"}
    ok = locked.post("/v1/queues/q/messages", json={"payload": 1}, headers=dashboard)
    assert ok.status_code == 201


def test_a_browser_without_the_cookie_is_sent_to_login(locked: TestClient) -> None:
    response = locked.get("/", headers={"Accept": "text/html"}, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/login")


@pytest.fixture
def small(make_client: MakeClient) -> TestClient:
    """A client of an app that reads bodies up to 2 KiB."""
    return make_client(max_body=2048)


def test_body_over_the_limit_is_413(small: TestClient) -> None:
    response = small.post("/v1/queues/q/messages", json={"payload": "x" * 4000})
    assert error_of(response, 413) == "body_too_large"
    assert stats(small)["ready"] == 0


def test_body_limit_does_not_trust_content_length(small: TestClient) -> None:
    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length at all
        yield b'{"payload": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    response = small.post(
        "/v1/queues/q/messages", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert error_of(response, 413) == "body_too_large"
    lying = small.post(
        "/v1/queues/q/messages",
        content=b'{"payload": "' + b"x" * 4000 + b'"}',
        headers={"Content-Type": "application/json", "Content-Length": "20"},
    )
    assert lying.status_code in (400, 413)
    assert stats(small)["ready"] == 0


def test_body_within_the_limit_passes(small: TestClient) -> None:
    response = small.post("/v1/queues/q/messages", json={"payload": "x" * 1500})
    assert response.status_code == 201


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_non_json_body_is_415(client: TestClient, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = client.post("/v1/queues/q/messages", content=b'{"payload": 1}', headers=headers)
    assert error_of(response, 415) == "unsupported_media_type"
    assert stats(client)["ready"] == 0


def test_json_with_charset_and_suffix_types_pass(client: TestClient) -> None:
    for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        response = client.post(
            "/v1/queues/q/messages",
            content=b'{"payload": 1}',
            headers={"Content-Type": content_type},
        )
        assert response.status_code == 201, content_type


@pytest.mark.parametrize("body", [b"{", b'{"payload": 1,}', b"\xff\xfe"])
def test_malformed_json_is_400(client: TestClient, body: bytes) -> None:
    response = client.post(
        "/v1/queues/q/messages", content=body, headers={"Content-Type": "application/json"}
    )
    assert error_of(response, 400) == "malformed_json"
    assert stats(client)["ready"] == 0


def test_json_that_is_not_an_object_is_422(client: TestClient) -> None:
    assert error_of(client.post("/v1/queues/q/messages", json=[1, 2]), 422) == "invalid_request"


def test_unknown_path_is_404_and_wrong_method_405(client: TestClient) -> None:
    assert error_of(client.get("/v1/nowhere"), 404) == "not_found"
    response = client.put("/v1/queues/q/messages", json={})
    assert error_of(response, 405) == "method_not_allowed"
    assert "POST" in response.headers["allow"]
