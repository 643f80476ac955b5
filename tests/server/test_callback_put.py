"""What a put of a callback that could not arrive as put is answered (issue 35, points
7 and 8), on each route that takes a callback: one message, and a batch."""

from __future__ import annotations

from typing import Any

import pytest

from ._helpers import error_of, put, stats

MESSAGES = "/v1/queues/callbacks/messages"
HOOK = "https://hooks.example.com/x"


@pytest.fixture
def client(make_client: Any) -> Any:
    return make_client(callback_hosts=("hooks.example.com",))


def refused(client: Any, item: dict[str, Any]) -> tuple[str, str, str]:
    """Put ``item`` alone, then in a batch after a valid one: both must be 422 with
    the same code, and store nothing; the code and both messages."""
    alone = client.post(MESSAGES, json=item)
    code = error_of(alone, 422)
    good = {"payload": 1, "callback": {"url": HOOK}}
    batch = client.post(f"{MESSAGES}/batch", json={"messages": [good, item]})
    assert error_of(batch, 422) == code
    assert stats(client, "callbacks")["ready"] == 0
    return code, alone.json()["error"]["message"], batch.json()["error"]["message"]


@pytest.mark.parametrize("value", ["café ✓", "✓", "a\u00a0b", "😀"])
def test_a_callback_header_value_that_is_not_ascii_is_refused(client: Any, value: str) -> None:
    """It was stored and sent as UTF-8 bytes, which Node (and most servers) read as
    Latin-1: ``café ✓`` arrived as ``cafÃ© â\\x9c\\x93``."""
    item = {"payload": 1, "callback": {"url": HOOK, "headers": {"X-Note": value}}}
    code, message, in_batch = refused(client, item)
    assert code == "invalid_callback"
    assert message.startswith("callback header 'X-Note' must have an ASCII value, got ")
    assert "percent-encode it" in message
    assert in_batch == f"item 1: {message}"


def test_an_ascii_callback_header_value_is_stored_as_given(client: Any) -> None:
    headers = {"X-Note": "caf%C3%A9 %E2%9C%93", "Authorization": "Bearer a~b\tc"}
    id = put(client, "callbacks", callback={"url": HOOK, "headers": headers})
    shown = client.get(f"{MESSAGES}/{id}").json()["callback"]
    assert shown["headers"] == headers


@pytest.mark.parametrize(
    "body",
    [
        {"payload": {"order": 42}},
        {"payload": ""},
        {"payload": 0},
        {"payload": False},
        {"payload": []},
        {"payload_base64": "AA=="},
    ],
)
@pytest.mark.parametrize("method", ["GET", "get"])
def test_a_get_callback_with_a_payload_is_refused(
    client: Any, body: dict[str, Any], method: str
) -> None:
    """A GET is sent without a body: the payload was dropped without a word."""
    item = {**body, "callback": {"url": HOOK, "method": method}}
    code, message, in_batch = refused(client, item)
    assert code == "invalid_callback"
    assert message.startswith("callback method GET is sent without a body, so the payload ")
    assert "must be null" in message
    assert in_batch == f"item 1: {message}"


def test_a_get_callback_without_a_payload_and_other_methods_with_one_are_stored(
    client: Any,
) -> None:
    get = {"url": HOOK, "method": "GET"}
    put(client, "callbacks", payload=None, callback=get)
    put(client, "callbacks", payload_base64="", callback=get)  # empty bytes: no body
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        put(client, "callbacks", payload={"order": 42}, callback={"url": HOOK, "method": method})
    batch = client.post(
        f"{MESSAGES}/batch",
        json={
            "messages": [
                {"payload": None, "callback": get},
                {"payload": 1, "callback": {"url": HOOK}},
            ]
        },
    )
    assert batch.status_code == 201, batch.text
    assert stats(client, "callbacks")["ready"] == 8
    missing = client.post(MESSAGES, json={"callback": get})  # as before: a payload is needed
    assert error_of(missing, 422) == "missing_payload"
