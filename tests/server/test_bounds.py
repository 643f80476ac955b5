"""Inputs at the edge of what the server can store and serve back: out-of-range
numbers, payloads nested too deep, records it cannot decode, oversized headers, and
queue names that do not exist. Each is a clear 4xx before anything is written, or,
for a stored record, an answer about that one message, never a 500."""

from __future__ import annotations

import asyncio
import gc
import json
import pickle
import uuid
import warnings
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from delayq.durable import AsyncQueue, Queue
from delayq.durable.message import put_request
from delayq.server import ServeConfig, create_app
from delayq.server._coalesce import PutCoalescer
from delayq.server._constants import SERVE_QUEUE_CACHE

from ._helpers import error_of, put, stats
from .conftest import MakeClient

_JSON = {"content-type": "application/json"}

# -- numbers out of range (issue 14, point 10) ----------------------------------------

#: Numbers a JSON body may carry that no time fits: too large once in milliseconds,
#: beyond a float (Python's JSON reader turns 1e999 into infinity), not numbers at all.
OUT_OF_RANGE = ["1e308", '"1e308"', "1e999", "NaN", "Infinity", "-Infinity", "1" + "0" * 400]
#: Those JSON does not have (no NaN or infinities; 1e999 is past a double): the body is
#: not JSON, a 400 malformed_json. The others are a 422.
NOT_JSON = frozenset(("1e999", "NaN", "Infinity", "-Infinity"))


def _refused(response: Any, number: str) -> None:
    if number in NOT_JSON:
        assert error_of(response, 400) == "malformed_json"
    else:
        error_of(response, 422)


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
def test_an_out_of_range_number_is_refused_and_writes_nothing(
    client: TestClient, number: str, method: str, path: str, template: str
) -> None:
    put(client, id="m", delay=60)
    before = client.get("/v1/queues/q/messages/m").json()
    response = client.request(method, path, content=template % number, headers=_JSON)
    _refused(response, number)
    assert client.get("/v1/queues/q/messages/m").json() == before
    assert stats(client)["scheduled"] == 1
    assert stats(client, "callbacks")["scheduled"] == 0


@pytest.mark.parametrize("number", OUT_OF_RANGE)
def test_out_of_range_numbers_of_a_held_message_are_refused(
    client: TestClient, number: str
) -> None:
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
        _refused(response, number)
    after = client.get("/v1/queues/q/messages/m").json()
    unchanged = ("active", 1, held["lease_expires_at"])  # the lease neither moved nor ended
    assert (after["state"], after["attempts"], after["lease_expires_at"]) == unchanged
    assert client.post("/v1/queues/q/messages/m/ack", json={"lease": held["lease"]}).json() == {
        "acked": True
    }


def test_delay_1e308_says_what_is_wrong(client: TestClient) -> None:
    response = client.post("/v1/queues/q/messages", json={"payload": 1, "delay": 1e308})
    assert error_of(response, 422) == "invalid_request"
    assert "out of range" in response.json()["error"]["message"]


@pytest.mark.parametrize("field", ["delay", "at"])
def test_a_hugely_negative_time_means_now(client: TestClient, field: str) -> None:
    message_id = put(client, **{field: -1e308})
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["state"] == "ready"
    moved = client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json={field: -1e308})
    assert moved.status_code == 200, moved.text
    assert moved.json()["state"] == "ready"


# -- payloads the server could not serve back (issue 14, point 4) ------------------------


def _nested(depth: int) -> str:
    """JSON text of a value inside ``depth`` containers, lists and objects by turns."""
    text = "1"
    for level in range(depth):
        text = f"[{text}]" if level % 2 else f'{{"k":{text}}}'
    return text


@pytest.mark.parametrize("depth", [65, 260])
def test_a_payload_nested_too_deep_is_refused_at_put(any_client: TestClient, depth: int) -> None:
    put(any_client, id="kept")
    deep = _nested(depth)
    for path, body, where in (
        ("messages", f'{{"id": "deep", "payload": {deep}}}', "payload"),
        ("messages/batch", f'{{"messages": [{{"payload": 1}}, {{"payload": {deep}}}]}}', "item 1"),
    ):
        response = any_client.post(f"/v1/queues/q/{path}", content=body, headers=_JSON)
        assert error_of(response, 422) == "payload_too_deep"
        assert where in response.json()["error"]["message"]
        assert "more than 64" in response.json()["error"]["message"]
    assert stats(any_client)["ready"] == 1
    assert any_client.get("/v1/queues/q/messages/deep").status_code == 404


