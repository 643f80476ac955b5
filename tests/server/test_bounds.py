"""Inputs at the edge of what the server can store and serve back: out-of-range
numbers, payloads nested too deep, records it cannot decode, oversized headers, and
queue names that do not exist. Each is a clear 4xx before anything is written, or,
for a stored record, an answer about that one message, never a 500."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ._helpers import error_of, put, stats

_JSON = {"content-type": "application/json"}

# -- numbers out of range (issue 14, point 10) ----------------------------------------

#: Numbers a JSON body may carry that no time fits: too large once in milliseconds,
#: beyond a float (Python's JSON reader turns 1e999 into infinity), not numbers at all.
OUT_OF_RANGE = ["1e308", '"1e308"', "1e999", "NaN", "Infinity", "-Infinity", "1" + "0" * 400]

_CALLBACK = '"callback": {"url": "https://example.com/x", "timeout": %s}'
#: ``(method, path, body)`` with ``%s`` where the number goes.
NUMERIC_FIELDS = [
    ("POST", "/v1/queues/q/messages", '{"payload": 1, "delay": %s}'),
    ("POST", "/v1/queues/q/messages", '{"payload": 1, "at": %s}'),
    (
        "POST",
        "/v1/queues/q/messages/batch",
        '{"messages": [{"payload": 1}, {"payload": 2, "delay": %s}]}',
    ),
    (
        "POST",
        "/v1/queues/q/messages/batch",
        '{"messages": [{"payload": 1}, {"payload": 2, "at": %s}]}',
    ),
    ("POST", "/v1/queues/q/messages/m/reschedule", '{"delay": %s}'),
    ("POST", "/v1/queues/q/messages/m/reschedule", '{"at": %s}'),
    ("POST", "/v1/queues/q/reserve", '{"lease": %s}'),
    ("POST", "/v1/queues/q/reserve", '{"wait": %s}'),
    ("POST", "/v1/queues/q/reserve", '{"max": %s}'),
    ("POST", "/v1/queues/callbacks/messages", '{"payload": 1, ' + _CALLBACK + "}"),
]


@pytest.mark.parametrize("number", OUT_OF_RANGE)
@pytest.mark.parametrize(("method", "path", "template"), NUMERIC_FIELDS)
def test_an_out_of_range_number_is_422_and_writes_nothing(
    client: TestClient, number: str, method: str, path: str, template: str
) -> None:
    put(client, id="m", delay=60)
    before = client.get("/v1/queues/q/messages/m").json()
    response = client.request(method, path, content=template % number, headers=_JSON)
    error_of(response, 422)
    assert client.get("/v1/queues/q/messages/m").json() == before
    assert stats(client)["scheduled"] == 1
    assert stats(client, "callbacks")["scheduled"] == 0


@pytest.mark.parametrize("number", OUT_OF_RANGE)
def test_out_of_range_numbers_of_a_held_message_are_422(client: TestClient, number: str) -> None:
    put(client, id="m")
    [held] = client.post("/v1/queues/q/reserve", json={"lease": 60}).json()["messages"]
    for path, template in (
        ("nack", '{"lease": "%s", "delay": %s}'),
        ("extend", '{"lease": "%s", "lease_seconds": %s}'),
    ):
        response = client.post(
            f"/v1/queues/q/messages/m/{path}",
            content=template % (held["lease"], number),
            headers=_JSON,
        )
        error_of(response, 422)
    after = client.get("/v1/queues/q/messages/m").json()
    assert (after["state"], after["attempts"], after["lease_expires_at"]) == ("active", 1, None)
    assert client.post("/v1/queues/q/messages/m/ack", json={"lease": held["lease"]}).json() == {
        "acked": True
    }


def test_delay_1e308_says_what_is_wrong(client: TestClient) -> None:
    response = client.post("/v1/queues/q/messages", json={"payload": 1, "delay": 1e308})
    assert error_of(response, 422) == "invalid_argument"
    assert "out of range" in response.json()["error"]["message"]


@pytest.mark.parametrize("field", ["delay", "at"])
def test_a_hugely_negative_time_means_now(client: TestClient, field: str) -> None:
    message_id = put(client, **{field: -1e308})
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["state"] == "ready"
    moved = client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json={field: -1e308})
    assert moved.status_code == 200, moved.text
    assert moved.json()["state"] == "ready"
