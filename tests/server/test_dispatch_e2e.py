"""The callback dispatcher end to end: real backends (memory, sqlite, redis, kafka), a real
HTTP receiver on a free local port, the dispatcher over a real ServerState."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import http.server
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import threading
import time
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient

from conformance._helpers import stored_request
from conformance.conftest import kafka_purged_url, memory_url, redis_url, sqlite_url
from delayq import __version__
from delayq._duration import seconds_to_ms
from delayq.durable import AsyncQueue, State
from delayq.durable.retry import RetryPolicy
from delayq.server import create_app, queue_from_header
from delayq.server._callbacks import (
    Callback,
    is_loopback_host,
    message_id_from_header,
    message_id_header,
    parse_callback,
    verify,
)
from delayq.server._config import ServeConfig
from delayq.server._constants import CALLBACK_HEADER, CALLBACK_SIGNATURE_HEADER
from delayq.server._dispatch import (
    CallbackRefused,
    Dispatcher,
    Resolve,
    _GuardedNetwork,
    _GuardedTransport,
)
from delayq.server._state import ServerState

SECRET = "test-signing-secret"
QUEUE = "callbacks"
BACKENDS = {
    "memory": memory_url,
    "sqlite": sqlite_url,
    "redis": redis_url,
    "kafka": kafka_purged_url,
}


@pytest.fixture(params=sorted(BACKENDS))
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, isolated store of each backend."""
    yield from BACKENDS[request.param](tmp_path)


