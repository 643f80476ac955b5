"""Consuming over HTTP: reserve (with long-poll), ack, nack, extend, release."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ._helpers import JSON_TYPE, error_of, put, stats


def reserve(client: TestClient, queue: str = "q", **body: Any) -> list[dict[str, Any]]:
    response = client.post(f"/v1/queues/{queue}/reserve", json=body)
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def test_reserve_ack_round_trip(any_client: TestClient) -> None:
    first, second = put(any_client, payload="a"), put(any_client, payload="b")
    put(any_client, payload="later", delay="1h")
    messages = reserve(any_client, max=10, lease=60)
    assert [m["id"] for m in messages] == [first, second]
    held = messages[0]
    assert held["state"] == "active"
    assert held["attempts"] == 1
    assert held["lease"]
    assert held["lease_expires_at"] >= time.time() * 1000 + 59_000
    for message in messages:
        response = any_client.post(
            f"/v1/queues/q/messages/{message['id']}/ack", json={"lease": message["lease"]}
        )
        assert response.json() == {"acked": True}
    counts = stats(any_client)
    assert (counts["active"], counts["scheduled"]) == (0, 1)
    assert reserve(any_client) == []


def test_reserve_without_body_takes_one(client: TestClient) -> None:
    put(client)
    put(client)
    response = client.post("/v1/queues/q/reserve", headers=JSON_TYPE)
    assert len(response.json()["messages"]) == 1


@pytest.mark.parametrize(
    "body",
    [{"max": 0}, {"max": 1001}, {"lease": 0}, {"wait": 31}, {"wait": -1}, {"max": "2"}, {"x": 1}],
)
def test_bad_reserve_is_422(client: TestClient, body: dict[str, object]) -> None:
    put(client)
    assert error_of(client.post("/v1/queues/q/reserve", json=body), 422) == "invalid_request"
    assert stats(client)["ready"] == 1


def test_stale_lease_is_409_lease_lost(client: TestClient) -> None:
    message_id = put(client)
    held = reserve(client, lease=60)[0]
    for action, body in (
        ("ack", {"lease": "wrong"}),
        ("nack", {"lease": "wrong"}),
        ("extend", {"lease": "wrong"}),
        ("release", {"lease": "wrong"}),
    ):
        response = client.post(f"/v1/queues/q/messages/{message_id}/{action}", json=body)
        assert error_of(response, 409) == "lease_lost", action
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["state"] == "active"
    client.post(f"/v1/queues/q/messages/{message_id}/ack", json={"lease": held["lease"]})
    # Acked, the queue no longer holds the id: as for any id it does not hold, 404.
    again = client.post(f"/v1/queues/q/messages/{message_id}/ack", json={"lease": held["lease"]})
    assert error_of(again, 404) == "not_found"


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("ack", {"lease": "x"}),
        ("nack", {"lease": "x"}),
        ("extend", {"lease": "x"}),
        ("release", {"lease": "x"}),
        ("reschedule", {"delay": 1}),
        ("reschedule", {"at_ms": 1}),
    ],
)
def test_an_unknown_id_is_404_on_every_operation_by_id(
    any_client: TestClient, action: str, body: dict[str, object]
) -> None:
    put(any_client, id="known")
    response = any_client.post(f"/v1/queues/q/messages/unknown/{action}", json=body)
    assert error_of(response, 404) == "not_found"
    assert "'unknown'" in response.json()["error"]["message"]
    # A known id whose lease is not this token: 409 lease_lost on every lease route.
    if action != "reschedule":
        reserve(any_client)
        response = any_client.post(f"/v1/queues/q/messages/known/{action}", json=body)
        assert error_of(response, 409) == "lease_lost"


def test_nack_uses_the_backoff_then_dead(any_client: TestClient) -> None:
    message_id = put(any_client, max_attempts=2)
    held = reserve(any_client)[0]
    before = time.time() * 1000
    response = any_client.post(
        f"/v1/queues/q/messages/{message_id}/nack", json={"lease": held["lease"], "error": "boom"}
    )
    assert response.json() == {"state": "scheduled"}
    message = any_client.get(f"/v1/queues/q/messages/{message_id}").json()
    assert message["last_error"] == "boom"
    assert message["due_at"] >= before + 800  # the default policy's first backoff: ~1 s
    any_client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json={"delay": 0})
    held = reserve(any_client)[0]
    response = any_client.post(
        f"/v1/queues/q/messages/{message_id}/nack", json={"lease": held["lease"], "delay": 0}
    )
    assert response.json() == {"state": "dead"}
    metrics = any_client.get("/metrics").text
    assert 'delayq_nacks_total{queue="q"} 2.0' in metrics
    assert 'delayq_dead_total{queue="q"} 1.0' in metrics


def test_nack_delay_and_dead(client: TestClient) -> None:
    message_id = put(client)
    held = reserve(client)[0]
    bad = client.post(
        f"/v1/queues/q/messages/{message_id}/nack",
        json={"lease": held["lease"], "delay": 5, "dead": True},
    )
    assert error_of(bad, 422) == "invalid_request"
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["state"] == "active"
    response = client.post(
        f"/v1/queues/q/messages/{message_id}/nack", json={"lease": held["lease"], "delay": "1h"}
    )
    assert response.json() == {"state": "scheduled"}
    assert (
        client.get(f"/v1/queues/q/messages/{message_id}").json()["due_at"]
        > (time.time() + 3500) * 1000
    )


def test_extend_and_release(any_client: TestClient) -> None:
    message_id = put(any_client)
    held = reserve(any_client, lease=5)[0]
    response = any_client.post(
        f"/v1/queues/q/messages/{message_id}/extend",
        json={"lease": held["lease"], "lease_seconds": 120},
    )
    assert response.json()["lease_expires_at"] >= time.time() * 1000 + 119_000
    bad = any_client.post(
        f"/v1/queues/q/messages/{message_id}/extend",
        json={"lease": held["lease"], "lease_seconds": 0},
    )
    assert error_of(bad, 422) == "invalid_request"
    released = any_client.post(
        f"/v1/queues/q/messages/{message_id}/release", json={"lease": held["lease"]}
    )
    assert released.json() == {"released": True}
    message = any_client.get(f"/v1/queues/q/messages/{message_id}").json()
    assert (message["state"], message["attempts"]) == ("ready", 0)


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_long_poll_wakes_when_a_message_is_put(any_client: TestClient) -> None:
    got: list[list[dict[str, Any]]] = []
    waiter = threading.Thread(target=lambda: got.append(reserve(any_client, wait=20)))
    waiter.start()
    time.sleep(0.3)
    assert not got
    message_id = put(any_client, payload="wake")
    waiter.join(15)
    assert not waiter.is_alive()
    assert [m["id"] for m in got[0]] == [message_id]
    assert "delayq_lateness_seconds_count" in any_client.get("/metrics").text


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_long_poll_returns_empty_after_wait(client: TestClient) -> None:
    assert reserve(client, wait=0.3) == []


@pytest.mark.slow
@pytest.mark.timeout(30)
def test_long_poll_ends_when_the_server_stops(make_client: Any) -> None:
    from delayq.server import request_stop  # noqa: PLC0415

    client = make_client()
    got: list[list[dict[str, Any]]] = []
    waiter = threading.Thread(target=lambda: got.append(reserve(client, wait=25)))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.3)
    request_stop(client.app)  # type: ignore[arg-type]
    waiter.join(10)
    assert not waiter.is_alive()
    assert got == [[]]
    assert time.monotonic() - started < 10
