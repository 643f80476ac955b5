"""One name per meaning in the HTTP API (issue 15): ``lease_seconds`` is a duration
(reserve, extend), ``lease`` the token of a claimed message (ack, nack, extend,
release). Reserve's former ``lease`` (seconds) is still accepted."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ._helpers import error_of, put


def _held_for(client: TestClient, body: dict[str, object]) -> dict[str, object]:
    put(client)
    response = client.post("/v1/queues/q/reserve", json=body)
    assert response.status_code == 200, response.text
    [held] = response.json()["messages"]
    assert isinstance(held, dict)
    return held


def test_reserve_takes_lease_seconds_and_its_former_name(client: TestClient) -> None:
    for body in ({"lease_seconds": 120}, {"lease": 120}):
        held = _held_for(client, body)
        expires = held["lease_expires_at"]
        assert isinstance(expires, int)
        assert isinstance(held["lease"], str)  # the token
        acked = client.post(
            f"/v1/queues/q/messages/{held['id']}/ack", json={"lease": held["lease"]}
        )
        assert acked.json() == {"acked": True}


def test_a_lease_given_under_both_names_is_422(client: TestClient) -> None:
    put(client)
    response = client.post("/v1/queues/q/reserve", json={"lease": 5, "lease_seconds": 5})
    assert error_of(response, 422) == "invalid_request"
    assert "lease_seconds" in response.json()["error"]["message"]
    assert client.get("/v1/queues/q/stats").json()["ready"] == 1


def test_the_schema_says_lease_seconds_for_durations_and_lease_for_tokens(
    client: TestClient,
) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    reserve = schemas["ReserveRequest"]["properties"]
    assert "lease_seconds" in reserve
    assert "lease" not in reserve
    assert "lease_seconds" in schemas["ExtendRequest"]["properties"]
    for name in ("AckRequest", "NackRequest", "ExtendRequest"):
        assert schemas[name]["properties"]["lease"]["type"] == "string"