@dataclass
class Arrival:
    """One request the receiver got."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at_ms: float

    @property
    def id(self) -> str:
        return self.headers["x-delayq-message-id"]


Answer = Callable[[Arrival, int], Awaitable[int]]


async def always_ok(arrival: Arrival, nth: int) -> int:
    return 200


class Receiver:
    """A tiny HTTP/1.1 server (keep-alive) that records every request and answers
    with ``answer(arrival, nth)``, ``nth`` counting the requests of that message id."""

    def __init__(self, answer: Answer = always_ok, host: str = "127.0.0.1") -> None:
        self.answer = answer
        self.host = host
        self.arrivals: list[Arrival] = []
        self.per_id: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}
        self.port = 0

    async def start(self) -> None:
        await self.start_on(0)

    async def start_on(self, port: int) -> None:
        """Listen on ``port`` (0: a free one) of :attr:`host`."""
        self._server = await asyncio.start_server(self._serve, self.host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._connections:  # idle keep-alive connections
            writer.close()
        tasks = set(self._connections.values())
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[writer] = task
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                at_ms = time.time() * 1000.0
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                arrival = Arrival(method, path, headers, body, at_ms)
                self.arrivals.append(arrival)
                self.per_id[arrival.id] += 1
                status = await self.answer(arrival, self.per_id[arrival.id])
                extra = "Location: /elsewhere\r\n" if 300 <= status < 400 else ""
                writer.write(f"HTTP/1.1 {status} X\r\n{extra}Content-Length: 2\r\n\r\nok".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._connections.pop(writer, None)
            writer.close()


def serve_config(url: str, **options: Any) -> ServeConfig:
    options.setdefault("allow_loopback_callbacks", True)
    options.setdefault("signing_secret", SECRET)
    return ServeConfig(url=url, callback_queues=(QUEUE,), **options)


@asynccontextmanager
async def dispatching(
    config: ServeConfig, answer: Answer = always_ok, *, grace: float = 1.0
) -> AsyncIterator[tuple[ServerState, Dispatcher, Receiver]]:
    """A receiver, a ServerState over ``config`` and its Dispatcher, all running."""
    receiver = Receiver(answer)
    await receiver.start()
    state = ServerState(config)
    dispatcher = Dispatcher(state, grace=grace)
    await dispatcher.start()
    try:
        yield state, dispatcher, receiver
    finally:
        await dispatcher.stop()
        await state.queue(QUEUE).purge()
        await state.close()
        await receiver.stop()


async def put(state: ServerState, cb: Callback, payload: Any = None, **options: Any) -> str:
    headers = {CALLBACK_HEADER: cb.to_header()}
    return await state.queue(QUEUE).put(
        {"n": 1} if payload is None else payload, headers=headers, **options
    )


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def callbacks_total(state: ServerState, outcome: str) -> float:
    value = state.metrics.registry.get_sample_value(
        "delayq_callbacks_total", {"queue": QUEUE, "outcome": outcome}
    )
    return value or 0.0


# -- delivery ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_each_callback_arrives_once_not_early_signed(backend_url: str) -> None:
    async def scenario() -> None:
        async with dispatching(serve_config(backend_url)) as (state, _, receiver):
            cb = parse_callback({"url": receiver.url()}, state.config)
            ids: dict[str, Any] = {}
            due: dict[str, int] = {}
            start = time.time()
            for i in range(30):
                payload: Any = {"n": i, "text": "é"} if i % 3 else f"raw-{i}".encode()
                at = start + (i % 6) * 0.1  # the first ones are due at once
                id = await put(state, cb, payload, at=at)
                ids[id], due[id] = payload, seconds_to_ms(at)
            await wait_until(lambda: len(receiver.per_id) == len(ids))
            await asyncio.sleep(0.3)  # a duplicate would come now
            assert receiver.per_id == Counter(dict.fromkeys(ids, 1))
            for arrival in receiver.arrivals:
                late_ms = arrival.at_ms - due[arrival.id]
                assert 0 <= late_ms < 2000, late_ms
                signature = arrival.headers[CALLBACK_SIGNATURE_HEADER.lower()]
                assert verify(SECRET, signature, arrival.body)
                assert not verify("wrong", signature, arrival.body)
                assert arrival.method == "POST"
                assert arrival.path == "/hook"
                assert arrival.headers["x-delayq-queue"] == QUEUE
                assert arrival.headers["x-delayq-attempt"] == "1"
                assert arrival.headers["user-agent"] == f"delayq/{__version__}"
                payload = ids[arrival.id]
                if isinstance(payload, bytes):
                    assert arrival.body == payload
                    assert arrival.headers["content-type"] == "application/octet-stream"
                else:
                    assert arrival.body == '{"n":%d,"text":"é"}'.encode() % payload["n"]
                    assert arrival.headers["content-type"] == "application/json"
            await wait_until(lambda: callbacks_total(state, "delivered") == len(ids))
            stats = await state.queue(QUEUE).stats()
            assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (0, 0, 0, 0)

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_500_twice_then_200_is_retried_with_backoff(backend_url: str) -> None:
    async def answer(arrival: Arrival, nth: int) -> int:
        return 500 if nth <= 2 else 200

    policy = RetryPolicy(max_attempts=5, base=0.1, factor=3.0, jitter=0.0)
    config = serve_config(backend_url, backend_options={"retry": policy})

    async def scenario() -> None:
        async with dispatching(config, answer) as (state, dispatcher, receiver):
            cb = Callback(receiver.url(), method="PUT", headers={"Authorization": "Bearer x"})
            id = await put(state, cb)
            await wait_until(lambda: receiver.per_id[id] == 3)
            await wait_until(lambda: dispatcher.counts["delivered"] == 1)
            assert await state.queue(QUEUE).get(id) is None
            first, second, third = receiver.arrivals
            assert [a.headers["x-delayq-attempt"] for a in receiver.arrivals] == ["1", "2", "3"]
            assert all(a.method == "PUT" for a in receiver.arrivals)
            assert all(a.headers["authorization"] == "Bearer x" for a in receiver.arrivals)
            gap1, gap2 = second.at_ms - first.at_ms, third.at_ms - second.at_ms
            assert gap1 >= 100  # the backoff is never cut short
            assert gap2 >= 300
            assert gap2 > gap1
            assert callbacks_total(state, "http_error") == 2
            assert callbacks_total(state, "delivered") == 1

    asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_always_failing_goes_dead_with_last_error(backend_url: str) -> None:
    async def answer(arrival: Arrival, nth: int) -> int:
        return 503

    policy = RetryPolicy(max_attempts=3, base=0.02, jitter=0.0)
    config = serve_config(backend_url, backend_options={"retry": policy})

    async def scenario() -> None:
        async with dispatching(config, answer) as (state, dispatcher, receiver):
            id = await put(state, Callback(receiver.url("/fail?token=secret")))
            await wait_until(lambda: dispatcher.counts["dead"] == 1)
            msg = await state.queue(QUEUE).get(id)
            assert msg is not None
            assert msg.state is State.DEAD
            assert msg.attempts == 3
            assert msg.last_error == f"HTTP 503 from {receiver.url('/fail')}"
            assert receiver.per_id[id] == 3
            value = state.metrics.registry.get_sample_value("delayq_dead_total", {"queue": QUEUE})
            assert value == 1

    asyncio.run(scenario())


# -- the signature, v2 ----------------------------------------------------------------------


def signature_fields(arrival: Arrival) -> dict[str, str]:
    header = arrival.headers[CALLBACK_SIGNATURE_HEADER.lower()]
    return dict(part.split("=", 1) for part in header.split(","))


def received_url(arrival: Arrival) -> str:
    """The URL as a receiver rebuilds it: its scheme, the Host header, the target."""
    return f"http://{arrival.headers['host']}{arrival.path}"


@pytest.mark.timeout(30)
def test_signature_v2_signs_method_url_message_id_and_body() -> None:
    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        sent = [
            await put(state, Callback(receiver.url("/orders/1?k=v"), method="GET")),
            await put(state, Callback(receiver.url("/orders/2"), method="GET")),
            await put(state, Callback(receiver.url("/orders/3"), method="DELETE"), b""),
            await put(state, Callback(receiver.url("/orders/4"), method="PUT"), {"n": 4}),
        ]
        await wait_until(lambda: len(receiver.arrivals) == len(sent))
        for arrival in receiver.arrivals:
            fields = signature_fields(arrival)
            header = arrival.headers[CALLBACK_SIGNATURE_HEADER.lower()]
            url = received_url(arrival)
            # As the README documents it, computed by hand:
            signed = f"{fields['t']}\n{arrival.method}\n{url}\n{arrival.id}\n".encode()
            expected = hmac.new(SECRET.encode(), signed + arrival.body, hashlib.sha256)
            assert fields["v2"] == expected.hexdigest()
            request = {"method": arrival.method, "url": url, "message_id": arrival.id}
            assert verify(SECRET, header, arrival.body, **request)
            assert verify(SECRET, header, arrival.body)  # v1, for existing receivers
            for other in receiver.arrivals:
                if other is not arrival:  # no request's signature passes for another's
                    theirs = {"method": other.method, "url": received_url(other)}
                    assert not verify(SECRET, header, other.body, **theirs, message_id=other.id)
                    assert not verify(SECRET, header, arrival.body, **{**request, **theirs})
                    mixed = {**request, "message_id": other.id}
                    assert not verify(SECRET, header, arrival.body, **mixed)
        first, second = receiver.arrivals[:2]
        assert first.body == second.body == b""
        assert signature_fields(first)["v2"] != signature_fields(second)["v2"]

    run_memory(body)


README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(language: str, marker: str) -> str:
    """The README's fenced ``language`` block that holds ``marker``."""
    fence = re.compile(rf"^```{language}\n(.*?)^```$", re.MULTILINE | re.DOTALL)
    blocks = [b for b in fence.findall(README.read_text(encoding="utf-8")) if marker in b]
    assert len(blocks) == 1, f"{len(blocks)} {language} blocks of the README hold {marker!r}"
    return str(blocks[0])


SIGNED_HEADERS = ("x-delayq-message-id", "x-delayq-queue", "x-delayq-attempt", "content-type")


