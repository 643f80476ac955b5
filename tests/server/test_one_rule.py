"""One rule for queue names and message ids on every face (issue 15, point 1).

Arbitrary strings go through every face: the Python queue (both faces), the ``delayq``
command (click's CliRunner) and the HTTP API (the ASGI app, driven with the path as
given, through the fast put path and through the route). Each face accepts the same
strings, and refuses the others with the same message. What an older delayq stored
under a name or id that is refused today stays readable and cancellable, and the
dashboard shows it.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes, unquote

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance._helpers import stored_request
from delayq import AsyncQueue, Queue
from delayq._names import check_message_id, check_queue_name
from delayq.cli import main

from .conftest import MakeClient

# Every kind of character the rule looks at, and some it does not.
_ODD = list("ab.é✓/{} \t\n\r\x00\x1b\x7f\x85\xa0\u2028\ud800\udc00-?#%:")
STRINGS = st.one_of(
    st.sampled_from(
        ["", ".", "..", "...", " lead", "trail ", "tenant/a", "{tag}", "a}", "x" * 255, "x" * 256]
    ),
    st.text(alphabet=st.sampled_from(_ODD), max_size=6),
    st.text(max_size=12),
)
# The route's own content type (``+json``): the fast put path answers application/json.
ROUTE_TYPE = "application/vnd.delayq+json"
FAST_TYPE = "application/json"

Outcome = tuple[str, str]  # ("ok", "") or ("refused", the message)
_CLI_ERROR = re.compile(r"^error: (.*?)(?: \(see '[^']*'\))?$")


def _words(text: str) -> str:
    """The message as one line of single spaces (the CLI prints errors that way)."""
    return " ".join(text.split())


def _python(url: str, name: str, **put: Any) -> Outcome:
    try:
        with Queue(url, name=name) as queue:
            queue.put(1, **put)
    except (TypeError, ValueError) as exc:
        return ("refused", _words(str(exc)))
    return ("ok", "")


def _python_async(url: str, name: str, **put: Any) -> Outcome:
    async def run() -> Outcome:
        try:
            async with AsyncQueue(url, name=name) as queue:
                await queue.put(1, **put)
        except (TypeError, ValueError) as exc:
            return ("refused", _words(str(exc)))
        return ("ok", "")

    return asyncio.run(run())


def _cli(url: str, name: str, message_id: str) -> Outcome:
    result = CliRunner().invoke(main, ["put", "--url", url, f"--id={message_id}", "--", name, "1"])
    if result.exit_code == 0:
        return ("ok", "")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    found = _CLI_ERROR.match(lines[0])
    assert found is not None, lines[0]
    return ("refused", _words(found.group(1)))


async def _asgi(
    app: Any, method: str, path: str, body: bytes = b"", content_type: str = FAST_TYPE
) -> tuple[int, bytes]:
    """One request to ``app`` with ``path`` as the server sees it once decoded (no
    client in between to normalize it)."""
    raw = quote_from_bytes(path.encode("utf-8", "surrogatepass"), safe="/").encode()
    path = unquote(raw.decode("ascii"))  # as uvicorn decodes it
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": raw,
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "app": app,
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def _as_a_server_reads(segment: str) -> str:
    return unquote(quote_from_bytes(segment.encode("utf-8", "surrogatepass"), safe=""))


def _http(client: TestClient, method: str, path: str, body: Any, content_type: str) -> Outcome:
    data = b"" if body is None else json.dumps(body).encode()
    assert client.portal is not None
    status, answer = client.portal.call(_asgi, client.app, method, path, data, content_type)
    if 200 <= status < 300:
        return ("ok", "")
    assert status < 500, answer
    return ("refused", _words(json.loads(answer)["error"]["message"]))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("one-rule")


@pytest.fixture
def http(make_client: MakeClient) -> TestClient:
    return make_client()


def _python_and_cli(store: Path, name: str, message_id: str) -> Outcome:
    """What the Python faces and the CLI answer to a put of ``message_id`` on the queue
    ``name``, checked to be the same answer."""
    memory = f"memory://one-rule-{uuid.uuid4().hex}"
    expected = _python(memory, name, id=message_id)
    assert _python_async(memory, name, id=message_id) == expected
    assert _cli(f"sqlite:///{store / 'cli.db'}", name, message_id) == expected
    return expected


_SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(name=STRINGS)
def test_every_face_takes_or_refuses_a_queue_name_alike(
    name: str, store: Path, http: TestClient
) -> None:
    expected = _python_and_cli(store, name, "x")
    if _as_a_server_reads(name) != name:
        return  # not UTF-8 (a lone surrogate): a URL names another queue, U+FFFD in it
    if "/" in name or not name:
        # No URL carries such a name to a route (a path segment holds no "/" and is not
        # empty): no route matches, which writes nothing.
        assert expected[0] == "refused"
        path = f"/v1/queues/{name}/messages"
        assert _http(http, "POST", path, {"payload": 1, "id": "x"}, FAST_TYPE)[0] == "refused"
        return
    for kind in (FAST_TYPE, ROUTE_TYPE):
        answer = _http(http, "POST", f"/v1/queues/{name}/messages", {"payload": 1}, kind)
        assert answer == expected, kind


@_SETTINGS
@given(message_id=STRINGS)
def test_every_face_takes_or_refuses_a_message_id_alike(
    message_id: str, store: Path, http: TestClient
) -> None:
    expected = _python_and_cli(store, "q", message_id)
    if json.loads(json.dumps(message_id)) != message_id:
        return  # a surrogate pair as two code points: JSON carries one character instead
    for kind in (FAST_TYPE, ROUTE_TYPE):
        body = {"payload": 1, "id": message_id}
        assert _http(http, "POST", "/v1/queues/q/messages", body, kind) == expected, kind
    batch = {"messages": [{"payload": 1, "id": message_id}]}
    answer = _http(http, "POST", "/v1/queues/q/messages/batch", batch, FAST_TYPE)
    assert answer[0] == expected[0]
    if expected[0] == "refused":
        assert answer[1] == f"item 0: {expected[1]}"


@pytest.mark.parametrize("name", ["tenant/a", "{tag}", " lead", "trail ", ".", ".."])
def test_the_odd_names_of_the_issue_are_refused_by_a_put(name: str) -> None:
    with pytest.raises(ValueError, match="queue name"):
        check_queue_name(name)


@pytest.mark.parametrize("message_id", [".", "..", "a\nb", "a\r\nb", "x\x85", "\ud800"])
def test_ids_no_face_could_address_or_log_are_refused(message_id: str) -> None:
    with pytest.raises(ValueError, match="message id"):
        check_message_id(message_id)


@pytest.mark.parametrize("message_id", ["a/b", "hook:https://example.com/x?y=1", "/lead", "a//b"])
def test_ids_with_slashes_are_welcome_and_addressed_over_http(
    message_id: str, http: TestClient
) -> None:
    """Ids are often made of keys and URLs: the HTTP routes take the rest of the path
    as the id, its slashes encoded or not."""
    assert check_message_id(message_id) == message_id
    body = {"payload": 1, "id": message_id, "delay": 60}
    assert http.post("/v1/queues/q/messages", json=body).status_code == 201
    encoded = "/v1/queues/q/messages/" + quote_from_bytes(message_id.encode(), safe="")
    assert http.get(encoded).json()["id"] == message_id
    moved = http.post(f"{encoded}/reschedule", json={"delay": 120})
    assert moved.status_code == 200, moved.text
    assert http.delete(encoded).json() == {"cancelled": True}


def test_names_and_ids_in_any_script_are_welcome() -> None:
    for text in ("épicerie", "заказ-42", "注文", "order 42", "a.b", "...", "✓"):
        assert check_queue_name(text) == text
        assert check_message_id(text) == text


# -- what is stored already --------------------------------------------------------------

LEGACY_NAMES = ["tenant/a", "{tag}", " lead", "trail ", "a\nb"]
LEGACY_IDS = ["..", ".", "a\r\nb", " x"]


def _store_legacy(url: str) -> None:
    """Write what an older delayq accepted, as it wrote it: straight to the backend."""
    with Queue(url) as root:
        for name in LEGACY_NAMES:
            root.backend.put(name, [stored_request("m")])
        root.backend.put("q", [stored_request(message_id) for message_id in LEGACY_IDS])


def test_what_was_stored_under_refused_names_stays_readable(
    make_client: MakeClient, backend_url: str
) -> None:
    _store_legacy(backend_url)
    client = make_client(backend_url)
    home = client.get("/")
    assert home.status_code == 200, home.text
    listed = {row["name"] for row in client.get("/v1/queues").json()["queues"]}
    assert set(LEGACY_NAMES) <= listed
    with Queue(backend_url) as root:
        for name in LEGACY_NAMES:
            legacy = root.named(name)
            assert legacy.stats().ready == 1
            [msg] = legacy.reserve(wait=0)
            legacy.ack(msg)
            with pytest.raises(ValueError, match="queue name"):
                legacy.put(2)
        queue = root.named("q")
        for message_id in LEGACY_IDS:
            got = queue.get(message_id)
            assert got is not None
            assert got.id == message_id
        assert queue.cancel(".")
        assert queue.reschedule("..", delay=60)
    # Over HTTP, every id a URL path segment can carry.
    for message_id in ("a\r\nb", " x"):
        path = "/v1/queues/q/messages/" + quote_from_bytes(message_id.encode(), safe="")
        assert client.get(path).json()["id"] == message_id
        assert client.delete(path).json() == {"cancelled": True}


# -- durations (issue 15, point 5) -------------------------------------------------------

DURATIONS = st.one_of(
    st.sampled_from(["90", "-5", "-5s", "+5s", " 2m ", "1h30m", "1.5", "1e3", "soon", "nan"]),
    st.sampled_from(["inf", "-", "1h 30m", "30m1h", "5 minutes", "1_000", "", "9" * 400 + "d"]),
    st.text(alphabet=st.sampled_from(list("0123456789.-+ smhdue")), max_size=6),
)


def _put_delay(url: str, delay: str) -> Outcome:
    try:
        with Queue(url, name="q") as queue:
            queue.put(1, delay=delay)
    except (TypeError, ValueError) as exc:
        return ("refused", _words(str(exc)))
    return ("ok", "")


def _put_delay_async(url: str, delay: str) -> Outcome:
    async def run() -> Outcome:
        try:
            async with AsyncQueue(url, name="q") as queue:
                await queue.put(1, delay=delay)
        except (TypeError, ValueError) as exc:
            return ("refused", _words(str(exc)))
        return ("ok", "")

    return asyncio.run(run())


def _cli_delay(url: str, delay: str) -> Outcome:
    result = CliRunner().invoke(main, ["put", "--url", url, f"--delay={delay}", "q", "1"])
    if result.exit_code == 0:
        return ("ok", "")
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    found = _CLI_ERROR.match(line)
    assert found is not None, line
    return ("refused", _words(found.group(1)))


@_SETTINGS
@given(delay=DURATIONS)
def test_every_face_reads_a_duration_alike(delay: str, store: Path, http: TestClient) -> None:
    memory = f"memory://one-rule-{uuid.uuid4().hex}"
    expected = _put_delay(memory, delay)
    assert _put_delay_async(memory, delay) == expected
    assert _cli_delay(f"sqlite:///{store / 'cli.db'}", delay) == expected
    body = {"payload": 1, "delay": delay}
    # Over HTTP the words are the same, after the field's name (body.delay: ...).
    over_http = expected if expected[0] == "ok" else ("refused", f"body.delay: {expected[1]}")
    for kind in (FAST_TYPE, ROUTE_TYPE):
        assert _http(http, "POST", "/v1/queues/q/messages", body, kind) == over_http, kind
    with Queue(memory, name="q") as queue:
        batch: Outcome = ("ok", "")
        try:
            queue.put_many([{"payload": 0}, {"payload": 1, "delay": delay}])
        except ValueError as exc:
            batch = ("refused", _words(str(exc)))
    answer = _http(
        http, "POST", "/v1/queues/q/messages/batch", {"messages": [{"payload": 0}, body]}, FAST_TYPE
    )
    assert answer == batch
    if expected[0] == "refused":
        assert batch[1] == f"item 1: {expected[1]}"


@pytest.mark.parametrize("delay", [-5, -0.5, "-5", "-5s", "-1h"])
def test_a_negative_delay_is_due_now_on_every_face(
    delay: object, http: TestClient, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'now.db'}"
    with Queue(url, name="q") as queue:
        queue.put(1, id="python", delay=delay)
        if isinstance(delay, str):
            assert _cli_delay(url, delay) == ("ok", "")
        assert [msg.payload for msg in queue.reserve(wait=0, max=5)] == [1] * (
            2 if isinstance(delay, str) else 1
        )
    response = http.post("/v1/queues/q/messages", json={"payload": 1, "delay": delay})
    assert response.status_code == 201, response.text
    assert len(http.post("/v1/queues/q/reserve", json={}).json()["messages"]) == 1


def test_seconds_as_a_string_are_seconds_on_every_face(http: TestClient, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'seconds.db'}"
    with Queue(url, name="q") as queue:
        python = queue.put(1, delay="90")
        assert _cli_delay(url, "90") == ("ok", "")
        [cli] = [msg for msg in queue.peek() if msg.id != python]
        for msg in (queue.get(python), cli):
            assert msg is not None
            assert msg.state.value == "scheduled"
    put = http.post("/v1/queues/q/messages", json={"payload": 1, "delay": "90"}).json()
    assert http.get(f"/v1/queues/q/messages/{put['id']}").json()["state"] == "scheduled"


def test_wait_and_lease_errors_name_their_argument(http: TestClient) -> None:
    with Queue(f"memory://one-rule-{uuid.uuid4().hex}", name="q") as queue:
        for call, kind in (
            (lambda: queue.reserve(wait=math.nan), "wait must be finite"),
            (lambda: queue.reserve(wait=0, lease=math.inf), "lease must be finite"),
            (lambda: queue.reserve(wait=0, lease="soon"), "for lease"),
            (lambda: queue.reserve(wait="-1s"), "wait must be >= 0"),
            (lambda: queue.due_counts(horizon=math.nan), "horizon must be finite"),
            (lambda: queue.put(1, delay=1e308), "delay of"),
        ):
            with pytest.raises(ValueError, match=kind):
                call()
