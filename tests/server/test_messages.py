"""Messages by id over HTTP: put (one and batch), get, cancel, reschedule, and every
way each one refuses bad input without writing anything."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ._helpers import JSON_TYPE, error_of, put, stats


def test_put_then_get_round_trips_payload_and_fields(any_client: TestClient) -> None:
    before = time.time() * 1000
    response = any_client.post(
        "/v1/queues/orders/messages",
        json={
            "payload": {"order": 42, "items": [1, 2]},
            "delay": "30m",
            "id": "cancel:42",
            "max_attempts": 3,
            "headers": {"trace": "abc"},
        },
    )
    assert response.status_code == 201
    assert response.json() == {"id": "cancel:42", "queue": "orders", "created": True}
    message = any_client.get("/v1/queues/orders/messages/cancel:42").json()
    assert message["payload"] == {"order": 42, "items": [1, 2]}
    assert message["state"] == "scheduled"
    assert message["max_attempts"] == 3
    assert message["headers"] == {"trace": "abc"}
    assert message["callback"] is None
    assert before + 30 * 60_000 <= message["due_at"] <= time.time() * 1000 + 30 * 60_000 + 1


@pytest.mark.parametrize(
    ("due", "expected_ms"),
    [
        ({"at": "2099-01-01T01:00:00+01:00"}, 4070908800000),
        ({"at": "2099-01-01T00:00:00Z"}, 4070908800000),
        ({"at": 4070908800}, 4070908800000),
        ({"at": "4070908800.5"}, 4070908800500),
    ],
)
def test_at_takes_rfc3339_and_epoch_seconds(
    client: TestClient, due: dict[str, object], expected_ms: int
) -> None:
    message_id = put(client, **due)
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["due_at"] == expected_ms


def test_delay_takes_seconds_and_numeric_strings(client: TestClient) -> None:
    now = time.time() * 1000
    for delay in (90, 90.0, "90", "1m30s"):
        message_id = put(client, delay=delay)
        due = client.get(f"/v1/queues/q/messages/{message_id}").json()["due_at"]
        assert now + 90_000 <= due <= time.time() * 1000 + 90_001


def test_bytes_payload_round_trips_as_base64(any_client: TestClient) -> None:
    data = bytes(range(256))
    message_id = put(any_client, payload_base64=base64.b64encode(data).decode())
    del_payload = any_client.get(f"/v1/queues/q/messages/{message_id}").json()
    assert del_payload["payload"] is None
    assert base64.b64decode(del_payload["payload_base64"]) == data


def test_null_payload_is_a_payload(client: TestClient) -> None:
    message_id = put(client, payload=None)
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["payload"] is None


def test_a_put_says_whether_it_created_or_kept_the_message(any_client: TestClient) -> None:
    def send(**body: Any) -> tuple[int, Any]:
        response = any_client.post("/v1/queues/q/messages", json={"payload": 1, **body})
        return response.status_code, response.json()

    assert send(id="k", payload="first", delay=60) == (
        201,
        {"id": "k", "queue": "q", "created": True},
    )
    due = any_client.get("/v1/queues/q/messages/k").json()["due_at"]
    kept = (200, {"id": "k", "queue": "q", "created": False})
    assert send(id="k", payload="second") == kept
    assert send(id="k", payload="third", on_conflict="ignore", delay=0) == kept
    message = any_client.get("/v1/queues/q/messages/k").json()
    assert (message["payload"], message["due_at"]) == ("first", due)
    assert send(id="k", payload="fourth", on_conflict="replace") == (
        201,
        {"id": "k", "queue": "q", "created": True},
    )
    assert any_client.get("/v1/queues/q/messages/k").json()["payload"] == "fourth"


def test_a_batch_says_per_item_whether_it_created_or_kept(any_client: TestClient) -> None:
    batch = "/v1/queues/q/messages/batch"
    any_client.post("/v1/queues/q/messages", json={"payload": "old", "id": "a"})
    items = [
        {"payload": 1, "id": "a"},
        {"payload": 2, "id": "n"},
        {"payload": 3, "id": "n"},
        {"payload": 4, "id": "a", "on_conflict": "replace"},
        {"payload": 5, "id": "a"},
    ]
    response = any_client.post(batch, json={"messages": items})
    assert response.status_code == 201
    assert response.json() == {
        "ids": ["a", "n", "n", "a", "a"],
        "created": [False, True, False, True, False],
    }
    assert any_client.get("/v1/queues/q/messages/a").json()["payload"] == 4
    again = any_client.post(batch, json={"messages": [{"payload": 9, "id": "n"}]})
    assert again.status_code == 200
    assert again.json() == {"ids": ["n"], "created": [False]}


def test_on_conflict(client: TestClient) -> None:
    put(client, id="a", payload=1)
    assert put(client, id="a", payload=2) == "a"  # ignore keeps the first
    assert client.get("/v1/queues/q/messages/a").json()["payload"] == 1
    put(client, id="a", payload=3, on_conflict="replace")
    assert client.get("/v1/queues/q/messages/a").json()["payload"] == 3
    response = client.post(
        "/v1/queues/q/messages", json={"payload": 4, "id": "a", "on_conflict": "error"}
    )
    assert error_of(response, 409) == "duplicate_id"
    assert client.get("/v1/queues/q/messages/a").json()["payload"] == 3


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "missing_payload"),
        ({"payload": 1, "payload_base64": "AA=="}, "payload_conflict"),
        ({"payload_base64": "not base64!"}, "invalid_base64"),
        ({"payload": 1, "delay": "soon"}, "invalid_request"),
        ({"payload": 1, "delay": "nan"}, "invalid_request"),
        ({"payload": 1, "delay": True}, "invalid_request"),
        ({"payload": 1, "delay": 1, "at": 2}, "invalid_request"),
        ({"payload": 1, "at": "2030-01-01T00:00:00"}, "invalid_request"),
        ({"payload": 1, "at": "tomorrow"}, "invalid_request"),
        ({"payload": 1, "at": 1e300}, "invalid_request"),
        ({"payload": 1, "id": ""}, "invalid_id"),
        ({"payload": 1, "id": "a\nb"}, "invalid_id"),
        ({"payload": 1, "id": "a\u0000b"}, "invalid_id"),
        ({"payload": 1, "on_conflict": "merge"}, "invalid_request"),
        ({"payload": 1, "max_attempts": 0}, "invalid_request"),
        ({"payload": 1, "headers": {"a": 1}}, "invalid_request"),
        ({"payload": 1, "headers": {"delayq-callback": "{}"}}, "reserved_header"),
        ({"payload": 1, "priority": 5}, "invalid_request"),
        (
            {"payload": 1, "callback": {"url": "https://example.com/"}},
            "callback_queue_not_dispatched",
        ),
    ],
)
def test_bad_put_is_422_and_writes_nothing(
    client: TestClient, body: dict[str, object], code: str
) -> None:
    response = client.post("/v1/queues/q/messages", json=body)
    assert error_of(response, 422) == code
    assert stats(client)["scheduled"] + stats(client)["ready"] == 0


def test_bad_queue_name_is_422(client: TestClient) -> None:
    for name in ("a{b}", " padded", "x" * 256):
        response = client.post(f"/v1/queues/{name}/messages", json={"payload": 1})
        assert response.status_code == 422, name
    assert client.get("/v1/queues").json()["queues"] == []


def test_payload_over_the_queue_limit_is_413(make_client: object) -> None:
    client = make_client(max_body=4 * 1024 * 1024)  # type: ignore[operator]
    response = client.post("/v1/queues/q/messages", json={"payload": "x" * (1024 * 1024 + 1)})
    assert error_of(response, 413) == "payload_too_large"
    assert stats(client)["ready"] == 0


def test_batch_put_is_all_or_nothing(any_client: TestClient) -> None:
    response = any_client.post(
        "/v1/queues/q/messages/batch",
        json={"messages": [{"payload": 1, "id": "b1"}, {"payload": 2, "delay": "5m"}]},
    )
    assert response.status_code == 201
    ids = response.json()["ids"]
    assert ids[0] == "b1"
    assert len(ids) == 2
    bad = any_client.post(
        "/v1/queues/q/messages/batch",
        json={"messages": [{"payload": 3, "id": "b3"}, {"payload": 4, "delay": "never"}]},
    )
    assert error_of(bad, 422) == "invalid_request"
    dup = any_client.post(
        "/v1/queues/q/messages/batch",
        json={
            "messages": [
                {"payload": 5, "id": "b5"},
                {"payload": 6, "id": "b1", "on_conflict": "error"},
            ]
        },
    )
    assert error_of(dup, 409) == "duplicate_id"
    assert any_client.get("/v1/queues/q/messages/b3").status_code == 404
    assert any_client.get("/v1/queues/q/messages/b5").status_code == 404
    counts = stats(any_client)
    assert counts["ready"] + counts["scheduled"] == 2


def test_batch_limits(client: TestClient) -> None:
    empty = client.post("/v1/queues/q/messages/batch", json={"messages": []})
    assert error_of(empty, 422) == "invalid_request"
    many = client.post(
        "/v1/queues/q/messages/batch", json={"messages": [{"payload": i} for i in range(1001)]}
    )
    assert error_of(many, 422) == "invalid_request"
    bad_item = client.post(
        "/v1/queues/q/messages/batch", json={"messages": [{"payload": 1}, {"id": "x"}]}
    )
    assert error_of(bad_item, 422) == "missing_payload"
    assert "item 1: " in bad_item.json()["error"]["message"]
    assert stats(client)["ready"] == 0


def test_get_unknown_is_404(client: TestClient) -> None:
    assert error_of(client.get("/v1/queues/q/messages/nope"), 404) == "not_found"


def test_cancel(any_client: TestClient) -> None:
    message_id = put(any_client, delay="1h")
    response = any_client.delete(f"/v1/queues/q/messages/{message_id}")
    assert response.status_code == 200
    assert response.json() == {"cancelled": True}
    assert any_client.get(f"/v1/queues/q/messages/{message_id}").status_code == 404
    assert error_of(any_client.delete(f"/v1/queues/q/messages/{message_id}"), 404) == "not_found"


def test_cancel_and_reschedule_in_flight_are_409(client: TestClient) -> None:
    message_id = put(client)
    assert client.post("/v1/queues/q/reserve", json={}).json()["messages"][0]["id"] == message_id
    assert error_of(client.delete(f"/v1/queues/q/messages/{message_id}"), 409) == "in_flight"
    response = client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json={"delay": 5})
    assert error_of(response, 409) == "in_flight"
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["state"] == "active"


def test_reschedule(any_client: TestClient) -> None:
    message_id = put(any_client, delay="1h")
    response = any_client.post(
        f"/v1/queues/q/messages/{message_id}/reschedule", json={"at": "2099-01-01T00:00:00Z"}
    )
    assert response.status_code == 200
    assert response.json()["due_at"] == 4070908800000
    now = any_client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json={"delay": 0})
    assert now.json()["state"] == "ready"


def test_reschedule_without_a_time_is_422_and_moves_nothing(any_client: TestClient) -> None:
    message_id = put(any_client, delay="1h")
    before = any_client.get(f"/v1/queues/q/messages/{message_id}").json()
    path = f"/v1/queues/q/messages/{message_id}/reschedule"
    for response in (any_client.post(path, json={}), any_client.post(path, json={"delay": None})):
        assert error_of(response, 422) == "invalid_request"
        message = response.json()["error"]["message"]
        assert "delay" in message, message
    assert error_of(any_client.post(path, headers=JSON_TYPE), 422) == "invalid_request"
    assert any_client.get(f"/v1/queues/q/messages/{message_id}").json() == before


def test_reschedule_refusals(client: TestClient) -> None:
    response = client.post("/v1/queues/q/messages/nope/reschedule", json={"delay": 1})
    assert error_of(response, 404) == "not_found"
    message_id = put(client, delay="1h")
    bad = client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json={"delay": "x"})
    assert error_of(bad, 422) == "invalid_request"
    both = client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json={"delay": 1, "at": 1})
    assert error_of(both, 422) == "invalid_request"
    assert stats(client)["scheduled"] == 1
    lease = client.post("/v1/queues/q/reserve", headers=JSON_TYPE).json()["messages"]
    assert lease == []
    dead_id = put(client)
    held = client.post("/v1/queues/q/reserve", headers=JSON_TYPE).json()["messages"][0]
    client.post(
        f"/v1/queues/q/messages/{dead_id}/nack", json={"lease": held["lease"], "dead": True}
    )
    dead = client.post(f"/v1/queues/q/messages/{dead_id}/reschedule", json={"delay": 1})
    assert error_of(dead, 409) == "dead"


def test_callback_put_is_checked_and_stored(make_client: Any) -> None:
    client = make_client(callback_hosts=("hooks.example.com",))
    good = {"payload": 1, "callback": {"url": "https://hooks.example.com/x", "timeout": 5}}
    message_id = put(client, "callbacks", **good)
    callback = client.get(f"/v1/queues/callbacks/messages/{message_id}").json()["callback"]
    assert callback["url"] == "https://hooks.example.com/x"
    refused = client.post(
        "/v1/queues/callbacks/messages",
        json={"payload": 1, "callback": {"url": "https://evil.example.net/"}},
    )
    assert error_of(refused, 422) == "callback_host_not_allowed"
    invalid = client.post(
        "/v1/queues/callbacks/messages",
        json={"payload": 1, "callback": {"url": "ftp://hooks.example.com/"}},
    )
    assert error_of(invalid, 422) == "invalid_callback"
    assert stats(client, "callbacks")["ready"] == 1


def test_a_message_in_flight_shows_when_its_lease_expires_never_its_token(
    any_client: Any,
) -> None:
    message_id = put(any_client)
    held = any_client.post("/v1/queues/q/reserve", json={"lease": 600}).json()["messages"][0]
    assert held["lease"]
    assert held["lease_expires_at"]
    got = any_client.get(f"/v1/queues/q/messages/{message_id}").json()
    assert got["state"] == "active"
    assert got["lease_expires_at"] == held["lease_expires_at"]
    assert "lease" not in got or got["lease"] is None
    [listed] = any_client.get("/v1/queues/q/messages", params={"state": "active"}).json()[
        "messages"
    ]
    assert listed["lease_expires_at"] == held["lease_expires_at"]
    assert listed.get("lease") is None


def test_the_document_says_how_to_start_a_task(client: Any) -> None:
    """A task of an App is started by putting its envelope: the OpenAPI document,
    which other languages read, says so on the put's payload."""
    document = client.get("/openapi.json").json()
    payload = document["components"]["schemas"]["PutRequestBody"]["properties"]["payload"]
    assert '{"task": "name", "args": [...], "kwargs": {...}}' in payload["description"]
    assert {"task": "cancel_if_unpaid", "args": [42], "kwargs": {}} in payload["examples"]


def test_a_duplicate_in_a_batch_names_its_item_over_http(any_client: Any) -> None:
    put(any_client, id="a")
    batch = {
        "messages": [{"payload": 1, "id": "b"}, {"payload": 1, "id": "a", "on_conflict": "error"}]
    }
    response = any_client.post("/v1/queues/q/messages/batch", json=batch)
    assert error_of(response, 409) == "duplicate_id"
    assert response.json()["error"]["message"] == "item 1: a message with id 'a' exists"
    assert any_client.get("/v1/queues/q/messages/b").status_code == 404
