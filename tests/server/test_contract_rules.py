"""The HTTP API as a contract (issue 16): error codes as a closed set, one code per
kind of mistake, fields named in every 422, batch items named as ``item N: ...``,
time units that do not trap, and unknown query parameters refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from delayq.server._errors import ERROR_CODES, ApiError, error_response

from ._helpers import error_of, put, stats

README = Path(__file__).resolve().parents[2] / "README.md"


def test_error_codes_are_a_closed_set_in_the_document_and_the_readme(
    client: TestClient,
) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ErrorDetail"]
    assert schema["properties"]["code"]["enum"] == list(ERROR_CODES)
    text = README.read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z0-9_]+)` \| (\d{3}) \|", text, re.MULTILINE))
    assert listed == {(code, str(status)) for code, (status, _) in ERROR_CODES.items()}
    with pytest.raises(ValueError, match="ERROR_CODES"):
        ApiError(422, "invalid_argument", "a code nobody documented")
    with pytest.raises(ValueError, match="ERROR_CODES"):
        error_response(409, "not_found", "a code at another status")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"delay": True}, "delay"),
        ({"delay": "soon"}, "delay"),
        ({"delay": 1e30}, "delay"),
        ({"delay": None}, "delay"),
        ({"at": None}, "at"),
        ({"at": "tomorrow"}, "at"),
        ({"at": "2030-01-01T00:00:00"}, "at"),
        ({"at": 1e300}, "at"),
        ({"at_ms": None}, "at_ms"),
        ({"at_ms": 1.5}, "at_ms"),
        ({"at_ms": 10**16}, "at_ms"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"on_conflict": "merge"}, "on_conflict"),
        ({"dealy": 5}, "dealy"),
    ],
)
def test_one_code_per_kind_of_mistake_and_the_field_named(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/queues/q/messages", json={"payload": 1, **body})
    assert error_of(response, 422) == "invalid_request"
    assert re.search(rf"\b{field}\b", response.json()["error"]["message"])
    batch = client.post(
        "/v1/queues/q/messages/batch", json={"messages": [{"payload": 1}, {"payload": 1, **body}]}
    )
    assert error_of(batch, 422) == "invalid_request"
    message = batch.json()["error"]["message"]
    assert message.startswith("item 1: "), message
    assert re.search(rf"\b{field}\b", message)
    assert stats(client)["ready"] + stats(client)["scheduled"] == 0


@pytest.mark.parametrize("bad_id", ["x" * 256, ".", "..", "a\x00b", " a"])
def test_a_bad_id_is_invalid_id_on_writes_and_reads(client: TestClient, bad_id: str) -> None:
    response = client.post("/v1/queues/q/messages", json={"payload": 1, "id": bad_id})
    assert error_of(response, 422) == "invalid_id"
    batch = client.post(
        "/v1/queues/q/messages/batch", json={"messages": [{"payload": 1, "id": bad_id}]}
    )
    assert error_of(batch, 422) == "invalid_id"
    assert batch.json()["error"]["message"].startswith("item 0: ")
    if len(bad_id) > 255 or "\x00" in bad_id:  # what a read cannot address either
        read = client.get(f"/v1/queues/q/messages/{bad_id.replace(chr(0), '%00')}")
        assert error_of(read, 422) == "invalid_id"


def test_at_in_milliseconds_is_refused_naming_at_and_at_ms_takes_it(client: TestClient) -> None:
    now_ms = 1_800_000_000_123
    response = client.post("/v1/queues/q/messages", json={"payload": 1, "at": now_ms})
    assert error_of(response, 422) == "invalid_request"
    message = response.json()["error"]["message"]
    assert "at is epoch seconds" in message
    assert "at_ms" in message
    message_id = put(client, at_ms=now_ms)
    due_at = client.get(f"/v1/queues/q/messages/{message_id}").json()["due_at"]
    assert due_at == now_ms
    # A due_at read back goes in again as at_ms, to the millisecond, on every route.
    other = put(client, at_ms=due_at + 1)
    path = f"/v1/queues/q/messages/{other}/reschedule"
    assert client.post(path, json={"at_ms": due_at}).json()["due_at"] == due_at
    both = client.post("/v1/queues/q/messages", json={"payload": 1, "at": 5, "at_ms": 5})
    assert error_of(both, 422) == "invalid_request"


def test_at_ms_keeps_every_millisecond(client: TestClient) -> None:
    for due in (1_999_999_999_999, 4_102_444_800_007, 253_402_300_799_999):
        message_id = put(client, at_ms=due)
        assert client.get(f"/v1/queues/q/messages/{message_id}").json()["due_at"] == due


def test_a_null_delay_is_refused_on_the_fast_path_and_the_route(client: TestClient) -> None:
    # application/json is the fast path; the same request with a charset parameter is
    # not (FastPut takes exactly application/json): both answer alike.
    body = b'{"payload": 1, "delay": null}'
    answers = [
        client.post("/v1/queues/q/messages", content=body, headers={"content-type": kind})
        for kind in ("application/json", "application/json; charset=utf-8")
    ]
    assert answers[0].json() == answers[1].json()
    assert error_of(answers[0], 422) == "invalid_request"
    assert answers[0].json()["error"]["message"].startswith("body.delay: null")
    assert stats(client)["ready"] == 0
    # Omitted, it is due now.
    message_id = put(client)
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["state"] == "ready"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/queues/q/messages?limt=5"),
        ("GET", "/v1/queues/q/dead?limit=5&cursr=x"),
        ("GET", "/v1/queues?verbose=1"),
        ("GET", "/v1/queues/q/stats?x=1"),
        ("GET", "/v1/queues/q/messages/m1?x=1"),
        ("POST", "/v1/queues/q/messages?delay=5"),
        ("POST", "/v1/queues/q/reserve?max=5"),
    ],
)
def test_unknown_query_parameters_are_refused(client: TestClient, method: str, path: str) -> None:
    put(client, id="m1")
    body = {"payload": 2} if path.endswith("/messages?delay=5") else {}
    response = client.request(method, path, json=body)
    assert error_of(response, 422) == "invalid_request"
    unknown = path.rsplit("?", 1)[1].rsplit("&", maxsplit=1)[-1].split("=", maxsplit=1)[0]
    assert f"unknown parameter {unknown!r}" in response.json()["error"]["message"]
    assert stats(client)["ready"] == 1  # nothing written, nothing claimed
