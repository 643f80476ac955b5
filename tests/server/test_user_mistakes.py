"""What a user adopting ``delayq serve`` from another language runs into: the answer
to each mistake (or each plain HTTP habit) is a clear JSON error with the right
status, or the answer HTTP promises, never a 500 and never a silent surprise."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from delayq._names import check_queue_name
from delayq.server import ServeConfig

from ._helpers import TOKEN, error_of, put, signed_in, stats
from .conftest import MakeClient
from .test_serve_command import _environ


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- the backend is down -------------------------------------------------------------


@pytest.fixture
def redis_down(make_client: MakeClient) -> TestClient:
    """A server whose Redis URL points at a closed port."""
    return make_client(f"redis://127.0.0.1:{_closed_port()}/0?prefix=delayq-test-down")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/queues/q/messages", {"payload": 1}),
        ("POST", "/v1/queues/q/messages/batch", {"messages": [{"payload": 1}]}),
        ("GET", "/v1/queues/q/messages/some-id", None),
        ("GET", "/v1/queues", None),
        ("GET", "/v1/queues/q/stats", None),
        ("POST", "/v1/queues/q/reserve", {"wait": 0}),
    ],
)
def test_a_backend_that_does_not_answer_is_503_not_500(
    redis_down: TestClient, method: str, path: str, body: object
) -> None:
    response = redis_down.request(method, path, json=body)
    assert error_of(response, 503) == "backend_unavailable"
    message = response.json()["error"]["message"]
    assert "backend does not answer (ServerRefused)" in message  # one class, any backend
    assert "127.0.0.1" not in message  # where the backend is goes to the log only
    assert response.headers["retry-after"] == "1"


def test_healthz_is_503_when_the_backend_is_down(redis_down: TestClient) -> None:
    assert error_of(redis_down.get("/healthz"), 503) == "backend_unavailable"


# -- ids and queue names no URL can carry --------------------------------------------


@pytest.mark.parametrize("message_id", [".", ".."])
def test_dot_ids_are_refused_at_put(client: TestClient, message_id: str) -> None:
    response = client.post("/v1/queues/q/messages", json={"payload": 1, "id": message_id})
    assert error_of(response, 422) == "invalid_id"
    batch = client.post(
        "/v1/queues/q/messages/batch",
        json={"messages": [{"payload": 1}, {"payload": 2, "id": message_id}]},
    )
    assert error_of(batch, 422) == "invalid_id"
    assert stats(client)["ready"] == 0


def test_ids_with_odd_characters_round_trip(client: TestClient) -> None:
    # (An id with "%2F" works over real HTTP too, but TestClient decodes paths twice.)
    for message_id in ("a b", "héllo✓", "?x", "#x", "..x", "a%b"):
        put(client, id=message_id)
        encoded = "".join(
            ch if ch.isascii() and ch.isalnum() else "".join(f"%{b:02X}" for b in ch.encode())
            for ch in message_id
        )
        response = client.get(f"/v1/queues/q/messages/{encoded}")
        assert response.status_code == 200, message_id
        assert response.json()["id"] == message_id


def test_dot_queue_names_are_refused(client: TestClient) -> None:
    response = client.post("/v1/queues/%2E/messages", json={"payload": 1})
    assert error_of(response, 422) == "invalid_queue"
    for name in (".", "..", "a{b", " a", "a/b"):
        with pytest.raises(ValueError, match="queue name"):
            check_queue_name(name)


def test_a_callback_queue_the_server_cannot_serve_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="callback queue"):
        ServeConfig(url="memory://x", callback_queues=("a{b",))


def test_serve_with_a_bad_callback_queue_is_one_line_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "serve", "--port", "0",
         "--url", f"sqlite:///{tmp_path}/s.db", "--callback-queue", "a{b"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_environ(),
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "callback queue" in lines[0]


# -- HEAD, OPTIONS, 404, 405 ---------------------------------------------------------


def test_head_answers_like_get_without_a_body(client: TestClient) -> None:
    health = client.head("/healthz")
    assert health.status_code == 200
    assert health.content == b""
    message_id = put(client, payload={"big": "x" * 100})
    got = client.get(f"/v1/queues/q/messages/{message_id}")
    head = client.head(f"/v1/queues/q/messages/{message_id}")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"]
    assert client.head("/v1/queues/q/messages/nope").status_code == 404
    assert client.head("/").status_code == 200


def test_options_lists_the_methods_of_a_path(client: TestClient) -> None:
    response = client.options("/v1/queues/q/messages")
    assert response.status_code == 204
    allowed = {part.strip() for part in response.headers["allow"].split(",")}
    assert allowed == {"GET", "HEAD", "POST", "OPTIONS"}
    assert client.options("/v1/nowhere").status_code == 404


def test_405_names_the_method_and_every_allowed_one(client: TestClient) -> None:
    response = client.put("/v1/queues/q/messages", json={"payload": 1})
    assert error_of(response, 405) == "method_not_allowed"
    message = response.json()["error"]["message"]
    assert "PUT" in message
    assert "/v1/queues/q/messages" in message
    assert {"GET", "POST"} <= {part.strip() for part in response.headers["allow"].split(",")}
    reserve = client.get("/v1/queues/q/reserve")
    assert error_of(reserve, 405) == "method_not_allowed"
    assert "POST" in reserve.json()["error"]["message"]


def test_404_of_an_unknown_route_names_it(client: TestClient) -> None:
    response = client.get("/v1/nowhere")
    assert error_of(response, 404) == "not_found"
    assert "GET /v1/nowhere" in response.json()["error"]["message"]


# -- bodies --------------------------------------------------------------------------


def test_a_wrong_type_in_a_union_field_is_one_message_per_field(client: TestClient) -> None:
    delay = client.post("/v1/queues/q/messages", json={"payload": 1, "delay": True})
    assert error_of(delay, 422) == "invalid_request"
    assert delay.json()["error"]["message"] == "body.delay: Input should be a number or a string"
    wait = client.post("/v1/queues/q/reserve", json={"wait": "5s"})
    assert wait.json()["error"]["message"] == "body.wait: Input should be a number"


def test_an_unknown_field_is_refused_by_name(client: TestClient) -> None:
    response = client.post("/v1/queues/q/messages", json={"payload": 1, "dealy": 5})
    assert error_of(response, 422) == "invalid_request"
    assert "body.dealy" in response.json()["error"]["message"]
    assert stats(client)["ready"] == 0


def test_an_empty_body_says_so(client: TestClient) -> None:
    response = client.post("/v1/queues/q/messages", headers={"content-type": "application/json"})
    assert error_of(response, 422) == "invalid_request"
    assert "body is empty" in response.json()["error"]["message"]


def test_a_body_that_is_not_utf8_is_malformed_json(client: TestClient) -> None:
    response = client.post(
        "/v1/queues/q/messages",
        content=b'{"payload": "\xe9"}',
        headers={"content-type": "application/json"},
    )
    assert error_of(response, 400) == "malformed_json"


def test_415_says_what_was_sent_and_what_to_send(client: TestClient) -> None:
    form = client.post(
        "/v1/queues/q/messages",
        content=b'{"payload": 1}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert error_of(form, 415) == "unsupported_media_type"
    message = form.json()["error"]["message"]
    assert "application/x-www-form-urlencoded" in message
    assert "Content-Type: application/json" in message


def test_a_write_on_the_session_alone_says_what_is_missing(make_client: MakeClient) -> None:
    locked = make_client(token=TOKEN)
    cookie = signed_in(locked)
    response = locked.post("/v1/queues/q/messages", json={"payload": 1}, headers=cookie)
    assert error_of(response, 401) == "unauthorized"
    assert "X-Requested-With" in response.json()["error"]["message"]


def test_receivers_verify_with_the_readme_recipe() -> None:
    """The README's Python recipe, and ``delayq.server.verify``, accept what the
    dispatcher signs (``sign``) and refuse a changed body."""
    import hashlib  # noqa: PLC0415
    import hmac  # noqa: PLC0415
    import time  # noqa: PLC0415

    from delayq.server import sign, verify  # noqa: PLC0415

    secret, body, now = "a-secret", b'{"order": 42}', int(time.time())
    header = sign(secret, now, body)
    fields = dict(part.split("=", 1) for part in header.split(","))
    expected = hmac.new(secret.encode(), f"{now}.".encode() + body, hashlib.sha256).hexdigest()
    assert fields == {"t": str(now), "v1": expected}
    assert verify(secret, header, body)
    assert not verify(secret, header, body + b" ")