def forgeries(
    arrival: Arrival, other: Arrival
) -> dict[str, tuple[str, str, dict[str, str], bytes]]:
    """``arrival``'s request (method, url, headers, body) with one signed part changed
    at a time, by name: each must fail verification."""
    method, url, headers, body = (
        arrival.method,
        received_url(arrival),
        arrival.headers,
        arrival.body,
    )
    signature = headers[CALLBACK_SIGNATURE_HEADER.lower()]
    other_url = received_url(other)
    if other_url == url:  # two arrivals at one URL (in whatever order they came)
        other_url = f"{url}{'&' if '?' in url else '?'}forged=1"
    changed = {
        "method": ("PATCH" if method != "PATCH" else "PUT", url, headers, body),
        "url": (method, other_url, headers, body),
        "body": (method, url, headers, body + b" "),
        "no v3": (
            method, url,
            {**headers, CALLBACK_SIGNATURE_HEADER.lower(): signature.rsplit(",v3=", 1)[0]},
            body,
        ),
    }  # fmt: skip
    for name in SIGNED_HEADERS:
        value = headers.get(name, "")
        theirs = other.headers.get(name, "")
        forged = theirs if theirs != value else f"{value}9"  # attempt 1 -> 19
        changed[name] = (method, url, {**headers, name: forged}, body)
    changed["no content-type" if "content-type" in headers else "a content-type"] = (
        method,
        url,
        {k: v for k, v in headers.items() if k != "content-type"}
        if "content-type" in headers
        else {**headers, "content-type": "application/json"},
        body,
    )
    return changed


def readme_cases(arrivals: list[Arrival]) -> list[dict[str, Any]]:
    """What each arrival asks a receiver to check, and forged copies of each (one
    signed part changed at a time, :func:`forgeries`)."""
    cases = []
    for arrival, other in zip(arrivals, arrivals[1:] + arrivals[:1], strict=True):
        request = (arrival.method, received_url(arrival), arrival.headers, arrival.body)
        for what, (method, url, headers, body) in [
            ("sent", request),
            *forgeries(arrival, other).items(),
        ]:
            cases.append(
                {
                    "what": what,
                    "method": method,
                    "url": url,
                    "headers": headers,
                    "body": base64.b64encode(body).decode(),
                    "valid": what == "sent",
                }
            )
    return cases


def run_readme_receivers(check: Callable[[Receiver], None]) -> None:
    """Five callbacks (a bodyless GET, a POST, one whose id is sent encoded, bytes
    sent by PUT, one whose callback sets its Content-Type) delivered, then
    `check(receiver)`."""

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        await put(state, Callback(receiver.url("/a?k=1"), method="GET"))
        await put(state, Callback(receiver.url("/b"), method="POST"), {"n": "é"})
        await put(state, Callback(receiver.url("/c")), {"n": 3}, id="注文-42")
        await put(state, Callback(receiver.url("/d"), method="PUT"), b"\x00raw")
        typed = Callback(receiver.url("/e"), headers={"Content-Type": "text/plain; charset=utf-8"})
        await put(state, typed, "text")
        await wait_until(lambda: len(receiver.arrivals) == 5)
        assert "UTF-8''%E6%B3%A8%E6%96%87-42" in receiver.per_id
        types = {a.path: a.headers.get("content-type") for a in receiver.arrivals}
        assert types == {
            "/a?k=1": None,
            "/b": "application/json",
            "/c": "application/json",
            "/d": "application/octet-stream",
            "/e": "text/plain; charset=utf-8",
        }
        check(receiver)

    run_memory(body)


def test_v3_signs_every_header_a_receiver_is_told_to_trust() -> None:
    """Through the dispatcher: ``verify`` with the request's v3 parts passes the
    request as sent and fails it with any one signed part changed (or v3 stripped,
    unless v2 is accepted); the v3 digest is the README's, computed by hand."""

    def check(receiver: Receiver) -> None:
        for case in readme_cases(receiver.arrivals):
            headers = case["headers"]
            header = headers[CALLBACK_SIGNATURE_HEADER.lower()]
            request = {
                "method": case["method"],
                "url": case["url"],
                "message_id": headers["x-delayq-message-id"],
                "queue": headers["x-delayq-queue"],
                "attempt": headers["x-delayq-attempt"],
                "content_type": headers.get("content-type", ""),
            }
            body = base64.b64decode(case["body"])
            valid = verify(SECRET, header, body, **request)
            assert valid is case["valid"], case["what"]
            if case["what"] == "no v3":  # an older server's header: v2 accepted on request
                assert verify(SECRET, header, body, **request, accept_v2=True)
        for arrival in receiver.arrivals:
            fields = signature_fields(arrival)
            lines = [
                "v3", fields["t"], arrival.method, received_url(arrival),
                *(arrival.headers.get(name, "") for name in SIGNED_HEADERS),
            ]  # fmt: skip
            signed = "".join(f"{line}\n" for line in lines).encode() + arrival.body
            expected = hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
            assert fields["v3"] == expected

    run_readme_receivers(check)


@pytest.mark.timeout(30)
def test_the_readme_python_receiver_verifies_v3() -> None:
    namespace: dict[str, Any] = {}
    exec(readme_block("python", '"v3"'), namespace)
    verified = namespace["verified"]

    def check(receiver: Receiver) -> None:
        for case in readme_cases(receiver.arrivals):
            body = base64.b64decode(case["body"])
            args = (SECRET, case["method"], case["url"], case["headers"], body)
            assert verified(*args) is case["valid"], case["what"]

    run_readme_receivers(check)


def node_or_skip() -> str:
    """The path of ``node``; a skip without it, a failure when ``$CI`` is set."""
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("the README's Node receiver is tested on CI: node is not installed")
        pytest.skip("node is not installed")
    return node


