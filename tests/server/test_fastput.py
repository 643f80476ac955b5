"""The put fast path (``FastPut``) answers exactly what the FastAPI route answers.

Each test sends the same requests to two apps of the same configuration, one as
``create_app`` builds it and one without ``FastPut``, and compares status, body and
headers. A dependency override of the route counts the requests that reached it, so
the tests also show that the fast path served the valid ones.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from delayq.durable import AsyncQueue
from delayq.server import ServeConfig, create_app
from delayq.server._api import QueueName, open_queue, queue_named, state_of
from delayq.server._fastput import FastPut

# (path, body, content type); a str body is sent as it is, anything else as JSON.
Call = tuple[str, Any, str]

JSON = "application/json"
CHARSET = "application/json; charset=utf-8"
PUT = "/v1/queues/q/messages"


class Pair:
    """The same requests to an app with the fast path and to one without it."""

    def __init__(self, stack: ExitStack, url: str | None = None, **options: Any) -> None:
        options.setdefault("dispatch", False)
        self.route_calls = 0
        self.fast = self._client(stack, url, options, fast=True)
        self.plain = self._client(stack, url, options, fast=False)

    def _client(
        self, stack: ExitStack, url: str | None, options: dict[str, Any], *, fast: bool
    ) -> TestClient:
        config = ServeConfig(url=url or f"memory://fastput-{uuid.uuid4().hex}", **options)
        app = create_app(config)
        if fast:
            app.dependency_overrides[open_queue] = self._counted(app)
        else:
            app.user_middleware = [m for m in app.user_middleware if m.cls is not FastPut]
        return stack.enter_context(TestClient(app, base_url="http://localhost"))

    def _counted(self, app: FastAPI) -> Any:
        async def counted_open_queue(queue: QueueName, request: Request) -> AsyncQueue:
            self.route_calls += 1
            return queue_named(state_of(request), queue)

        return counted_open_queue

    def send(self, path: str, body: Any, content_type: str = JSON) -> tuple[Any, Any]:
        """One request to both apps; their answers."""
        content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        headers = {"Content-Type": content_type}
        answers = [
            client.post(path, content=content, headers=headers)
            for client in (self.fast, self.plain)
        ]
        return answers[0], answers[1]

    def same(self, calls: list[Call]) -> None:
        """Send ``calls`` in order to both apps; assert each answer is the same."""
        for path, body, content_type in calls:
            fast, plain = self.send(path, body, content_type)
            where = f"{path} {body!r:.100} -> {plain.status_code} {plain.text[:200]}"
            assert fast.status_code == plain.status_code, where
            assert fast.content == plain.content, where
            shown = ("content-type", "content-length", "retry-after", "www-authenticate")
            assert {k: fast.headers.get(k) for k in shown} == {
                k: plain.headers.get(k) for k in shown
            }, where


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def test_a_valid_put_is_served_by_the_fast_path(stack: ExitStack) -> None:
    pair = Pair(stack)
    pair.same(
        [
            (PUT, {"id": "m1", "payload": {"n": 1}, "delay": 60}, JSON),
            (PUT, {"id": "m2", "payload": None, "at": 4_102_444_800}, JSON),
            (PUT, {"id": "m3", "payload": [1, "é"], "delay": "30m"}, CHARSET),
            (PUT, {"id": "m4", "payload_base64": "aGk=", "headers": {"k": "v"}}, JSON),
            ("/v1/queues/ünï cødé/messages", {"id": "m5", "payload": 1}, JSON),
            (PUT, {"id": "m7", "payload": 1, "at_ms": 4_102_444_800_123}, JSON),
        ]
    )
    assert pair.route_calls == 0
    fast, plain = pair.send(PUT, {"payload": 1})  # generated ids differ
    assert (fast.status_code, fast.json()["queue"]) == (plain.status_code, "q")
    # Other JSON media types are the route's.
    pair.same([(PUT, {"id": "m6", "payload": 1}, "application/merge-patch+json")])
    assert pair.route_calls == 1


def test_a_kept_and_a_replaced_message_are_answered_alike(stack: ExitStack) -> None:
    pair = Pair(stack)
    calls: list[Call] = [
        (PUT, {"id": "k", "payload": 1}, JSON),
        (PUT, {"id": "k", "payload": 2}, JSON),  # kept: 200, "created": false
        (PUT, {"id": "k", "payload": 3, "on_conflict": "ignore", "delay": 5}, CHARSET),
        (PUT, {"id": "k", "payload": 4, "on_conflict": "replace"}, JSON),  # 201 again
    ]
    pair.same(calls)
    assert pair.route_calls == 0
    fast, _ = pair.send(PUT, {"id": "k", "payload": 5})
    assert (fast.status_code, fast.json()) == (200, {"id": "k", "queue": "q", "created": False})


def test_faults_are_answered_alike_and_write_nothing(stack: ExitStack) -> None:
    pair = Pair(stack)
    faults: list[Call] = [
        (PUT, "{", JSON),
        (PUT, '{"payload": 1,}', JSON),
        (PUT, "", JSON),
        (PUT, "null", JSON),
        (PUT, "[1, 2]", JSON),
        (PUT, "{}", JSON),
        (PUT, {"payload": 1, "dealy": 5}, JSON),
        (PUT, {"payload": 1, "delay": True}, JSON),
        (PUT, {"payload": 1, "delay": None}, JSON),
        (PUT, {"payload": 1, "at": None}, JSON),
        (PUT, {"payload": 1, "at_ms": None}, JSON),
        (PUT, {"payload": 1, "at": 1_800_000_000_000}, JSON),
        (PUT, {"payload": 1, "at": 5, "at_ms": 5000}, JSON),
        (PUT + "?delay=5", {"payload": 1}, JSON),
        (PUT, {"payload": 1, "id": ""}, JSON),
        (PUT, {"payload": 1, "id": "a\nb"}, JSON),
        (PUT, {"payload": 1, "id": ".."}, JSON),
        (PUT, {"payload": 1, "at": "tomorrow"}, JSON),
        (PUT, {"payload": 1, "payload_base64": "aGk="}, JSON),
        (PUT, {"payload_base64": "!!"}, JSON),
        (PUT, {"payload": 1, "headers": {"delayq-callback": "{}"}}, JSON),
        (PUT, {"payload": 1, "callback": {"url": "https://example.com/"}}, JSON),
        (PUT, {"payload": 1, "max_attempts": 0}, JSON),
        ("/v1/queues/a{b}/messages", {"payload": 1}, JSON),
        ("/v1/queues/ padded/messages", {"payload": 1}, JSON),
        (f"/v1/queues/{'x' * 256}/messages", {"payload": 1}, JSON),
        (PUT, "not json", "text/plain"),
    ]
    pair.same(faults)
    stats = pair.fast.get("/v1/queues/q/stats").json()
    assert stats["scheduled"] + stats["ready"] == 0


def test_errors_of_the_put_itself_are_answered_alike(stack: ExitStack) -> None:
    pair = Pair(stack, max_body=4 * 1024 * 1024)
    pair.same(
        [
            (PUT, {"id": "d", "payload": 1}, JSON),
            (PUT, {"id": "d", "payload": 2, "on_conflict": "error"}, JSON),
            (PUT, {"id": "d", "payload": 3}, JSON),
            (PUT, {"payload": 1, "delay": "soon"}, JSON),
            (PUT, {"payload": "x" * (1024 * 1024 + 1)}, JSON),
        ]
    )
    assert pair.route_calls == 0  # valid requests: the put itself refused them


def test_a_backend_outage_is_the_same_503(stack: ExitStack) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pair = Pair(stack, f"redis://127.0.0.1:{port}/0?prefix=delayq-test-fastput")
    pair.same([(PUT, {"id": "m", "payload": 1}, JSON)])
    assert pair.route_calls == 0


def test_the_token_still_guards_the_fast_path(stack: ExitStack) -> None:
    pair = Pair(stack, token="s3cret-token-for-tests")
    pair.same([(PUT, {"id": "m", "payload": 1}, JSON)])
    refused = pair.fast.post(PUT, json={"payload": 1})
    assert refused.status_code == 401
    allowed = pair.fast.post(
        PUT, json={"payload": 1}, headers={"Authorization": "Bearer s3cret-token-for-tests"}
    )
    assert allowed.status_code == 201
    assert pair.route_calls == 0
