"""The dashboard's server side: pages rendered from the backend (no JavaScript), hostile
ids and payloads escaped, 404 pages, and the login form in front of a token.

Each test runs the real app (``create_app``) in-process over a SQLite file in
``tmp_path``, seeded through the Python ``Queue`` on the same file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from html import unescape as html_unescape
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from fastapi import APIRouter
from markupsafe import escape as html_escape

from backends._redis_server import RedisProcess
from conformance._helpers import stored_request
from delayq import Queue
from delayq.server import ServeConfig, create_app
from delayq.server._auth import SESSION_HEADER
from delayq.server._constants import CALLBACK_HEADER
from delayq.server._dashboard import (
    PREVIEW_CHARS,
    PageRoute,
    chart_bars,
    format_duration,
    format_relative,
    format_utc,
    format_when,
    message_href,
    payload_preview,
    reachable_by_api,
    safe_next,
)

from ._helpers import session_of

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


def test_an_empty_queue_has_its_page(url: str, config: ServeConfig) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        for name in ("nowhere", "tenant a", "..x", "ünï"):
            response = await client.get(f"/queues/{quote(name, safe='')}")
            assert response.status_code == 200, name
            page = response.text
            assert re.findall(r'data-stat="(?:scheduled|ready|active|dead)">(\d+)<', page) == [
                "0",
                "0",
                "0",
                "0",
            ]
            assert re.search(r'<p class="card muted" id="queue-empty">', page), name
            assert "Nothing waiting." in page
            assert "Nothing in flight." in page
            assert "No dead letters." in page

    visit(config, scenario)


def test_a_name_the_server_cannot_serve_is_a_404_page_saying_why(config: ServeConfig) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        # A name no backend can hold (a put refuses more, e.g. '{', but a queue stored
        # under such a name by an older version still has its page).
        long = "q" * 256
        paths = {
            f"/queues/{long}": "must be 1 to 255 characters",
            "/queues/a%00b": "must not contain control characters",
            f"/queues/{long}/messages/x": "must be 1 to 255 characters",
        }
        for path, reason in paths.items():
            response = await client.get(path)
            assert response.status_code == 404, path
            assert response.headers["content-type"].startswith("text/html")
            assert "Not a queue name" in response.text
            assert reason in response.text

    visit(config, scenario)


def test_unknown_messages_are_404(url: str, config: ServeConfig) -> None:
    with Queue(url, name="orders") as q:
        q.put({}, delay="10m", id="kept")
        q.put({}, delay="10m", id="gone")
        assert q.cancel("gone")

    async def scenario(client: httpx.AsyncClient) -> None:
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

        # The page asked for is kept as sent, query included: the login page's script
        # fetches it with the session.
        for asked in ("/find?queue=orders&id=a%2Fb", "/queues/a%3Fb/messages/x%2Fy"):
            sent = await client.get(asked, headers={"accept": "text/html"})
            assert sent.status_code == 303
            assert httpx.URL(sent.headers["location"]).params["next"] == asked

        form = await client.get("/login", params={"next": "/queues/orders"})
        assert form.status_code == 200
        assert 'name="next" value="/queues/orders"' in form.text
        assert 'data-next="/queues/orders"' in form.text

        wrong = await client.post("/login", data={"token": "not-the-token", "next": "/"})
        assert wrong.status_code == 401
        assert "Wrong token" in wrong.text
        assert "data-session" not in wrong.text

        right = await client.post("/login", data={"token": TOKEN, "next": "/queues/orders"})
        # The session is handed to the page's script, never set as a cookie.
        assert right.status_code == 200
        assert "set-cookie" not in right.headers
        assert not client.cookies
        assert right.headers["cache-control"] == "no-store"
        assert 'data-next="/queues/orders"' in right.text
        session = {SESSION_HEADER: session_of(right.text)}
        assert TOKEN not in right.text
        for page in (form, right):  # the same policy: no inline script
            policy = page.headers["content-security-policy"]
            assert "script-src 'self';" in policy
            assert "<script>" not in page.text

        # A navigation carries no session: the page still sends the browser to login.
        assert (await client.get("/", headers={"accept": "text/html"})).status_code == 303
        assert (await client.get("/", headers=session)).status_code == 200
        assert (await client.get("/v1/queues", headers=session)).status_code == 200
        # The login form with the session (as the login page's script asks) goes on.
        on = await client.get("/login", params={"next": "/queues/orders"}, headers=session)
        assert on.status_code == 303
        assert on.headers["location"] == "/queues/orders"

        out = await client.post("/logout", headers=session)
        assert out.status_code == 303
        assert out.headers["location"] == "/login"
        assert (await client.get("/", headers=session)).status_code == 401
        assert (await client.get("/v1/queues", headers=session)).status_code == 401

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
        assert response.status_code == 200
        # Where the page's script goes on to, and where the login form sends a
        # signed-in browser.
        found = re.search(r'data-next="([^"]*)"', response.text)
        assert found is not None
        session = {SESSION_HEADER: session_of(response.text)}
        again = await client.get("/login", params={"next": target}, headers=session)
        assert again.status_code == 303
        for location in (html_unescape(found.group(1)), again.headers["location"]):
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
    for name in ("base.html", "overview.html", "queue.html", "message.html", "login.html",
                 "error.html", "missing.html", "signed_in.html"):  # fmt: skip
        assert (package / "templates" / name).is_file(), name
    for name in ("dashboard.js", "dashboard.css", "favicon.svg"):
        assert (package / "static" / name).is_file(), name


# -- what a first-time user looks for (issue 15) ----------------------------------------

#: Ids a user may pick that are awkward in a URL; the first ones every face takes.
ODD_IDS = ["a b", "quote'\"q", "héllo✓", "..x", "x..", "a%2Fb", "#x?y", "a/b", "/lead", ".", ".."]


def put_odd_ids(q: Queue, ids: list[str]) -> list[str]:
    """Put each id that this face accepts (another face may refuse some: the
    validators are being unified); the ids stored."""
    stored = []
    for message_id in ids:
        try:
            q.put({"id": message_id}, delay="10m", id=message_id)
        except ValueError:
            continue
        stored.append(message_id)
    return stored


def test_messages_in_flight_are_listed_with_their_lease_end_never_the_token(
    url: str, config: ServeConfig
) -> None:
    with Queue(url, name="jobs") as q:
        q.put({"n": 1}, id="busy")
        q.put({"n": 2}, delay="10m", id="later")
        (msg,) = q.reserve(wait=0, lease=120)
        assert msg.lease is not None
        token = msg.lease

    async def scenario(client: httpx.AsyncClient) -> None:
        page = (await client.get("/queues/jobs")).text
        assert 'data-stat="active">1<' in page
        active = page.split('id="active-rows"')[1].split("</tbody>")[0]
        assert re.findall(r'<tr data-id="([^"]+)">', active) == ["busy"]
        assert "1 / " in active
        assert re.search(r'<time datetime="[^"]+" title="[^"]+ UTC" data-due="\d+">in 1m', active)
        waiting = page.split('id="waiting-rows"')[1].split("</tbody>")[0]
        assert re.findall(r'<tr data-id="([^"]+)">', waiting) == ["later"]
        message = (await client.get("/queues/jobs/messages/busy")).text
        assert 'id="lease-ends"' in message
        for text in (page, message):
            assert token not in text

    visit(config, scenario)


def test_far_away_times_are_dates_in_utc(url: str, config: ServeConfig) -> None:
    with Queue(url, name="later") as q:
        q.put({}, delay=1000 * 86400, id="far")
        q.put({}, delay="10m", id="near")

    async def scenario(client: httpx.AsyncClient) -> None:
        page = (await client.get("/queues/later")).text
        rows = dict(re.findall(r'<tr data-id="([^"]+)">(.*?)</tr>', page, re.S))
        assert re.search(r">\d{4}-\d\d-\d\d \d\d:\d\d UTC</time>", rows["far"])
        assert "1000d" not in page
        assert ">in 9m" in rows["near"]
        assert re.search(r'title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"', rows["near"])
        message = (await client.get("/queues/later/messages/far")).text
        assert re.search(r"\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", message)

    visit(config, scenario)


def test_format_utc_and_format_when() -> None:
    moment = 1_796_137_361_377  # 2026-12-01T15:02:41.377Z
    assert format_utc(moment) == "2026-12-01 15:02:41 UTC"
    assert format_utc(moment, seconds=False) == "2026-12-01 15:02 UTC"
    assert format_when(moment, moment - 252_000) == "in 4m 12s"
    assert format_when(moment, moment - 2 * 86400_000) == "in 2d"
    assert format_when(moment, moment - 4 * 86400_000) == "2026-12-01 15:02 UTC"
    assert format_when(moment, moment + 4 * 86400_000) == "2026-12-01 15:02 UTC"


def test_the_waiting_list_previews_payloads_short_and_escaped(
    url: str, config: ServeConfig
) -> None:
    with Queue(url, name="mail") as q:
        q.put({"to": "<b>x</b>", "body": "y" * 500}, delay="10m", id="long")
        q.put(b"\x00\x01\x02\x03\x04", delay="11m", id="bytes")
        q.put([1, "two"], delay="12m", id="short")

    async def scenario(client: httpx.AsyncClient) -> None:
        page = (await client.get("/queues/mail")).text
        previews = re.findall(r'<td class="preview">([^<]*)</td>', page)
        assert len(previews) == 3
        long, raw, short = previews
        assert long.startswith("{&#34;to&#34;:&#34;&lt;b&gt;x&lt;/b&gt;&#34;,&#34;body&#34;:")
        assert long.endswith("…")
        assert len(html_unescape(long)) == PREVIEW_CHARS
        assert raw == "(5 bytes)"
        assert html_unescape(short) == '[1,"two"]'
        assert "<b>x</b>" not in page

    visit(config, scenario)


def test_payload_preview_matches_each_kind() -> None:
    assert payload_preview({"payload": {"a": 1}}) == '{"a":1}'
    assert payload_preview({"payload": None, "payload_base64": "AAE="}) == "(2 bytes)"
    assert payload_preview({"payload": None, "payload_error": "x"}) == "(cannot be shown)"
    assert payload_preview({"payload": "é" * 200}) == '"' + "é" * (PREVIEW_CHARS - 2) + "…"


def test_the_search_box_starts_empty_and_pages_have_a_favicon(
    url: str, config: ServeConfig
) -> None:
    with Queue(url, name="orders") as q:
        q.put({}, delay="10m", id="o-1")

    async def scenario(client: httpx.AsyncClient) -> None:
        page = (await client.get("/")).text
        field = re.search(r'<input id="find-queue"[^>]*>', page)
        assert field is not None
        assert "value=" not in field.group(0)
        assert '<link rel="icon" href="/static/favicon.svg"' in page
        icon = await client.get("/static/favicon.svg")
        assert icon.status_code == 200
        assert icon.headers["content-type"].startswith("image/svg+xml")
        assert icon.text.startswith("<svg")

    visit(config, scenario)


def test_odd_ids_have_working_pages_and_links(url: str, config: ServeConfig) -> None:
    with Queue(url, name="odd") as q:
        stored = put_odd_ids(q, ODD_IDS)
    assert {"a b", "quote'\"q", "héllo✓", "..x"} <= set(stored)

    async def scenario(client: httpx.AsyncClient) -> None:
        page = (await client.get("/queues/odd")).text
        waiting = page.split('id="waiting-rows"')[1].split("</tbody>")[0]
        links = re.findall(r'<td class="id"><a href="([^"]+)">', waiting)
        assert len(links) == len(stored)
        for message_id in stored:
            href = message_href("", "odd", message_id)
            assert f'href="{html_escape(href)}"' in waiting, message_id
            response = await client.get(href)
            assert response.status_code == 200, (message_id, href)
            assert f'data-id="{html_escape(message_id)}"' in response.text, message_id
            buttons = 'data-action="cancel"' in response.text
            assert buttons == reachable_by_api(message_id), message_id
            if reachable_by_api(message_id):
                # The button's API route takes the same encoding.
                api = await client.get(f"/v1/queues/odd/messages/{quote(message_id, safe='')}")
                assert api.status_code == 200, message_id
                assert api.json()["id"] == message_id

    visit(config, scenario)


def test_message_href_keeps_ids_a_path_cannot_carry_in_the_query() -> None:
    assert message_href("/b", "q x", "a/b c") == "/b/queues/q%20x/messages/a%2Fb%20c"
    assert message_href("", "q", "..") == "/queues/q/message?id=.."
    assert message_href("", "q", ".") == "/queues/q/message?id=."
    assert reachable_by_api("a/b")  # the API's id routes take slashes
    assert not reachable_by_api("..")
    assert reachable_by_api("..x")


def test_the_overview_names_stored_queues_it_cannot_serve(url: str, config: ServeConfig) -> None:
    with Queue(url) as root:  # a put refuses the name now: stored as an older version did
        root.backend.put("tenant/a", [stored_request("t-1", delay_ms=600_000)])
    with Queue(url, name="fine") as q:
        q.put({}, delay="10m", id="f-1")

    async def scenario(client: httpx.AsyncClient) -> None:
        response = await client.get("/")
        assert response.status_code == 200
        assert '<tr data-queue="fine">' in response.text
        assert 'data-queue="tenant/a"' not in response.text
        assert "<code>tenant/a</code>" in response.text

    visit(config, scenario)


# -- server errors as pages ------------------------------------------------------------


def test_a_page_that_fails_is_an_html_500_page(
    config: ServeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(config)
    failing = APIRouter(route_class=PageRoute)

    @failing.get("/queues/{queue}/explode")
    async def explode(queue: str) -> None:
        raise RuntimeError(f"a bug showing {queue}")

    app.include_router(failing)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                response = await c.get("/queues/orders/explode")
                assert response.status_code == 500
                assert response.headers["content-type"].startswith("text/html")
                assert "<h1>Server error</h1>" in response.text
                assert "a bug showing" not in response.text
                assert "script-src 'self'" in response.headers["content-security-policy"]
                # The API keeps its JSON errors.
                api = await c.get("/v1/queues/" + "q" * 256 + "/stats")
                assert api.status_code == 422
                assert api.json()["error"]["code"] == "invalid_queue"

    with caplog.at_level(logging.ERROR, logger="delayq"):
        asyncio.run(main())
    assert any(
        "dashboard.failed" in record.getMessage() and record.exc_info for record in caplog.records
    )


@pytest.mark.slow
def test_a_backend_that_stops_answering_is_an_html_503_page(tmp_path: Path) -> None:
    redis_server = RedisProcess(tmp_path)
    redis_server.start()
    try:
        config = ServeConfig(url=f"{redis_server.url}?prefix=dash-outage", dispatch=False)

        async def scenario(client: httpx.AsyncClient) -> None:
            put = await client.post("/v1/queues/orders/messages", json={"payload": 1})
            assert put.status_code == 201, put.text
            assert (await client.get("/queues/orders")).status_code == 200
            redis_server.kill()
            for path in ("/", "/queues/orders", "/queues/orders/messages/x"):
                page = await client.get(path)
                assert page.status_code == 503, path
                assert page.headers["content-type"].startswith("text/html")
                assert "<h1>Backend unavailable</h1>" in page.text
                assert page.headers["retry-after"]
            api = await client.get("/v1/queues/orders/stats")
            assert api.status_code == 503
            assert api.json()["error"]["code"] == "backend_unavailable"

        visit(config, scenario)
    finally:
        redis_server.stop()