def test_a_payload_at_the_depth_limit_round_trips(any_client: TestClient) -> None:
    body = f'{{"id": "deep", "payload": {_nested(64)}}}'
    assert any_client.post("/v1/queues/q/messages", content=body, headers=_JSON).status_code == 201
    batch = f'{{"messages": [{{"id": "deep2", "payload": {_nested(64)}}}]}}'
    response = any_client.post("/v1/queues/q/messages/batch", content=batch, headers=_JSON)
    assert response.status_code == 201, response.text
    expected = json.loads(_nested(64))
    assert any_client.get("/v1/queues/q/messages/deep").json()["payload"] == expected
    reserved = any_client.post("/v1/queues/q/reserve", json={"max": 10}).json()["messages"]
    assert [msg["payload"] for msg in reserved] == [expected, expected]


def _write_bad_records(url: str) -> list[str]:
    """Write, through the Python face, records this server cannot show: one pickled by
    a queue with another serializer, one nested deeper than the limit (as one stored
    before it existed, written below the facade's checks); then two good ones."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pickle's warning
        with Queue(url, name="q", serializer=pickle) as pickled:
            foreign = pickled.put({"made": "by pickle"})
    with Queue(url, name="q") as plain:
        deep = json.dumps(json.loads(_nested(200)), separators=(",", ":")).encode()
        request = put_request(
            id="deep",
            payload=deep,
            encoding="json",
            max_attempts=5,
            headers={},
            delay_ms=None,
            at_ms=None,
            on_conflict="ignore",
            generated_id=False,
        )
        plain.backend.put("q", [request])
        plain.put({"n": 1}, id="good-1")
        plain.put({"n": 2}, id="good-2")
    return [foreign, "deep"]


def test_a_record_the_server_cannot_show_spoils_only_itself(
    backend_url: str, make_client: MakeClient
) -> None:
    client = make_client(backend_url)
    bad = _write_bad_records(backend_url)

    def check(message: dict[str, Any]) -> None:
        if message["id"] in bad:
            assert message["payload"] is None
            assert message["payload_base64"] is None
            assert "cannot be" in message["payload_error"]
        else:
            assert message["payload"] == {"n": int(message["id"][-1])}
            assert message["payload_error"] is None

    listed = client.get("/v1/queues/q/messages")
    assert listed.status_code == 200, listed.text
    assert [msg["id"] for msg in listed.json()["messages"]] == [*bad, "good-1", "good-2"]
    for message in listed.json()["messages"]:
        check(message)
        one = client.get(f"/v1/queues/q/messages/{message['id']}")
        assert one.status_code == 200, one.text
        check(one.json())
        page = client.get(f"/queues/q/messages/{message['id']}")
        assert page.status_code == 200
        assert ("cannot be shown" in page.text) is (message["id"] in bad)
    assert "pickle" in client.get(f"/v1/queues/q/messages/{bad[0]}").json()["payload_error"]

    reserved = client.post("/v1/queues/q/reserve", json={"max": 10, "lease": 60})
    assert reserved.status_code == 200, reserved.text
    held = reserved.json()["messages"]
    assert [msg["id"] for msg in held] == [*bad, "good-1", "good-2"]
    for message in held:
        check(message)
        assert message["attempts"] == 1
    active = client.get("/v1/queues/q/messages", params={"state": "active"})
    assert active.status_code == 200, active.text
    for message in held:
        if message["id"] in bad:
            nacked = client.post(
                f"/v1/queues/q/messages/{message['id']}/nack",
                json={"lease": message["lease"], "dead": True, "error": "unreadable"},
            )
            assert nacked.json() == {"state": "dead"}
        else:
            acked = client.post(
                f"/v1/queues/q/messages/{message['id']}/ack", json={"lease": message["lease"]}
            )
            assert acked.json() == {"acked": True}
    dead = client.get("/v1/queues/q/dead")
    assert dead.status_code == 200, dead.text
    assert [msg["id"] for msg in dead.json()["messages"]] == bad
    for message in dead.json()["messages"]:
        check(message)


# -- headers count (issue 14, point 12) -------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{f"h{index}": "v" for index in range(140_000)}, {"big": "x" * 70_000}],
    ids=["140k headers", "70 kB header"],
)
def test_headers_too_many_or_too_large_are_422_and_write_nothing(
    make_client: MakeClient, headers: dict[str, str]
) -> None:
    client = make_client(callback_hosts=["example.com"])
    callback = {"url": "https://example.com/hook"}
    for queue, body in (
        ("q", {"payload": 1, "headers": headers}),
        ("q", {"messages": [{"payload": 1}, {"payload": 2, "headers": headers}]}),
        ("callbacks", {"payload": 1, "headers": headers, "callback": callback}),
    ):
        path = f"/v1/queues/{queue}/messages" + ("/batch" if "messages" in body else "")
        response = client.post(path, json=body)
        assert error_of(response, 422) == "message_headers_too_large", path
    assert stats(client)["ready"] == 0
    assert stats(client, "callbacks")["ready"] == 0


def test_headers_at_the_limit_are_stored(client: TestClient) -> None:
    headers = {f"h{index:02}": "v" * 1000 for index in range(64)}
    message_id = put(client, headers=headers)
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["headers"] == headers


# -- queue names that come and go (issue 14, point 12) ----------------------------------

_UNKNOWN_NAMES = 10_000


def _alive(url: str) -> int:
    """How many queue objects and put batchers over ``url`` this process holds: what
    the server keeps per queue name."""
    gc.collect()
    count = 0
    for obj in gc.get_objects():
        queue = obj.queue if isinstance(obj, PutCoalescer) else obj
        count += isinstance(queue, AsyncQueue) and queue.url == url
    return count


async def _ask_about(client: httpx.AsyncClient, index: int) -> None:
    """One read of a queue that does not exist, by one route or another."""
    name = f"nobody-{index}"
    route = index % 5
    if route == 0:
        response = await client.get(f"/v1/queues/{name}/stats")
    elif route == 1:
        response = await client.get(f"/v1/queues/{name}/messages")
    elif route == 2:
        response = await client.get(f"/v1/queues/{name}/messages/some-id")
    elif route == 3:
        response = await client.post(f"/v1/queues/{name}/reserve", json={"wait": 0})
    else:
        response = await client.get(f"/v1/queues/{name}/dead")
    assert response.status_code == (404 if route == 2 else 200), response.text


async def _use_and_empty(client: httpx.AsyncClient, index: int) -> None:
    """Put, reserve and ack one message in a queue of its own (which then is empty)."""
    name = f"brief-{index}"
    assert (await client.post(f"/v1/queues/{name}/messages", json={"payload": 1})).is_success
    [held] = (await client.post(f"/v1/queues/{name}/reserve", json={})).json()["messages"]
    acked = await client.post(
        f"/v1/queues/{name}/messages/{held['id']}/ack", json={"lease": held["lease"]}
    )
    assert acked.is_success


async def _come_and_go(client: httpx.AsyncClient, state: Any, url: str) -> None:
    assert (await client.post("/v1/queues/kept/messages", json={"payload": 1})).is_success
    # A lease that outlasts the test on a loaded machine (the default 30 s did not).
    reserved = await client.post("/v1/queues/kept/reserve", json={"lease_seconds": 3600})
    [held] = reserved.json()["messages"]
    before = (await client.get("/metrics")).text
    for start in range(0, _UNKNOWN_NAMES, 100):
        await asyncio.gather(*(_ask_about(client, i) for i in range(start, start + 100)))
    for start in range(0, SERVE_QUEUE_CACHE + 100, 50):
        await asyncio.gather(*(_use_and_empty(client, i) for i in range(start, start + 50)))
    assert state.cached <= 2 * SERVE_QUEUE_CACHE
    # Past the caches: at most the last batch's 50 queues and their put batchers, which
    # a finished request may still hold until the loop drops its task (CI saw 2,061).
    assert _alive(url) <= 2 * SERVE_QUEUE_CACHE + 100
    for _ in range(2):  # a queue gone at two scrapes in a row loses its series
        after = (await client.get("/metrics")).text
    assert "nobody-" not in after
    assert "brief-" not in after
    assert len(after) < 2 * len(before)
    assert 'delayq_messages{queue="kept",state="active"} 1.0' in after
    assert 'delayq_puts_total{queue="kept"} 1.0' in after
    # The queue object of "kept" was dropped long ago: its lease still holds.
    acked = await client.post(
        f"/v1/queues/kept/messages/{held['id']}/ack", json={"lease": held["lease"]}
    )
    assert acked.json() == {"acked": True}


def test_queue_names_that_come_and_go_leave_caches_and_metrics_bounded() -> None:
    config = ServeConfig(url=f"memory://bounded-{uuid.uuid4().hex}", dispatch=False)
    app = create_app(config)

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            base = "http://localhost"
            async with httpx.AsyncClient(transport=transport, base_url=base) as client:
                await _come_and_go(client, app.state.delayq, config.url)

    asyncio.run(scenario())