def node_receiver(cases: list[dict[str, Any]], values: list[str]) -> tuple[list[Any], list[Any]]:
    """What the README's Node receiver answers: ``verified()`` of each case, and
    ``decoded()`` of each header value."""
    node = node_or_skip()
    code = readme_block("js", "fields.v3") + (
        "\nconst asked = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "\nconsole.log(JSON.stringify([asked.cases.map((c) => verified("
        "c.secret, c.method, c.url, c.headers, Buffer.from(c.body, 'base64'))),"
        " asked.values.map(decoded)]));"
    )
    asked = {"cases": [{**case, "secret": SECRET} for case in cases], "values": values}
    result = subprocess.run(
        [node, "-e", code], input=json.dumps(asked), capture_output=True, text=True,
        timeout=20, check=True,
    )  # fmt: skip
    verified, decoded = json.loads(result.stdout)
    assert len(verified) == len(cases)
    assert len(decoded) == len(values)
    return verified, decoded


@pytest.mark.timeout(30)
def test_the_readme_node_receiver_verifies_v3() -> None:
    node_or_skip()

    def check(receiver: Receiver) -> None:
        cases = readme_cases(receiver.arrivals)
        answers, _ = node_receiver(cases, [])
        got = [(c["what"], c["url"], answer) for c, answer in zip(cases, answers, strict=True)]
        assert got == [(c["what"], c["url"], c["valid"]) for c in cases]

    run_readme_receivers(check)


# -- queues of any name (issue 35, point 1) -------------------------------------------------

# Queue names a header cannot carry as they are, with the header each is sent in.
NAMED_QUEUES = {
    "wébhooks": "UTF-8''w%C3%A9bhooks",
    "🪝 hooks": "UTF-8''%F0%9F%AA%9D%20hooks",
}


@contextmanager
def recording_receiver() -> Iterator[tuple[int, list[Arrival]]]:
    """A threaded HTTP receiver on a free loopback port that answers 200 and records
    every request (headers by lowercase name, as received): its port and arrivals."""
    arrivals: list[Arrival] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def record(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            arrivals.append(Arrival(self.command, self.path, headers, body, time.time() * 1e3))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = record  # noqa: N815 (http.server's names)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], arrivals
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(90)
def test_a_callback_queue_of_any_name_delivers_and_the_readme_receivers_decode_it(
    backend_url: str,
) -> None:
    """Issue 35, point 1: with ``--callback-queue 'wébhooks'`` every message went dead
    unsent (``'ascii' codec can't encode character``): X-Delayq-Queue was sent raw.
    Through the app (put over HTTP, the app's own dispatcher): each message arrives
    once, X-Delayq-Queue encoded as the id is, v3 signing it as received, and the
    README's receivers verify every request (and no forged copy) and decode the queue
    name and the id."""
    config = ServeConfig(
        url=backend_url,
        dispatch=True,
        callback_queues=tuple(NAMED_QUEUES),
        allow_loopback_callbacks=True,
        signing_secret=SECRET,
        backend_options={"retry": RetryPolicy(max_attempts=1)},
    )
    with (
        recording_receiver() as (port, arrivals),
        TestClient(create_app(config), base_url="http://localhost") as client,
    ):
        sent: dict[str, str] = {}  # id -> queue
        for queue in NAMED_QUEUES:
            path = f"/v1/queues/{quote(queue, safe='')}/messages"
            for id, callback, payload in [
                (f"注文-{queue}", {"url": f"http://127.0.0.1:{port}/hook?k=1"}, {"n": "é"}),
                (f"plain-{len(sent)}", {"url": f"http://127.0.0.1:{port}/get", "method": "GET"},
                 None),
            ]:  # fmt: skip
                body = {"payload": payload, "callback": callback, "id": id}
                answer = client.post(path, json=body)
                assert answer.status_code == 201, answer.text
                sent[id] = queue
        deadline = time.monotonic() + 30
        for id, queue in sent.items():
            url = f"/v1/queues/{quote(queue, safe='')}/messages/{quote(id, safe='')}"
            while (answer := client.get(url)).status_code != 404:  # acked: gone
                message = answer.json()
                assert message["state"] != "dead", message["last_error"]
                assert time.monotonic() < deadline, f"{id} was not delivered: {message}"
                time.sleep(0.02)
    assert len(arrivals) == len(sent)
    readme: dict[str, Any] = {}
    exec(readme_block("python", '"v3"'), readme)
    for arrival in arrivals:
        header = arrival.headers["x-delayq-queue"]
        id = message_id_from_header(arrival.id)
        assert header == NAMED_QUEUES[sent[id]]
        assert queue_from_header(header) == sent[id]
        assert readme["decoded"](header) == sent[id]
        assert readme["decoded"](arrival.id) == id
        request = {
            "method": arrival.method,
            "url": received_url(arrival),
            "message_id": arrival.id,
            "queue": header,
            "attempt": arrival.headers["x-delayq-attempt"],
            "content_type": arrival.headers.get("content-type", ""),
        }
        signature = arrival.headers[CALLBACK_SIGNATURE_HEADER.lower()]
        assert verify(SECRET, signature, arrival.body, **request, tolerance=600)
        decoded_queue = {**request, "queue": sent[id]}  # the name is not what was signed
        assert not verify(SECRET, signature, arrival.body, **decoded_queue, tolerance=600)
    cases = readme_cases(arrivals)
    for case in cases:
        args = (SECRET, case["method"], case["url"], case["headers"])
        assert readme["verified"](*args, base64.b64decode(case["body"])) is case["valid"]
    if shutil.which("node") is not None or os.environ.get("CI"):
        values = [a.headers[name] for a in arrivals for name in SIGNED_HEADERS[:2]]
        answers, decoded = node_receiver(cases, values)
        assert answers == [case["valid"] for case in cases]
        assert decoded == [message_id_from_header(value) for value in values]
        assert set(decoded) == set(sent) | set(NAMED_QUEUES)


# Ids a header cannot carry as they are (non-ASCII, spaces at an end, a control
# character, the marker itself) and ids it can, with the header each is sent in.
ENCODED_IDS = {
    "café-1": "UTF-8''caf%C3%A9-1",
    "注文-42": "UTF-8''%E6%B3%A8%E6%96%87-42",
    " padded ": "UTF-8''%20padded%20",
    "a\nb": "UTF-8''a%0Ab",
    "UTF-8''plain": "UTF-8''UTF-8%27%27plain",
    "100%/é?": "UTF-8''100%25%2F%C3%A9%3F",
    "plain-ascii id": "plain-ascii id",
    "odd'%20chars": "odd'%20chars",
}
# Of those, the ids a put refuses today (an older version stored them).
STORED_ONLY = {" padded ", "a\nb"}


def test_message_id_header_round_trips() -> None:
    for id, header in ENCODED_IDS.items():
        assert message_id_header(id) == header
        assert message_id_from_header(header) == id
        assert header.isascii()
        assert header == header.strip()
    for bad in ["UTF-8''%E6", "UTF-8''%zz", "UTF-8''a b"]:
        with pytest.raises(ValueError, match="not a percent-encoded message id"):
            message_id_from_header(bad)
    with pytest.raises(ValueError, match="lone surrogate"):
        message_id_header("x\ud800")


@pytest.mark.timeout(60)
def test_a_message_id_a_header_cannot_carry_is_sent_encoded_and_signed(backend_url: str) -> None:
    """Issue 16: ids such as ``café-1`` were never sent. Each id is delivered once, in
    ``X-Delayq-Message-Id`` as documented, and v2 signs the header as received."""
    config = serve_config(backend_url, backend_options={"retry": RetryPolicy(max_attempts=1)})

    async def scenario() -> None:
        async with dispatching(config) as (state, dispatcher, receiver):
            cb = Callback(receiver.url("/hook?k=1"))
            for id in ENCODED_IDS:
                if id in STORED_ONLY:  # a put refuses it now; an older version stored it
                    body = json.dumps({"id": id}).encode()
                    stored = stored_request(id, body, headers={CALLBACK_HEADER: cb.to_header()})
                    await state.queue(QUEUE).backend.put(QUEUE, [stored])
                else:
                    assert await put(state, cb, {"id": id}, id=id) == id
            await wait_until(lambda: dispatcher.counts["delivered"] == len(ENCODED_IDS))
            assert callbacks_total(state, "delivered") == len(ENCODED_IDS)
            assert sorted(receiver.per_id.values()) == [1] * len(ENCODED_IDS)
            for arrival in receiver.arrivals:
                id = message_id_from_header(arrival.id)
                assert arrival.id == ENCODED_IDS[id]
                assert json.loads(arrival.body) == {"id": id}
                header = arrival.headers[CALLBACK_SIGNATURE_HEADER.lower()]
                url = received_url(arrival)
                signed = f"{signature_fields(arrival)['t']}\nPOST\n{url}\n{arrival.id}\n"
                digest = hmac.new(SECRET.encode(), signed.encode() + arrival.body, "sha256")
                assert signature_fields(arrival)["v2"] == digest.hexdigest()
                request = {"method": "POST", "url": url, "message_id": arrival.id}
                assert verify(SECRET, header, arrival.body, **request)
                if id != arrival.id:  # the decoded id is not what was signed
                    assert not verify(SECRET, header, arrival.body, **{**request, "message_id": id})
            stats = await state.queue(QUEUE).stats()
            assert (stats.ready, stats.active, stats.dead) == (0, 0, 0)

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_a_message_id_that_is_not_unicode_text_goes_dead_with_its_reason() -> None:
    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        header = {CALLBACK_HEADER: Callback(receiver.url()).to_header()}
        queue = state.queue(QUEUE)
        # A lone surrogate (no text at all), which a put now refuses, as an older
        # version could store it.
        id = "x\ud800"
        await queue.backend.put(QUEUE, [stored_request(id, b'{"n": 1}', headers=header)])
        msg = await dead_message(state, id)
        assert msg.attempts == 1
        assert msg.last_error.startswith("callback refused: message id ")
        assert "lone surrogate" in msg.last_error
        assert callbacks_total(state, "refused") == 1
        assert receiver.arrivals == []

    run_memory(body)


@pytest.mark.timeout(30)
def test_a_callback_whose_payload_cannot_be_read_goes_dead_unsent() -> None:
    """A record another process wrote with another serializer (pickle) is not sent as
    ``null``: it goes dead at once, saying why."""

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        header = {CALLBACK_HEADER: Callback(receiver.url()).to_header()}
        url = state.config.url
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pickle's warning
            pickled = AsyncQueue(url, name=QUEUE, serializer=pickle)
            id = await pickled.put({"made": "by pickle"}, headers=header, max_attempts=5)
            await pickled.close()
        msg = await dead_message(state, id)
        assert msg.attempts == 1
        assert msg.last_error.startswith("callback refused: its payload cannot be read")
        assert receiver.arrivals == []

    run_memory(body)


@pytest.mark.timeout(30)
def test_a_callback_whose_headers_cannot_be_read_goes_dead_unsent() -> None:
    """Headers written to the store below a put's checks (nested 100,000 deep, not
    strings) are not read as a callback: the message goes dead at once, saying why
    (issue 33, point 8)."""

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        nested: Any = "x"
        for _ in range(100_000):
            nested = {"a": nested}
        headers = {CALLBACK_HEADER: Callback(receiver.url()).to_header(), "h": nested}
        request = stored_request("deep", b"1", headers=headers)
        await state.queue(QUEUE).backend.put(QUEUE, [request])
        msg = await dead_message(state, "deep")
        assert msg.attempts == 1
        assert msg.last_error.startswith("callback refused: its headers cannot be read")
        assert receiver.arrivals == []

    run_memory(body)


# -- failures of other kinds (backend-independent: memory://) --------------------------------


def run_memory(
    body: Callable[[ServerState, Dispatcher, Receiver], Awaitable[None]],
    answer: Answer = always_ok,
    **options: Any,
) -> None:
    options.setdefault("backend_options", {"retry": RetryPolicy(max_attempts=1)})
    grace = options.pop("grace", 1.0)
    config = serve_config(next(memory_url(Path("."))), **options)

    async def scenario() -> None:
        async with dispatching(config, answer, grace=grace) as running:
            await body(*running)

    asyncio.run(scenario())


async def dead_message(state: ServerState, id: str) -> Any:
    deadline = time.monotonic() + 10
    while True:
        msg = await state.queue(QUEUE).get(id)
        if msg is not None and msg.state is State.DEAD:
            return msg
        assert time.monotonic() < deadline, f"{id} did not go dead: {msg}"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(30)
def test_timeout_is_a_failure_with_its_error() -> None:
    async def answer(arrival: Arrival, nth: int) -> int:
        await asyncio.sleep(0.5)
        return 200

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        id = await put(state, Callback(receiver.url(), timeout=0.2))
        msg = await dead_message(state, id)
        assert msg.last_error == f"timeout after 0.2s calling {receiver.url()}"
        assert callbacks_total(state, "timeout") == 1

    run_memory(body, answer, grace=0.0)


@pytest.mark.timeout(30)
def test_connection_error_is_a_failure_with_its_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        id = await put(state, Callback(f"http://127.0.0.1:{port}/x"))
        msg = await dead_message(state, id)
        assert msg.last_error.startswith(f"connection error calling http://127.0.0.1:{port}/x")
        assert callbacks_total(state, "connection_error") == 1

    run_memory(body)


@pytest.mark.timeout(30)
def test_redirects_are_not_followed() -> None:
    async def answer(arrival: Arrival, nth: int) -> int:
        return 302

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        id = await put(state, Callback(receiver.url()))
        msg = await dead_message(state, id)
        assert msg.last_error == f"HTTP 302 from {receiver.url()}"
        assert [a.path for a in receiver.arrivals] == ["/hook"]

    run_memory(body, answer)


@pytest.mark.timeout(30)
def test_missing_or_invalid_callback_header_goes_dead_at_once() -> None:
    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        queue = state.queue(QUEUE)
        plain = await queue.put({"n": 1}, max_attempts=5)
        garbage = await queue.put({"n": 2}, headers={CALLBACK_HEADER: "{nope"}, max_attempts=5)
        ftp = await queue.put(
            {"n": 3}, headers={CALLBACK_HEADER: '{"url": "ftp://x/"}'}, max_attempts=5
        )
        for id, fragment in [(plain, "no callback header"), (garbage, "not JSON"), (ftp, "http")]:
            msg = await dead_message(state, id)
            assert msg.attempts == 1
            assert msg.last_error.startswith("callback refused: ")
            assert fragment in msg.last_error
        assert receiver.arrivals == []
        assert callbacks_total(state, "refused") == 3

    run_memory(body)


@pytest.mark.timeout(30)
def test_allowlist_is_checked_again_at_send_time() -> None:
    url = next(memory_url(Path(".")))
    # Put while loopback was allowed; the server now runs without the flag.
    before = ServerState(serve_config(url))
    after = serve_config(url, allow_loopback_callbacks=False)

    async def scenario() -> None:
        id = await put(before, Callback("http://127.0.0.1:9/hook"), max_attempts=5)
        async with dispatching(after) as (state, _, receiver):
            msg = await dead_message(state, id)
            assert "--allow-loopback-callbacks" in msg.last_error
            assert receiver.arrivals == []
        await before.close()

    asyncio.run(scenario())


def _name_resolving_to_loopback() -> str | None:
    """A host name that is not ``localhost`` but resolves to a loopback address."""
    for name in {socket.gethostname(), "vm", "runsc"}:
        try:
            infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
        except OSError:
            continue
        if not is_loopback_host(name) and all(is_loopback_host(str(info[4][0])) for info in infos):
            return name
    return None


@pytest.fixture
def loopback_name() -> str:
    """A name (not ``localhost``) that resolves to loopback here, else a skip."""
    name = _name_resolving_to_loopback()
    if name is None:
        pytest.skip("no host name here resolves to loopback")
    return name


@pytest.mark.timeout(30)
def test_a_name_resolving_to_loopback_is_refused_when_sent(loopback_name: str) -> None:
    name = loopback_name

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        cb = parse_callback(f"http://{name}:{receiver.port}/hook", state.config)  # allowed
        id = await put(state, cb)
        msg = await dead_message(state, id)
        assert "resolves to a refused address" in msg.last_error
        assert receiver.arrivals == []
        assert callbacks_total(state, "refused") == 1

    run_memory(body, allow_loopback_callbacks=False, callback_hosts=(f"{name}:*",))


# -- the guard at the connection: the host httpx connects to, its port, its addresses ------


async def guarded_attempt(
    config: ServeConfig, host: str, port: int, resolve: Resolve | None = None
) -> str | None:
    """Open a connection through the dispatcher's guard and close it: None when it
    connected, else why it was refused."""
    network = _GuardedNetwork(config) if resolve is None else _GuardedNetwork(config, resolve)
    try:
        stream = await network.connect_tcp(host, port, timeout=5.0)
    except CallbackRefused as exc:
        return str(exc)
    await stream.aclose()
    return None


@pytest.mark.timeout(30)
def test_the_connection_checks_the_host_and_port_against_the_allowlist(loopback_name: str) -> None:
    name = loopback_name

    async def scenario() -> None:
        receiver = Receiver()
        await receiver.start()
        port = receiver.port

        def with_hosts(*hosts: str) -> ServeConfig:  # loopback addresses allowed
            return serve_config("memory://guard", callback_hosts=hosts)

        try:
            # The name resolves to an allowed (loopback) address, but is not listed.
            assert "allowlist" in (await guarded_attempt(with_hosts(), name, port) or "")
            # Listed without a port: its default ports only.
            assert "allowlist" in (await guarded_attempt(with_hosts(name), name, port) or "")
            other = f"{name}:{port + 1 if port < 65535 else 1}"
            assert "allowlist" in (await guarded_attempt(with_hosts(other), name, port) or "")
            assert await guarded_attempt(with_hosts(f"{name}:*"), name, port) is None
            assert await guarded_attempt(with_hosts(f"{name}:{port}"), name, port) is None
            # Loopback targets keep any port with --allow-loopback-callbacks.
            assert await guarded_attempt(with_hosts(), "127.0.0.1", port) is None
            assert await guarded_attempt(with_hosts(), "localhost", port) is None
        finally:
            await receiver.stop()

    asyncio.run(scenario())


class FixedResolver:
    """A resolver whose answer the test chooses; it records the names asked."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return self.addresses


class RebindingResolver:
    """A name that answers one address to the first lookup and another after (DNS
    rebinding); it records the names asked."""

    def __init__(self, first: str, then: str) -> None:
        self.answers = [first, then]
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return [self.answers[min(len(self.asked), 2) - 1]]


REBINDING_NAME = "rebinding.invalid"  # RFC 6761: never resolves for real


@pytest.mark.timeout(30)
def test_the_connection_goes_to_the_address_checked_not_to_the_name_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The name is resolved once, its address checked, and the connection goes to that
    address: a name that answers a checked address first and another loopback one
    after (the test's resolver, and the system's resolver for that name) must not
    reach the second one. The second loopback address stands for an internal service
    (127.0.0.2, which every Linux loopback interface answers)."""
    real_getaddrinfo = socket.getaddrinfo

    def system_resolver(host: Any, *args: Any, **kwargs: Any) -> Any:
        # Were the dispatcher to connect to the name, the system would say 127.0.0.2.
        name = host.decode() if isinstance(host, bytes) else host
        return real_getaddrinfo("127.0.0.2" if name == REBINDING_NAME else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", system_resolver)

    async def scenario() -> None:
        checked = Receiver()
        await checked.start()
        internal = Receiver(host="127.0.0.2")
        await internal.start_on(checked.port)
        resolver = RebindingResolver("127.0.0.1", "127.0.0.2")
        config = serve_config("memory://guard", callback_hosts=(f"{REBINDING_NAME}:*",))
        transport = _GuardedTransport(config, resolve=resolver)
        try:
            async with httpx.AsyncClient(transport=transport) as client:
                url = f"http://{REBINDING_NAME}:{checked.port}/hook"
                headers = {"X-Delayq-Message-Id": "m-1"}
                response = await client.post(url, headers=headers, content=b"x")
                assert response.status_code == 200
            assert resolver.asked == [REBINDING_NAME]  # resolved once, then pinned
            assert len(checked.arrivals) == 1
            assert internal.arrivals == []
            # The guard alone, as the dispatcher's connection pool calls it.
            resolver = RebindingResolver("127.0.0.1", "127.0.0.2")
            network = _GuardedNetwork(config, resolver)
            stream = await network.connect_tcp(REBINDING_NAME, checked.port, timeout=5.0)
            try:
                peer = stream.get_extra_info("server_addr")
            finally:
                await stream.aclose()
            assert peer == ("127.0.0.1", checked.port)
            assert resolver.asked == [REBINDING_NAME]
        finally:
            await internal.stop()
            await checked.stop()

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_the_connection_checks_the_idna2008_name_before_resolving_it() -> None:
    # httpx connects to api.xn--busine-gta.com for api.busineß.com; a listed
    # api.business.com (its IDNA2003 form) must not let it through.
    resolver = FixedResolver("127.0.0.1")
    config = serve_config("memory://guard", callback_hosts=("api.business.com:*",))
    reason = asyncio.run(guarded_attempt(config, "api.xn--busine-gta.com", 443, resolver))
    assert reason is not None
    assert "api.xn--busine-gta.com" in reason
    assert "allowlist" in reason
    assert resolver.asked == []  # refused before any lookup


@pytest.mark.timeout(30)
def test_the_http_client_goes_through_the_guard_with_its_own_host() -> None:
    """httpx, over the dispatcher's transport, asks the guard for the IDNA2008 name;
    listed in that form it reaches the receiver (the test's resolver says 127.0.0.1)."""

    async def scenario() -> None:
        receiver = Receiver()
        await receiver.start()
        url = f"http://api.busineß.com:{receiver.port}/hook"
        try:
            for listed, arrives in [("api.business.com:*", False), ("api.busineß.com:*", True)]:
                resolver = FixedResolver("127.0.0.1")
                config = serve_config("memory://guard", callback_hosts=(listed,))
                transport = _GuardedTransport(config, resolve=resolver)
                async with httpx.AsyncClient(transport=transport) as client:
                    headers = {"X-Delayq-Message-Id": "m-1"}
                    if arrives:
                        response = await client.post(url, headers=headers, content=b"x")
                        assert response.status_code == 200
                        assert resolver.asked == ["api.xn--busine-gta.com"]
                    else:
                        with pytest.raises(CallbackRefused, match="xn--busine-gta"):
                            await client.post(url, headers=headers, content=b"x")
                        assert resolver.asked == []
            assert [a.headers["host"] for a in receiver.arrivals] == [
                f"api.xn--busine-gta.com:{receiver.port}"
            ]
        finally:
            await receiver.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("addresses", "options", "fragment"),
    [
        (("10.0.0.7",), {}, "private"),
        (("127.0.0.1", "192.168.1.20"), {}, "private"),
        (("100.64.0.1",), {}, "shared"),
        (("fd12::1",), {}, "unique local"),
        (("64:ff9b::808:808",), {}, "NAT64"),
        (("240.0.0.1",), {}, "reserved"),
        (
            ("2002:7f00:1::",),
            {"allow_private_callbacks": True, "allow_loopback_callbacks": False},
            "127.0.0.1",
        ),
        (("::ffff:169.254.169.254",), {"allow_private_callbacks": True}, "link-local"),
    ],
)
@pytest.mark.timeout(30)
def test_the_connection_refuses_non_public_addresses_by_default(
    addresses: tuple[str, ...], options: dict[str, Any], fragment: str
) -> None:
    resolver = FixedResolver(*addresses)
    config = serve_config("memory://guard", callback_hosts=("hooks.example.com",), **options)
    reason = asyncio.run(guarded_attempt(config, "hooks.example.com", 443, resolver))
    assert reason is not None
    assert "resolves to a refused address" in reason
    assert fragment in reason
    assert resolver.asked == ["hooks.example.com"]


@pytest.mark.timeout(30)
def test_stop_releases_requests_still_running_without_charging_an_attempt() -> None:
    release = asyncio.Event()

    async def answer(arrival: Arrival, nth: int) -> int:
        await release.wait()
        return 200

    async def scenario() -> None:
        config = serve_config(next(memory_url(Path("."))))
        receiver = Receiver(answer)
        await receiver.start()
        state = ServerState(config)
        dispatcher = Dispatcher(state, grace=0.1)
        await dispatcher.start()
        id = await put(state, Callback(receiver.url()))
        await wait_until(lambda: receiver.per_id[id] == 1)
        assert dispatcher.in_flight == 1
        await dispatcher.stop()
        assert not dispatcher.running
        msg = await state.queue(QUEUE).get(id)
        assert msg is not None
        assert msg.state in (State.READY, State.SCHEDULED)
        assert msg.attempts == 0
        assert dispatcher.counts["released"] == 1
        release.set()
        await state.queue(QUEUE).purge()
        await state.close()
        await receiver.stop()

    asyncio.run(scenario())


def test_a_dispatcher_starts_once() -> None:
    async def scenario() -> None:
        state = ServerState(serve_config(next(memory_url(Path(".")))))
        dispatcher = Dispatcher(state)
        await dispatcher.stop()  # before start: nothing to do
        await dispatcher.start()
        with pytest.raises(RuntimeError, match="already"):
            await dispatcher.start()
        await dispatcher.stop()
        await dispatcher.stop()
        await state.close()

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="grace"):
        Dispatcher(ServerState(serve_config("memory://x")), grace=-1)


# -- names judged loopback, and zones --------------------------------------------------------

PUBLIC_ADDRESS = "93.184.216.34"  # what a hostile resolver answers for a .localhost name


@pytest.mark.timeout(30)
def test_a_localhost_name_goes_to_loopback_never_to_the_resolver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --allow-loopback-callbacks, ``evil.localhost`` passes as loopback; the
    system resolver (a stub here) says it is a public address. The dispatcher must
    not ask it: the request goes to the loopback receiver, Host as in the URL."""
    real_getaddrinfo = socket.getaddrinfo
    asked: list[str] = []

    def stub_resolver(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name.endswith("localhost"):
            asked.append(name)
            return real_getaddrinfo(PUBLIC_ADDRESS, *args, **kwargs)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stub_resolver)

    async def body(state: ServerState, dispatcher: Dispatcher, receiver: Receiver) -> None:
        ids = [
            await put(state, Callback(f"http://evil.localhost:{receiver.port}/hook", timeout=2)),
            await put(state, Callback(f"http://localhost:{receiver.port}/hook", timeout=2)),
        ]
        await wait_until(lambda: all(receiver.per_id[id] == 1 for id in ids))
        hosts = sorted(arrival.headers["host"] for arrival in receiver.arrivals)
        assert hosts == [f"evil.localhost:{receiver.port}", f"localhost:{receiver.port}"]
        assert asked == []

    run_memory(body)


@pytest.mark.timeout(30)
def test_the_guard_connects_a_localhost_name_to_loopback_whatever_the_resolver_says() -> None:
    async def scenario() -> None:
        receiver = Receiver()
        await receiver.start()
        try:
            resolver = FixedResolver(PUBLIC_ADDRESS)
            config = serve_config("memory://guard")
            network = _GuardedNetwork(config, resolver)
            for name in ("evil.localhost", "a.b.LOCALHOST.", "localhost"):
                stream = await network.connect_tcp(name, receiver.port, timeout=5.0)
                try:
                    assert stream.get_extra_info("server_addr") == ("127.0.0.1", receiver.port)
                finally:
                    await stream.aclose()
            assert resolver.asked == []
            # Without the flag, such a name is refused before anything else.
            closed = serve_config("memory://guard", allow_loopback_callbacks=False)
            reason = await guarded_attempt(closed, "evil.localhost", receiver.port, resolver)
            assert "--allow-loopback-callbacks" in (reason or "")
            assert resolver.asked == []
        finally:
            await receiver.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "host",
    [
        f"{PUBLIC_ADDRESS}%.attacker.example",
        f"{PUBLIC_ADDRESS}%eth0",
        "2606:2800:220:1::%.attacker.example",
        "2606:2800:220:1::%eth0",  # a zone means something on link-local only
    ],
)
@pytest.mark.timeout(30)
def test_a_zone_makes_no_listed_ip_of_a_name(host: str) -> None:
    """An IP literal followed by ``%zone`` is a name (which the system resolver would
    look up), not the listed IP: refused by the allowlist, never resolved."""
    resolver = FixedResolver(PUBLIC_ADDRESS)
    listed = (PUBLIC_ADDRESS, "[2606:2800:220:1::]")
    config = serve_config("memory://guard", callback_hosts=listed)
    reason = asyncio.run(guarded_attempt(config, host, 80, resolver))
    assert reason is not None
    assert "allowlist" in reason
    assert resolver.asked == []


@pytest.mark.timeout(30)
def test_a_localhost_name_reaches_a_receiver_on_ipv6_loopback_only() -> None:
    """127.0.0.1 is tried first, then ::1: a receiver listening on ::1 alone is
    reached too (no resolver asked)."""

    async def scenario() -> None:
        # Its port held on 127.0.0.1 too, bound and not listening, so that a server of
        # another test there cannot take the connection meant for ::1 (a refusal).
        v4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        for _ in range(20):
            receiver = Receiver(host="::1")
            try:
                await receiver.start()
            except OSError:
                v4.close()
                pytest.skip("no IPv6 loopback here")
            try:
                v4.bind(("127.0.0.1", receiver.port))
                break
            except OSError:
                await receiver.stop()
        else:
            raise AssertionError("no port free on both loopbacks in 20 tries")
        try:
            resolver = FixedResolver(PUBLIC_ADDRESS)
            network = _GuardedNetwork(serve_config("memory://guard"), resolver)
            stream = await network.connect_tcp("app.localhost", receiver.port, timeout=5.0)
            try:
                assert stream.get_extra_info("server_addr")[:2] == ("::1", receiver.port)
            finally:
                await stream.aclose()
            assert resolver.asked == []
        finally:
            await receiver.stop()
            v4.close()

    asyncio.run(scenario())
