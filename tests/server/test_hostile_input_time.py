"""What an unauthenticated client sends costs the server time in proportion to its
size, on a real ``delayq serve``: each hostile request is timed against a plain
request of the same size in the same run, and a plain ``/healthz`` sent while hostile
requests are in flight must not wait for them."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from delayq.server._auth import SESSION_HEADER

from ._helpers import session_of
from .test_serve_hardening import TOKEN, Server, serving

# Far over what the rest of the stack costs on a loaded machine: a quadratic parser
# makes the hostile request a thousand times slower than the plain one.
RATIO = 20
# CVE-2024-7592: 30,000 backslashes cost the stdlib's cookie parser 1.7 s.
HOSTILE_COOKIE = 'x="' + "\\" * 30_000 + '"'
PLAIN_COOKIE = "x=" + "a" * 30_002


def fastest(hostile: Callable[[], object], plain: Callable[[], object]) -> tuple[float, float]:
    """The shortest of five runs of each call, in seconds, the two taking turns: a
    moment when the loaded machine starves the server weighs on both alike (three runs
    of one and then of the other once met a 0.75 s stall during the first three)."""
    best = [float("inf"), float("inf")]
    for _ in range(5):
        for at, call in enumerate((hostile, plain)):
            began = time.perf_counter()
            call()
            best[at] = min(best[at], time.perf_counter() - began)
    return best[0], best[1]


def assert_no_slower(
    http: httpx.Client, method: str, path: str, hostile: dict[str, str], plain: dict[str, str]
) -> None:
    """The request with headers ``hostile`` takes at most RATIO times as long as with
    ``plain``, and gets the same status."""
    statuses: dict[str, int] = {}

    def send(name: str, headers: dict[str, str]) -> Callable[[], object]:
        def call() -> None:
            statuses[name] = http.request(method, path, headers=headers).status_code

        return call

    hostile_time, plain_time = fastest(send("hostile", hostile), send("plain", plain))
    assert statuses["hostile"] == statuses["plain"], (path, statuses)
    assert hostile_time < RATIO * plain_time, (path, hostile_time, plain_time)


def healthz_wait(server: Server, cookie: str) -> float:
    """How long a plain ``/healthz`` takes while four requests with ``cookie`` are in
    flight (sent on raw connections just before it)."""
    request = (
        f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nCookie: {cookie}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    sockets: list[socket.socket] = []
    try:
        for _ in range(4):
            sock = server.connect()
            sockets.append(sock)
            sock.sendall(request)
        with httpx.Client(base_url=server.base, timeout=60) as http:
            began = time.perf_counter()
            assert http.get("/healthz").status_code == 200
            waited = time.perf_counter() - began
        for sock in sockets:
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
        return waited
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``delayq serve`` without a token (``make run``'s)."""
    with serving(tmp_path_factory.mktemp("open")) as server:
        yield server


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``delayq serve`` with a token."""
    tmp_path = tmp_path_factory.mktemp("locked")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with serving(tmp_path, "--token-file", str(token_file)) as server:
        yield server


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("open", "/healthz"),
        ("open", "/v1/queues"),
        ("open", "/"),
        ("open", "/login"),
        ("locked", "/healthz"),
        ("locked", "/login"),
        ("locked", "/v1/queues"),
    ],
)
def test_a_hostile_cookie_costs_no_more_than_a_plain_one(
    kind: str, path: str, request: pytest.FixtureRequest
) -> None:
    server: Server = request.getfixturevalue(f"{kind}_server")
    with httpx.Client(base_url=server.base, timeout=60) as http:
        assert_no_slower(http, "GET", path, {"Cookie": HOSTILE_COOKIE}, {"Cookie": PLAIN_COOKIE})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_session_behind_a_hostile_cookie_costs_no_more(locked_server: Server) -> None:
    with httpx.Client(base_url=locked_server.base, timeout=60) as http:
        login = http.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert login.status_code == 200
        session = {SESSION_HEADER: session_of(login.text)}
        hostile = {"Cookie": HOSTILE_COOKIE, **session}
        assert http.get("/v1/queues", headers=hostile).status_code == 200
        assert_no_slower(http, "GET", "/v1/queues", hostile, {"Cookie": PLAIN_COOKIE, **session})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_healthz_does_not_wait_for_hostile_cookies(open_server: Server) -> None:
    waits: dict[str, list[float]] = {HOSTILE_COOKIE: [], PLAIN_COOKIE: []}
    for _ in range(3):  # taking turns, as fastest() does
        for cookie, seen in waits.items():
            seen.append(healthz_wait(open_server, cookie))
    hostile_wait, plain_wait = min(waits[HOSTILE_COOKIE]), min(waits[PLAIN_COOKIE])
    assert hostile_wait < RATIO * plain_wait, (hostile_wait, plain_wait)


# What else an unauthenticated client can make the server parse, each against a plain
# request of the same size: none of these is super-linear today; they guard against a
# release of the framework that would make one so.
N = 30_000
M = "/v1/queues/q/messages"
# id: (method, path, header, hostile part, plain part): the part goes in the path's {}
# or, when a header is named, in that header.
PARSED = {
    "query-many-fields": ("GET", M + "?{}", "", "a=1&" * (N // 4), "a=" + "1" * N),
    "query-escapes": ("GET", "/queues/q?state={}", "", "%41" * (N // 3), "A" * N),
    "message-id-slashes": ("POST", M + "/{}/ack", "", "a/" * (N // 2) + "x", "a" * N),
    "content-type-parameters": (
        "POST",
        M + "/batch",
        "Content-Type",
        'application/json; a="' + ";" * N,
        "application/json; a=" + "b" * N,
    ),
    "host-labels": ("GET", "/healthz", "Host", "a." * (N // 2) + "-", "a" * N + "!"),
    "accept": ("GET", "/", "Accept", "text/html," * (N // 10), "text/html," + "a" * N),
}


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("method", "path", "header", "hostile", "plain"), list(PARSED.values()), ids=list(PARSED)
)
def test_what_the_server_parses_costs_no_more_than_a_plain_request(
    open_server: Server, method: str, path: str, header: str, hostile: str, plain: str
) -> None:
    body = b'{"messages": [{"payload": 1}]}' if method == "POST" else b""

    def send(part: str) -> Callable[[], object]:
        headers = {"Content-Type": "application/json"}
        if header:
            headers[header] = part
        url = path.format(part) if not header else path
        return lambda: http.request(method, url, headers=headers, content=body)

    with httpx.Client(base_url=open_server.base, timeout=60) as http:
        hostile_time, plain_time = fastest(send(hostile), send(plain))
    assert hostile_time < RATIO * plain_time, (hostile_time, plain_time)
