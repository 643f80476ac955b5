"""The HTTP API as a contract (issue 16): error codes as a closed set, one code per
kind of mistake, fields named in every 422, batch items named as ``item N: ...``,
time units that do not trap, and unknown query parameters refused; the document's
types as the server answers (issue 35): every numeric field names its unit, no field
of an answer is optional, no request field allows a null the server refuses."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from delayq.server._callbacks import CALLBACK_METHODS
from delayq.server._constants import CALLBACK_MAX_TIMEOUT
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


# -- the document's types agree with the server (issue 35, points 4 and 5) -------------

# A numeric field's description names its unit in one of these words, or says that it
# counts (see delayq.server._models).
UNITS = re.compile(r"epoch milliseconds|milliseconds|seconds|\ba count\b", re.IGNORECASE)


def _document(client: TestClient) -> dict[str, Any]:
    document: dict[str, Any] = client.get("/openapi.json").json()
    return document


def _types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a property schema allows (through anyOf/oneOf and arrays' items)."""
    kinds = {schema["type"]} if "type" in schema else set()
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []):
        kinds |= _types(branch)
    if schema.get("type") == "array":
        kinds |= {f"array of {kind}" for kind in _types(schema.get("items", {}))}
    return kinds


def _numeric(schema: dict[str, Any]) -> bool:
    return any(kind.endswith(("number", "integer")) for kind in _types(schema))


