"""Errors inside the schema (issue 35, point 6): a request the HTTP parser cannot read,
a number JSON does not have, a duration or time the parser refuses, a name in the path
that is not UTF-8. Each is the API's JSON error with the code the README lists, and
changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ._helpers import JSON_TYPE, error_of, put, stats
from .test_serve_hardening import _read_all, serving

# The fast path of puts takes exactly application/json; with a parameter the route
# answers: both must say the same.
BOTH_PATHS = ("application/json", "application/json; charset=utf-8")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_malformed_content_length_is_a_json_bad_request(tmp_path: Path) -> None:
    """The README's own example of ``bad_request``, through uvicorn's parser."""
    with serving(tmp_path, url="memory://shapes") as server:
        for length in (b"abc", b"1x", b"-1"):
            with server.connect() as sock:
                sock.sendall(
                    b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: localhost\r\n"
                    b"Content-Type: application/json\r\nContent-Length: " + length + b"\r\n\r\n"
                    b'{"payload": 1}'
                )
                answer = _read_all(sock)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), answer
            assert b"content-type: application/json" in head.lower(), answer
            error = json.loads(body)["error"]
            assert error["code"] == "bad_request", answer
            assert "Content-Length" in error["message"]
        assert server.healthy()


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1E400",
                                    "1" + "0" * 400 + ".5"])  # fmt: skip
def test_numbers_json_does_not_have_are_malformed_json(client: TestClient, number: str) -> None:
    bodies = [
        ("/v1/queues/q/messages", f'{{"payload": {number}}}'),
        ("/v1/queues/q/messages", f'{{"payload": {{"deep": [1, {number}]}}}}'),
        ("/v1/queues/q/messages", f'{{"payload": 1, "delay": {number}}}'),
        ("/v1/queues/q/messages/batch", f'{{"messages": [{{"payload": {number}}}]}}'),
        ("/v1/queues/q/reserve", f'{{"wait": {number}}}'),
    ]
    for path, body in bodies:
        for kind in BOTH_PATHS:
            response = client.post(path, content=body, headers={"content-type": kind})
            assert error_of(response, 400) == "malformed_json", (path, body, kind)
            assert "not valid JSON" in response.json()["error"]["message"]
    assert stats(client)["ready"] == 0
    # The words in a string, and large finite numbers, are JSON.
    fine = {"payload": {"text": "NaN Infinity 1e400", "big": 1.5e308, "int": 10**30}}
    assert client.post("/v1/queues/q/messages", json=fine).status_code == 201


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("delay", "5 s", "unknown duration '5 s'"),
        ("delay", "1h1h", "unknown duration '1h1h'"),
        ("at", "tomorrow", "RFC 3339"),
        ("at", "2030-01-01T00:00:00", "time zone offset"),
        ("at", 1_800_000_000_000, "at_ms"),
        ("at_ms", 10**16, "out of range"),
    ],
)
def test_a_duration_or_time_refused_names_its_field_as_the_readme_says(
    client: TestClient, field: str, value: Any, words: str
) -> None:
    """``body.delay: ...`` on every route that takes it; a batch item's error starts
    with its index."""
    kept = put(client, id="kept", delay="1h")
    answers = [
        client.post("/v1/queues/q/messages", json={"payload": 1, field: value}),
        client.post(f"/v1/queues/q/messages/{kept}/reschedule", json={field: value}),
    ]
    for answer in answers:
        assert error_of(answer, 422) == "invalid_request"
        message = answer.json()["error"]["message"]
        assert message.startswith(f"body.{field}: "), message
        assert words in message, message
    batch = client.post(
        "/v1/queues/q/messages/batch", json={"messages": [{"payload": 1, field: value}]}
    )
    assert error_of(batch, 422) == "invalid_request"
    assert batch.json()["error"]["message"].startswith("item 0: ")
    assert stats(client)["scheduled"] == 1


def test_a_nack_delay_refused_names_its_field(client: TestClient) -> None:
    put(client)
    held = client.post("/v1/queues/q/reserve", json={}).json()["messages"][0]
    path = f"/v1/queues/q/messages/{held['id']}/nack"
    answer = client.post(path, json={"lease": held["lease"], "delay": "5 s"})
    assert error_of(answer, 422) == "invalid_request"
    assert answer.json()["error"]["message"].startswith("body.delay: unknown duration '5 s'")
    assert stats(client)["active"] == 1


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/v1/queues/q/messages/a%FFb", "invalid_id"),
        ("HEAD", "/v1/queues/q/messages/a%FFb", "invalid_id"),
        ("DELETE", "/v1/queues/q/messages/a%FFb", "invalid_id"),
        ("POST", "/v1/queues/q/messages/a%C3b/ack", "invalid_id"),
        ("GET", "/v1/queues/q%FF/messages/ab", "invalid_queue"),
        ("GET", "/v1/queues/q%FF/stats", "invalid_queue"),
        ("POST", "/v1/queues/q%FF/messages", "invalid_queue"),
    ],
)
def test_a_name_in_the_path_that_is_not_utf8_is_a_422(
    client: TestClient, method: str, path: str, code: str
) -> None:
    """Not a 404 about a name with U+FFFD in it, which nobody sent."""
    body = {"lease": "x"} if path.endswith("/ack") else {"payload": 1}
    response = client.request(method, path, json=None if method in ("GET", "HEAD") else body)
    if method == "HEAD":
        assert response.status_code == 422
        return
    assert error_of(response, 422) == code
    assert "not UTF-8" in response.json()["error"]["message"]
    assert "\ufffd" not in response.json()["error"]["message"]


def test_a_name_with_a_replacement_character_sent_as_utf8_is_served(client: TestClient) -> None:
    put(client, id="a\ufffdb")
    got = client.get("/v1/queues/q/messages/a%EF%BF%BDb")
    assert got.status_code == 200, got.text
    assert got.json()["id"] == "a\ufffdb"
    missing = client.get("/v1/queues/q/messages/other%EF%BF%BD")
    assert error_of(missing, 404) == "not_found"
    assert client.post("/v1/queues/q/purge", headers=JSON_TYPE).status_code == 200
