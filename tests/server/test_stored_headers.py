"""Headers the server cannot give back, written to the store below a put's checks
(issue 33, point 8): nested 100,000 deep, or not strings at all. Like a payload it
cannot show, such headers spoil only their own message (``headers`` empty with
``headers_error``), on every face: the Python reads, the HTTP API, the dashboard."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from conformance._helpers import stored_request
from delayq.durable import Queue, State
from delayq.server._constants import CALLBACK_HEADER

from .conftest import MakeClient

DEPTH = 100_000
#: Headers as JSON text, nested DEPTH deep: what a reader of the store recurses into.
DEEP_TEXT = '{"a":' * DEPTH + "1" + "}" * DEPTH


def _deep_object(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def _field(message: Any, key: str) -> Any:
    return message[key] if isinstance(message, dict) else getattr(message, key)


def _check(message: Any, bad: set[str]) -> None:
    """A message as the Python face or the HTTP API shows it."""
    if _field(message, "id") in bad:
        assert _field(message, "headers") == {}
        assert "cannot be shown" in _field(message, "headers_error")
    else:
        assert _field(message, "headers") == {"h": _field(message, "id")}
        assert _field(message, "headers_error") is None


def _every_face(url: str, client: TestClient, bad: set[str], only_http: str = "") -> None:
    """Every face reads every message; ``only_http`` is bad over HTTP alone (its
    callback header is a string the Python face gives back as it is)."""
    ids = sorted(["good-1", "good-2", *bad, *filter(None, [only_http])])
    shown = {*bad, *filter(None, [only_http])}
    listed = client.get("/v1/queues/q/messages")
    assert listed.status_code == 200, listed.text
    assert sorted(message["id"] for message in listed.json()["messages"]) == ids
    for message in listed.json()["messages"]:
        _check(message, shown)
        one = client.get(f"/v1/queues/q/messages/{message['id']}")
        assert one.status_code == 200, one.text
        _check(one.json(), shown)
        page = client.get(f"/queues/q/messages/{message['id']}")
        assert page.status_code == 200
        assert ("cannot be shown" in page.text) is (message["id"] in shown)
    assert client.get("/queues/q").status_code == 200
    with Queue(url, name="q") as queue:
        peeked = queue.peek()
        assert sorted(message.id for message in peeked) == ids
        for message in peeked:
            if message.id != only_http:
                _check(message, bad)
                _check(queue.get(message.id), bad)
    reserved = client.post("/v1/queues/q/reserve", json={"max": 10})
    assert reserved.status_code == 200, reserved.text
    for message in reserved.json()["messages"]:
        _check(message, shown)
        client.post(
            f"/v1/queues/q/messages/{message['id']}/nack",
            json={"lease": message["lease"], "dead": True},
        )
    dead = client.get("/v1/queues/q/dead")
    assert dead.status_code == 200, dead.text
    assert sorted(message["id"] for message in dead.json()["messages"]) == ids
    for message in dead.json()["messages"]:
        _check(message, shown)
    assert client.get("/queues/q").status_code == 200
    with Queue(url, name="q") as queue:
        assert queue.stats().dead == len(ids)
        for message in queue.dead():
            if message.id != only_http:
                _check(message, bad)
            assert message.state is State.DEAD


def test_headers_nested_deep_in_the_store_spoil_only_their_message(
    tmp_path: Path, make_client: MakeClient
) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    with Queue(url, name="q") as queue:
        for message_id in ("good-1", "deep", "good-2"):
            queue.put(1, id=message_id, headers={"h": message_id})
    with sqlite3.connect(tmp_path / "q.db") as db:
        db.execute("UPDATE delayq_messages SET headers = ? WHERE id = 'deep'", (DEEP_TEXT,))
    _every_face(url, make_client(url), {"deep"})


def test_headers_that_are_not_strings_spoil_only_their_message(make_client: MakeClient) -> None:
    url = f"memory://headers-{uuid.uuid4().hex}"
    client = make_client(url)
    deep_callback = "[" * 30_000 + "]" * 30_000  # within the 64 KiB a put allows
    with Queue(url, name="q") as queue:
        for message_id in ("good-1", "good-2"):
            queue.put(1, id=message_id, headers={"h": message_id})
        queue.put(1, id="callback", headers={CALLBACK_HEADER: deep_callback})
        request = stored_request("object", headers={"h": _deep_object(DEPTH)})
        queue.backend.put("q", [request])
    _every_face(url, client, {"object"}, only_http="callback")