def _fields(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field of every model and every parameter of every operation, named."""
    for model, schema in document["components"]["schemas"].items():
        for name, field in schema.get("properties", {}).items():
            yield f"{model}.{name}", field
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                where = f"{method.upper()} {path} ?{parameter['name']}"
                yield where, {**parameter["schema"], "description": parameter.get("description")}


def test_every_numeric_field_and_parameter_names_its_unit(client: TestClient) -> None:
    document = _document(client)
    unnamed = [
        f"{where}: {field.get('description')!r}"
        for where, field in _fields(document)
        if _numeric(field) and not UNITS.search(field.get("description") or "")
    ]
    assert unnamed == []
    schemas = document["components"]["schemas"]
    # The units that trapped clients, each said where the field is.
    assert "epoch milliseconds" in schemas["QueueStats"]["properties"]["next_due_at"]["description"]
    assert "seconds" in schemas["QueueStats"]["properties"]["lag"]["description"]
    assert "epoch seconds" in schemas["PutRequestBody"]["properties"]["at"]["description"]
    assert "epoch milliseconds" in schemas["DueResponse"]["properties"]["start"]["description"]


def _reachable(document: dict[str, Any], roots: list[Any]) -> set[str]:
    """The names of the component schemas ``roots`` refer to, directly or not."""
    found: set[str] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.rsplit("/", 1)[-1] not in found:
                name = ref.rsplit("/", 1)[-1]
                found.add(name)
                todo.append(document["components"]["schemas"][name])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found


# The callback of a message in an answer is what its put sent (CallbackSpec, the
# request's model): its options stay optional there.
_REQUEST_MODELS_IN_ANSWERS = {"CallbackSpec"}


def test_no_field_an_answer_carries_is_optional(client: TestClient) -> None:
    document = _document(client)
    answers = [
        operation["responses"]
        for operations in document["paths"].values()
        for operation in operations.values()
    ]
    models = _reachable(document, answers) - _REQUEST_MODELS_IN_ANSWERS
    assert {"MessageOut", "ReservedMessage", "QueueStats", "MessageList"} <= models
    optional = {
        f"{model}.{name}"
        for model in models
        for name in document["components"]["schemas"][model].get("properties", {})
        if name not in document["components"]["schemas"][model].get("required", [])
    }
    assert optional == set()


def test_every_message_answer_carries_every_field_of_the_model(client: TestClient) -> None:
    fields = set(_document(client)["components"]["schemas"]["MessageOut"]["properties"])
    put(client, id="waiting")
    put(client, id="held")
    put(client, id="bytes", payload_base64="AAE=")
    reserved = client.post("/v1/queues/q/reserve", json={"max": 1}).json()["messages"]
    answers = {
        "reserve": reserved,
        "get": [client.get("/v1/queues/q/messages/bytes").json()],
        "peek": client.get("/v1/queues/q/messages").json()["messages"],
        "peek active": client.get("/v1/queues/q/messages?state=active").json()["messages"],
        "reschedule": [
            client.post("/v1/queues/q/messages/bytes/reschedule", json={"delay": 60}).json()
        ],
    }
    for route, messages in answers.items():
        assert messages, route
        for message in messages:
            assert set(message) == fields, (route, message)
    assert answers["peek"][0]["lease"] is None
    assert answers["get"][0]["payload"] is None
    assert answers["get"][0]["payload_base64"] == "AAE="
    assert client.get("/v1/queues/q/dead").json()["next_cursor"] is None
    assert "next_due_at" in stats(client, "empty")


def _nullable(field: dict[str, Any]) -> bool:
    return ("type" not in field and "anyOf" not in field) or "null" in _types(field)


def _reserved(client: TestClient) -> dict[str, Any]:
    put(client)
    message: dict[str, Any] = client.post("/v1/queues/q/reserve", json={}).json()["messages"][0]
    return message


# Per request model: the route it goes to and a valid body without the field.
_REQUESTS: dict[str, Callable[[TestClient], tuple[str, dict[str, Any]]]] = {
    "PutRequestBody": lambda client: ("/v1/queues/q/messages", {"payload": 1}),
    "RescheduleRequest": lambda client: (
        f"/v1/queues/q/messages/{put(client, delay=60)}/reschedule",
        {"delay": 5},
    ),
    "ReserveRequest": lambda client: ("/v1/queues/q/reserve", {}),
    "NackRequest": lambda client: (
        f"/v1/queues/q/messages/{(held := _reserved(client))['id']}/nack",
        {"lease": held["lease"]},
    ),
    "DeadRetryRequest": lambda client: ("/v1/queues/q/dead/retry", {}),
    "PurgeRequest": lambda client: ("/v1/queues/q/purge", {}),
}


def test_no_request_field_allows_a_null_the_server_refuses(client: TestClient) -> None:
    schemas = _document(client)["components"]["schemas"]
    checked = []
    for model, request_of in _REQUESTS.items():
        for name, field in schemas[model]["properties"].items():
            path, body = request_of(client)
            answer = client.post(path, json={**body, name: None})
            takes_null = answer.status_code < 400
            assert takes_null == _nullable(field), (model, name, answer.text)
            checked.append(f"{model}.{name}")
    assert {"PutRequestBody.delay", "PutRequestBody.at_ms", "NackRequest.delay"} <= set(checked)


def test_the_document_says_what_a_body_needs_and_the_server_takes(client: TestClient) -> None:
    schemas = _document(client)["components"]["schemas"]
    needs = {
        model: [branch["required"] for branch in schemas[model]["oneOf"]]
        for model in ("PutRequestBody", "RescheduleRequest")
    }
    assert needs == {
        "PutRequestBody": [["payload"], ["payload_base64"]],
        "RescheduleRequest": [["delay"], ["at"], ["at_ms"]],
    }
    assert error_of(client.post("/v1/queues/q/messages", json={}), 422) == "missing_payload"
    both = {"payload": 1, "payload_base64": "AA=="}
    assert error_of(client.post("/v1/queues/q/messages", json=both), 422) == "payload_conflict"
    message_id = put(client, delay=60)
    for body in ({}, {"delay": 1, "at": 5}, {"at": 5, "at_ms": 5000}):
        answer = client.post(f"/v1/queues/q/messages/{message_id}/reschedule", json=body)
        assert error_of(answer, 422) == "invalid_request", body

    callback = schemas["CallbackSpec"]["properties"]
    assert callback["method"]["enum"] == list(CALLBACK_METHODS)
    assert "payload null" in callback["method"]["description"]
    timeout = callback["timeout"]["anyOf"][0]
    assert (timeout["exclusiveMinimum"], timeout["maximum"]) == (0, CALLBACK_MAX_TIMEOUT)
    # An id may hold '/', and the document does not say otherwise.
    assert "'/'" not in schemas["PutRequestBody"]["properties"]["id"]["description"].split("(")[0]
    slashed = put(client, id="hook:https://example.com/x")
    assert client.get(f"/v1/queues/q/messages/{slashed}").json()["id"] == slashed
