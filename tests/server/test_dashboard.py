"""The dashboard's server side: pages rendered from the backend (no JavaScript), hostile
ids and payloads escaped, 404 pages, and the login form in front of a token.

Each test runs the real app (``create_app``) in-process over a SQLite file in
``tmp_path``, seeded through the Python ``Queue`` on the same file.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from conformance._helpers import stored_request
from delayq import Queue
from delayq._constants import CALLBACK_HEADER
from delayq.server import ServeConfig, create_app
from delayq.server._config import SESSION_COOKIE
from delayq.server._dashboard import (
    chart_bars,
    format_duration,
    format_relative,
    safe_next,
)

TOKEN = "dashboard-test-token"
HOSTILE = "\"'><script>alert(1)</script>"

Scenario = Callable[[httpx.AsyncClient], Awaitable[None]]


@asynccontextmanager
async def client_of(config: ServeConfig) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the app in-process, its lifespan running."""
    app = create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


def visit(config: ServeConfig, scenario: Scenario) -> None:
    """Run ``scenario`` against a fresh app for ``config``."""

    async def main() -> None:
        async with client_of(config) as client:
            await scenario(client)

    asyncio.run(main())


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite queue file of this test."""
    return f"sqlite:///{tmp_path / 'dash.db'}"


@pytest.fixture
def config(url: str) -> ServeConfig:
    """A server without a token and without the callback dispatcher."""
    return ServeConfig(url=url, dispatch=False)


def make_dead(url: str, queue: str, message_id: str, error: str) -> None:
    """Put ``message_id`` with one attempt and fail it: a dead letter with ``error``."""
    with Queue(url, name=queue) as q:
        q.put({"n": 1}, id=message_id, max_attempts=1)
        (msg,) = q.reserve(wait=0)
        q.nack(msg, error=error)


# -- pages -----------------------------------------------------------------------------


def test_overview_lists_every_queue_with_its_counts(url: str, config: ServeConfig) -> None:
    with Queue(url, name="orders") as q:
        q.put({"order": 1}, delay="10m", id="o-1")
        q.put({"order": 2}, id="o-2")
    with Queue(url, name="reminders") as q:
        q.put({"remind": 1}, delay="10m", id="r-1")
    make_dead(url, "mail jobs", "m-1", "smtp down")

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        page = response.text
        orders = re.search(r'<tr data-queue="orders">(.*?)</tr>', page, re.S)
        assert orders is not None
        numbers = re.findall(r'<td class="num[^"]*">([^<]*)</td>', orders.group(1))
        assert numbers[:4] == ["1", "1", "0", "0"]  # scheduled, ready, active, dead
        assert 'href="/queues/mail%20jobs"' in page
        assert "data-due=" in orders.group(1)
        reminders = re.search(r'<tr data-queue="reminders">(.*?)</tr>', page, re.S)
        assert reminders is not None
        assert "in 9m" in reminders.group(1)  # next due, relative
        assert 'action="/find"' in page

    visit(config, scenario)


def test_queue_page_lists_waiting_messages_dead_letters_and_the_chart(
    url: str, config: ServeConfig
) -> None:
    with Queue(url, name="orders") as q:
        q.put({"n": 1}, delay="20m", id="later")
        q.put({"n": 2}, delay="5m", id="sooner")
        q.put({"n": 3}, delay="2h", id="much-later")
    make_dead(url, "orders", "broken", "handler raised KeyError")

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/queues/orders")
        assert response.status_code == 200
        page = response.text
        waiting = page.split('id="waiting-rows"')[1].split("</tbody>")[0]
        assert re.findall(r'<tr data-id="([^"]+)">', waiting) == ["sooner", "later", "much-later"]
        dead = page.split('id="dead-rows"')[1].split("</tbody>")[0]
        assert 'data-id="broken"' in dead
        assert "handler raised KeyError" in dead
        assert "1 / 1" in dead
        chart = page.split('id="due-chart"')[1].split("</svg>")[0]
        assert chart.count("<rect") == 60
        assert "2 messages fall due over the next hour" in chart
        assert 'data-action="cancel" data-id="sooner"' in waiting
        assert 'data-action="retry" data-id="broken"' in dead

    visit(config, scenario)


def test_message_page_shows_state_attempts_error_headers_callback_and_payload(
    url: str, config: ServeConfig
) -> None:
    callback = {"url": "https://hooks.example.com/due", "method": "POST"}
    with Queue(url, name="orders") as q:
        q.put(
            {"order": 7, "items": ["a", "b"]},
            delay="10m",
            id="o-7",
            headers={"trace": "abc-123", CALLBACK_HEADER: json.dumps(callback)},
        )
        q.put(b"\x00\x01raw", delay="10m", id="raw")
    make_dead(url, "orders", "dead-1", "boom")

    async def scenario(client: httpx.AsyncClient) -> None:
        page = (await client.get("/queues/orders/messages/o-7")).text
        assert 'id="message-state">scheduled<' in page
        assert "0 / " in page
        assert "trace" in page
        assert "abc-123" in page
        assert "POST https://hooks.example.com/due" in page
        assert "&#34;items&#34;: [\n    &#34;a&#34;," in page  # indented JSON, escaped
        assert 'data-action="reschedule"' in page

        raw = (await client.get("/queues/orders/messages/raw")).text
        assert "AAFyYXc=" in raw  # base64 of the bytes payload
        assert "bytes, base64" in raw

        dead = (await client.get("/queues/orders/messages/dead-1")).text
        assert 'id="message-state">dead<' in dead
        assert "1 / 1" in dead
        assert "boom" in dead
        assert 'data-action="retry"' in dead
        assert 'data-action="reschedule"' not in dead

    visit(config, scenario)


def _stored_as_before(
    q: Queue, payload: object, message_id: str, headers: dict[str, str] | None = None
) -> None:
    """Store a message, due in an hour, as delayq did before one rule held for ids: by
    the backend, which takes any id (a put checks the rule first)."""
    request = stored_request(
        message_id, json.dumps(payload).encode(), headers=headers, delay_ms=3_600_000
    )
    q.backend.put(q.name, [request])


def test_hostile_names_ids_and_payloads_are_escaped(url: str, config: ServeConfig) -> None:
    queue = "<img src=x onerror=alert(1)>"
    with Queue(url, name=queue) as q:
        # HOSTILE holds a '/': a put refuses it now, an older version stored it.
        _stored_as_before(
            q,
            {"html": "</pre><script>alert(2)</script>"},
            HOSTILE,
            headers={"x-evil": "<b>bold</b>"},
        )

    async def scenario(client: httpx.AsyncClient) -> None:
        pages = [(await client.get("/")).text, (await client.get(f"/queues/{quote(queue)}")).text]
        response = await client.get(f"/queues/{quote(queue)}/messages/{quote(HOSTILE, safe='')}")
        assert response.status_code == 200
        pages.append(response.text)
        for page in pages:
            assert "<script>alert" not in page
            assert "<img src=x" not in page
            assert "<b>bold</b>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[2]
        assert "&lt;/pre&gt;&lt;script&gt;alert(2)" in pages[2]
        assert "&lt;img src=x onerror=alert(1)&gt;" in pages[0]

    visit(config, scenario)


def test_ids_with_a_slash_stored_before_have_a_page(url: str, config: ServeConfig) -> None:
    with Queue(url, name="cron") as q:
        _stored_as_before(q, {}, "reports/daily")  # a put refuses a '/' in an id now

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/queues/cron/messages/reports%2Fdaily")
        assert response.status_code == 200
        assert 'data-id="reports/daily"' in response.text
        queue_page = (await client.get("/queues/cron")).text
        assert 'href="/queues/cron/messages/reports%2Fdaily"' in queue_page

    visit(config, scenario)


def test_unknown_queue_and_message_pages_are_404(url: str, config: ServeConfig) -> None:
    with Queue(url, name="orders") as q:
        q.put({}, delay="10m", id="kept")
        q.put({}, delay="10m", id="gone")
        assert q.cancel("gone")

    async def scenario(client: httpx.AsyncClient) -> None:
        for path in ("/queues/nowhere", "/queues/bad%7Bname%7D"):
            response = await client.get(path)
            assert response.status_code == 404, path
            assert "Queue not found" in response.text
        for path in ("/queues/orders/messages/gone", "/queues/nowhere/messages/kept"):
            response = await client.get(path)
            assert response.status_code == 404, path
            assert "acked, cancelled or never existed" in response.text
        assert (await client.get("/queues/orders/messages/kept")).status_code == 200

    visit(config, scenario)


def test_find_goes_to_the_message_page(config: ServeConfig) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/find", params={"queue": "orders", "id": " a b/c "})
        assert response.status_code == 303
        assert response.headers["location"] == "/queues/orders/messages/a%20b%2Fc"
        blank = await client.get("/find", params={"queue": "orders", "id": ""})
        assert blank.headers["location"] == "/"

    visit(config, scenario)


def test_pages_forbid_inline_scripts_and_framing(config: ServeConfig) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/")
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "<script>" not in response.text  # only <script src=...>

    visit(config, scenario)


def test_static_files_are_served(config: ServeConfig) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        script = await client.get("/static/dashboard.js")
        assert script.status_code == 200
        assert "javascript" in script.headers["content-type"]
        assert "X-Requested-With" in script.text
        style = await client.get("/static/dashboard.css")
        assert style.status_code == 200
        assert style.headers["content-type"].startswith("text/css")

    visit(config, scenario)


# -- login -----------------------------------------------------------------------------


def test_without_a_token_login_goes_home(config: ServeConfig) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/login")
        assert response.status_code == 303
        assert response.headers["location"] == "/"

    visit(config, scenario)


def test_with_a_token_pages_need_the_login(url: str) -> None:
    config = ServeConfig(url=url, token=TOKEN, dispatch=False)

    async def scenario(client: httpx.AsyncClient) -> None:
        page = await client.get("/queues/orders", headers={"accept": "text/html"})
        assert page.status_code == 303
        location = httpx.URL(page.headers["location"])
        assert location.path == "/login"
        assert location.params["next"] == "/queues/orders"

        form = await client.get("/login", params={"next": "/queues/orders"})
        assert form.status_code == 200
        assert 'name="next" value="/queues/orders"' in form.text

        wrong = await client.post("/login", data={"token": "not-the-token", "next": "/"})
        assert wrong.status_code == 401
        assert "Wrong token" in wrong.text
        assert SESSION_COOKIE not in client.cookies

        right = await client.post("/login", data={"token": TOKEN, "next": "/queues/orders"})
        assert right.status_code == 303
        assert right.headers["location"] == "/queues/orders"
        cookie = right.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=")
        assert "Max-Age=" in cookie
        assert "HttpOnly" in cookie
        assert "SameSite=strict" in cookie
        assert "Path=/" in cookie
        assert TOKEN not in cookie

        assert (await client.get("/")).status_code == 200
        assert (await client.get("/v1/queues")).status_code == 200  # the API takes the cookie

        out = await client.post("/logout")
        assert out.status_code == 303
        assert out.headers["location"] == "/login"
        assert SESSION_COOKIE not in client.cookies
        assert (await client.get("/", headers={"accept": "text/html"})).status_code == 303

    visit(config, scenario)


def test_bearer_token_opens_the_pages_too(url: str) -> None:
    config = ServeConfig(url=url, token=TOKEN, dispatch=False)

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        assert "Sign out" in response.text

    visit(config, scenario)


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/x",
        "/\\evil.example",
        "/%0d%0aSet-Cookie:x",
        "javascript:alert(1)",
        "",
    ],
)
def test_login_never_redirects_off_site(url: str, target: str) -> None:
    config = ServeConfig(url=url, token=TOKEN, dispatch=False)

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.post("/login", data={"token": TOKEN, "next": target})
        assert response.status_code == 303
        location = response.headers["location"]
        assert location == "/" or location == target, location
        assert location.startswith("/")
        assert not location.startswith(("//", "/\\"))

    visit(config, scenario)


# -- formatting ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.35, "350ms"),
        (42.9, "42s"),
        (252, "4m 12s"),
        (3600, "1h"),
        (7500, "2h 5m"),
        (90061, "1d 1h"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_relative() -> None:
    assert format_relative(1_000_000 + 252_000, 1_000_000) == "in 4m 12s"
    assert format_relative(1_000_000 - 3_000, 1_000_000) == "3s ago"
    assert format_relative(1_000_400, 1_000_000) == "now"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/queues/a?x=1", "/queues/a?x=1"),
        ("/", "/"),
        (None, "/"),
        ("queues/a", "/"),
        ("//evil.example", "/"),
        ("/\\evil.example", "/"),
        ("https://evil.example", "/"),
        ("/a\nb", "/"),
    ],
)
def test_safe_next(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected


def test_chart_bars_scale_to_the_busiest_bucket() -> None:
    chart = chart_bars(0, 60_000, [0, 5, 10, 0])
    heights = [bar["height"] for bar in chart["bars"]]
    assert heights[0] == 0
    assert heights[2] > heights[1] > 0
    assert chart["peak"] == 10
    assert chart["total"] == 15
    assert [tick["label"] for tick in chart["ticks"]] == ["now", "+1m", "+2m", "+3m", "+4m"]
    assert all(bar["height"] == 0 for bar in chart_bars(0, 60_000, [0, 0])["bars"])


def test_templates_and_static_files_ship_in_the_package() -> None:
    from importlib.resources import files  # noqa: PLC0415

    package = files("delayq.server")
    for name in ("base.html", "overview.html", "queue.html", "message.html", "login.html"):
        assert (package / "templates" / name).is_file(), name
    for name in ("dashboard.js", "dashboard.css"):
        assert (package / "static" / name).is_file(), name
