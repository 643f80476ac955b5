"""The dashboard in a real browser: Debian's chromium driven by Playwright.

The server is the real app on uvicorn (a background thread, a free port) over a SQLite
file in ``tmp_path``; messages go in through the HTTP API, and the test clicks what a
user clicks. Screenshots are saved in ``tmp_path``. Never ``playwright install``: the
browser is the system's ``/usr/bin/chromium`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest
import uvicorn

from delayq import Queue
from delayq.durable.constants import TICK_HEADER
from delayq.durable.queue import AsyncQueue
from delayq.durable.retry import RetryPolicy
from delayq.runtime import Worker
from delayq.server import ServeConfig, create_app
from delayq.server._auth import SESSION_HEADER, Sessions

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "browser-test-token"
WAIT_MS = 10_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)",
    ),
]

sync_api = pytest.importorskip("playwright.sync_api")


@contextmanager
def serving(config: ServeConfig) -> Iterator[str]:
    """The app for ``config`` on uvicorn in a thread; yields its base URL."""
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="dashboard-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    """One headless chromium for the tests of this module."""
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: sync_api.Browser) -> Iterator[sync_api.Page]:
    """A fresh browser context (no cookies) and page; confirm dialogs are accepted.

    Script errors and Content-Security-Policy violations fail the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(f"script error: {error}"))
    tab.on(
        "console",
        lambda message: (
            problems.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    try:
        yield tab
    finally:
        context.close()
    assert not problems, problems


def put(
    base: str,
    queue: str,
    message_id: str,
    payload: object,
    headers: dict[str, str] | None = None,
    **extra: object,
) -> None:
    """Put one message through the HTTP API."""
    body = {"id": message_id, "payload": payload, **extra}
    response = httpx.post(
        f"{base}/v1/queues/{queue}/messages", json=body, headers=headers, timeout=10
    )
    assert response.status_code == 201, response.text


def test_cancel_a_message_from_the_dashboard(tmp_path: Path, page: sync_api.Page) -> None:
    expect = sync_api.expect
    config = ServeConfig(url=f"sqlite:///{tmp_path / 'browser.db'}", dispatch=False)
    with serving(config) as base:
        page.goto(base + "/")
        expect(page.get_by_role("heading", name="Queues")).to_be_visible()

        put(base, "orders", "order-42", {"order": 42, "note": "<b>not bold</b>"}, delay="10m")
        put(base, "orders", "order-43", {"order": 43}, delay="25m")
        # The overview's auto-refresh brings the new queue in, without a reload.
        row = page.locator('#queue-rows tr[data-queue="orders"]')
        expect(row).to_be_visible()
        expect(row.locator("td").nth(1)).to_have_text("2")
        page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

        row.get_by_role("link", name="orders").click()
        page.wait_for_url(f"{base}/queues/orders")
        waiting = page.locator("#waiting-rows tr[data-id]")
        expect(waiting).to_have_count(2)
        expect(waiting.first).to_have_attribute("data-id", "order-42")
        expect(page.locator("#due-chart rect.bar")).to_have_count(60)
        page.screenshot(path=str(tmp_path / "queue.png"), full_page=True)

        target = page.locator('#waiting-rows tr[data-id="order-42"]')
        target.get_by_role("button", name="Cancel").click()
        expect(target).to_have_count(0)
        expect(page.locator('[data-stat="scheduled"]')).to_have_text("1")
        assert httpx.get(f"{base}/v1/queues/orders/messages/order-42").status_code == 404

        # The other one from its own page: the page then says it is gone.
        page.locator('#waiting-rows a[href$="/order-43"]').click()
        page.wait_for_url(f"{base}/queues/orders/messages/order-43")
        expect(page.locator("#message-state")).to_have_text("scheduled")
        expect(page.locator("#payload")).to_contain_text('"order": 43')
        page.screenshot(path=str(tmp_path / "message.png"), full_page=True)
        page.get_by_role("button", name="Cancel").click()
        expect(page.get_by_role("heading", name="Message not found")).to_be_visible()
        expect(page.get_by_text("acked, cancelled or never existed")).to_be_visible()

        # An error from the API shows in the banner: a delay it cannot read.
        put(base, "orders", "order-44", {"order": 44}, delay="5m")
        page.goto(f"{base}/queues/orders")
        row44 = page.locator('#waiting-rows tr[data-id="order-44"]')
        row44.get_by_label("New delay").fill("soonish")
        row44.get_by_role("button", name="Reschedule").click()
        expect(page.locator("#banner")).to_be_visible()
        expect(page.locator("#banner-text")).to_contain_text("soonish")
        page.screenshot(path=str(tmp_path / "error.png"), full_page=True)

    assert (tmp_path / "queue.png").stat().st_size > 0


def test_retry_a_dead_letter_from_the_dashboard(tmp_path: Path, page: sync_api.Page) -> None:
    expect = sync_api.expect
    config = ServeConfig(url=f"sqlite:///{tmp_path / 'dead.db'}", dispatch=False)
    with serving(config) as base:
        put(base, "mail", "mail-1", {"to": "a@example.com"}, max_attempts=1)
        reserved = httpx.post(f"{base}/v1/queues/mail/reserve", json={"wait": 0}, timeout=10)
        (message,) = reserved.json()["messages"]
        nacked = httpx.post(
            f"{base}/v1/queues/mail/messages/mail-1/nack",
            json={"lease": message["lease"], "error": "smtp: 554 <rejected>"},
            timeout=10,
        )
        assert nacked.json()["state"] == "dead", nacked.text

        page.goto(f"{base}/queues/mail")
        dead = page.locator('#dead-rows tr[data-id="mail-1"]')
        expect(dead).to_contain_text("smtp: 554 <rejected>")
        expect(page.locator('[data-stat="dead"]')).to_have_text("1")
        dead.get_by_role("button", name="Retry").click()
        expect(dead).to_have_count(0)
        expect(page.locator('#waiting-rows tr[data-id="mail-1"]')).to_contain_text("ready")
        assert httpx.get(f"{base}/v1/queues/mail/messages/mail-1").json()["attempts"] == 0


def test_login_then_overview(tmp_path: Path, page: sync_api.Page) -> None:
    expect = sync_api.expect
    config = ServeConfig(url=f"sqlite:///{tmp_path / 'login.db'}", token=TOKEN, dispatch=False)
    with serving(config) as base:
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        put(base, "invoices", "inv-1", {"amount": 10}, delay="1h", headers=bearer)

        page.goto(base + "/")
        page.wait_for_url(f"{base}/login**")
        page.get_by_label("Token").fill("wrong-token-123")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert").filter(has_text="Wrong token")).to_be_visible()

        page.get_by_label("Token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{base}/")
        row = page.locator('#queue-rows tr[data-queue="invoices"]')
        expect(row).to_be_visible()
        # The auto-refresh reaches the API with the session (the script sends it).
        expect(page.locator("#refresh-status")).to_contain_text("updated")
        page.screenshot(path=str(tmp_path / "signed-in.png"), full_page=True)

        # Links, reloads and the buttons work on the session too.
        row.get_by_role("link", name="invoices").click()
        page.wait_for_url(f"{base}/queues/invoices")
        waiting = page.locator('#waiting-rows tr[data-id="inv-1"]')
        expect(waiting).to_be_visible()
        put(base, "invoices", "inv-2", {"amount": 20}, delay="2h", headers=bearer)
        expect(page.locator("#waiting-rows tr[data-id]")).to_have_count(2)  # refreshed
        waiting.get_by_role("button", name="Cancel").click()
        expect(waiting).to_have_count(0)
        gone = httpx.get(f"{base}/v1/queues/invoices/messages/inv-1", headers=bearer)
        assert gone.status_code == 404
        page.reload()
        page.wait_for_url(f"{base}/queues/invoices")
        expect(page.locator('[data-stat="scheduled"]')).to_have_text("1")
        page.goto(f"{base}/find?queue=invoices&id=inv-2")
        page.wait_for_url(f"{base}/queues/invoices/messages/inv-2")
        expect(page.locator("#message-state")).to_have_text("scheduled")
        assert page.context.cookies() == []

        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(f"{base}/login**")
        expect(page.get_by_label("Token")).to_be_visible()


#: Where the dashboard's script keeps the session (this origin's localStorage).
SESSION_KEY = "delayq.session"


def sign_in(page: sync_api.Page, base: str, token: str = TOKEN) -> None:
    """Sign in through the login form, as a user does, and land on the overview."""
    page.goto(base + "/")
    page.wait_for_url(f"{base}/login**")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/")
    sync_api.expect(page.get_by_role("heading", name="Queues")).to_be_visible()


def kept_session(page: sync_api.Page) -> str | None:
    """The session the dashboard's script keeps for the origin of ``page``."""
    session = page.evaluate(f"localStorage.getItem({SESSION_KEY!r})")
    assert session is None or isinstance(session, str)
    return session


@contextmanager
def harvester() -> Iterator[tuple[str, dict[str, dict[str, str]]]]:
    """Another server on another port of 127.0.0.1 (a page any local user can run):
    it records the headers of every request it gets. Yields its base URL and the
    headers by path."""
    seen: dict[str, dict[str, str]] = {}

    class Record(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen[self.path] = dict(self.headers.items())
            body = b"<!doctype html><title>another server</title><h1>Another server</h1>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    listener = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    thread = threading.Thread(target=listener.serve_forever, name="harvester", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.server_address[1]}", seen
    finally:
        listener.shutdown()
        listener.server_close()
        thread.join(timeout=10)


def test_another_port_of_the_host_gets_no_session(tmp_path: Path, page: sync_api.Page) -> None:
    """Issue 33, point 3: a browser sends a host's cookies to every port of it (RFC
    6265 8.5). Signed in on the server's port, the user then opens a page of another
    server on another port of 127.0.0.1: what that server receives, replayed to the
    queue server with every header it likes, reads nothing and changes nothing."""
    config = ServeConfig(url=f"sqlite:///{tmp_path / 'harvest.db'}", token=TOKEN, dispatch=False)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with serving(config) as base, harvester() as (other, seen):
        put(base, "orders", "order-1", {"n": 1}, delay="1h", headers=bearer)
        sign_in(page, base)
        page.goto(other + "/welcome")
        sync_api.expect(page.get_by_role("heading", name="Another server")).to_be_visible()
        received = seen["/welcome"]
        replay = {name: value for name, value in received.items() if name.lower() != "host"}
        replay["Host"] = urlsplit(base).netloc
        with httpx.Client(base_url=base, timeout=10) as http:
            listed = http.get("/v1/queues", headers=replay)
            assert listed.status_code == 401, listed.text
            dashboard = http.get("/queues/orders", headers=replay)
            assert dashboard.status_code == 303, dashboard.text
            assert urlsplit(dashboard.headers["location"]).path == "/login"
            write = {**replay, "X-Requested-With": "delayq-dashboard"}
            purged = http.post("/v1/queues/orders/purge", json={}, headers=write)
            assert purged.status_code == 401, purged.text
            # The other origin's page cannot read the server's storage either.
            assert kept_session(page) is None
            # The session is kept where only the server's origin reads it, and works.
            page.goto(base + "/")
            session = kept_session(page)
            assert session
            for headers in seen.values():  # the page and whatever else the browser asked
                assert session not in " ".join(headers.values())
            kept = http.get("/v1/queues/orders/stats", headers={SESSION_HEADER: session})
            assert kept.status_code == 200
            assert kept.json()["scheduled"] == 1


def test_the_session_ends_at_sign_out_and_when_it_expires(
    tmp_path: Path, page: sync_api.Page
) -> None:
    expect = sync_api.expect
    config = ServeConfig(url=f"sqlite:///{tmp_path / 'ends.db'}", token=TOKEN, dispatch=False)
    with serving(config) as base, httpx.Client(base_url=base, timeout=10) as http:
        sign_in(page, base)
        copied = kept_session(page)
        assert copied
        assert http.get("/v1/queues", headers={SESSION_HEADER: copied}).status_code == 200
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(f"{base}/login**")
        expect(page.get_by_label("Token")).to_be_visible()
        assert kept_session(page) is None
        # A copy taken before the sign-out stops working: it ended on the server.
        assert http.get("/v1/queues", headers={SESSION_HEADER: copied}).status_code == 401

        # A session signed by this server that has expired (its key derives from the
        # token): refused, and the login page forgets it and shows the form.
        expired = Sessions(TOKEN, ttl=60, clock=lambda: time.time() - 3600).start()
        assert http.get("/v1/queues", headers={SESSION_HEADER: expired}).status_code == 401
        page.evaluate(f"localStorage.setItem({SESSION_KEY!r}, {expired!r})")
        page.goto(f"{base}/queues/orders")
        page.wait_for_url(f"{base}/login**")
        expect(page.get_by_label("Token")).to_be_visible()
        assert kept_session(page) is None
        # One that is still live opens the page a navigation asked for.
        live = Sessions(TOKEN, ttl=60, clock=lambda: time.time() - 30).start()
        page.evaluate(f"localStorage.setItem({SESSION_KEY!r}, {live!r})")
        page.goto(f"{base}/queues/orders")
        page.wait_for_url(f"{base}/queues/orders")
        expect(page.locator("#queue-empty")).to_be_visible()


def local_only(context: sync_api.BrowserContext) -> list[str]:
    """Abort every request of ``context`` that would leave this machine, as with no
    network; the list of what was aborted."""
    aborted: list[str] = []

    def handle(route: sync_api.Route) -> None:
        if urlsplit(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            aborted.append(route.request.url)
            route.abort()

    context.route("**/*", handle)
    return aborted


def test_api_docs_work_without_the_network(tmp_path: Path, page: sync_api.Page) -> None:
    expect = sync_api.expect
    aborted = local_only(page.context)
    config = ServeConfig(url=f"sqlite:///{tmp_path / 'docs.db'}", dispatch=False)
    with serving(config) as base:
        page.goto(f"{base}/docs")
        operations = page.locator(".opblock-summary-path")
        expect(operations.first).to_be_visible()
        assert operations.count() > 10
        reserve = page.locator(".opblock-summary-path", has_text="/v1/queues/{queue}/reserve")
        expect(reserve.first).to_be_visible()
        page.screenshot(path=str(tmp_path / "docs.png"))
    assert aborted == []


def put_at(base: str, queue: str, message_id: str, payload: object, **extra: object) -> None:
    """Put one message through the HTTP API, the queue name encoded as a path segment."""
    body = {"id": message_id, "payload": payload, **extra}
    response = httpx.post(
        f"{base}/v1/queues/{quote(queue, safe='')}/messages", json=body, timeout=10
    )
    assert response.status_code == 201, response.text


def test_active_empty_and_odd_names_in_the_dashboard(tmp_path: Path, page: sync_api.Page) -> None:
    expect = sync_api.expect
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    config = ServeConfig(url=url, dispatch=False)
    queue = "tenant ä 'q'"
    odd_ids = ["a b", "quote'\"q", "héllo✓", "..x", "50%", "a-rather-long-message-id-0123456789"]
    with serving(config) as base:
        # A queue that holds nothing yet has its page.
        page.goto(f"{base}/queues/brand-new")
        expect(page.locator("#queue-empty")).to_be_visible()
        expect(page.locator('[data-stat="scheduled"]')).to_have_text("0")
        expect(page.locator("#waiting-rows")).to_contain_text("Nothing waiting.")

        for message_id in odd_ids:
            put_at(base, queue, message_id, {"id": message_id, "html": "<i>x</i>"}, delay="10m")
        put_at(base, queue, "far", {}, delay=1000 * 86400)
        put_at(base, queue, "busy", {"n": 1})
        reserved = httpx.post(
            f"{base}/v1/queues/{quote(queue, safe='')}/reserve", json={"wait": 0, "lease": 120}
        )
        (held,) = reserved.json()["messages"]
        token = held["lease"]
        python_only = []
        with Queue(url, name=queue) as q:  # ids only other faces take, if they still do
            for message_id in ("a/b", ".."):
                try:
                    q.put({}, delay="10m", id=message_id)
                except ValueError:
                    continue
                python_only.append(message_id)

        page.goto(base + "/")
        page.locator("#queue-rows a", has_text=queue).click()
        page.wait_for_url(f"{base}/queues/**")
        expect(page.locator('[data-stat="active"]')).to_have_text("1")
        active = page.locator('#active-rows tr[data-id="busy"]')
        expect(active).to_contain_text("in 1m")
        expect(active.locator("time")).to_have_attribute("title", re.compile(r" UTC$"))
        assert token not in page.content()
        far = page.locator('#waiting-rows tr[data-id="far"] time')
        expect(far).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC$"))
        # The auto-refresh redraws the same rows (the script encodes as the server does).
        expect(page.locator("#refresh-status")).to_contain_text("UTC")
        expect(page.locator("#active-rows tr[data-id]")).to_have_count(1)
        preview = page.locator('#waiting-rows tr[data-id="a b"] td.preview')
        expect(preview).to_have_text('{"id":"a b","html":"<i>x</i>"}')
        expect(active).to_contain_text("in 1m")
        page.screenshot(path=str(tmp_path / "odd-queue.png"), full_page=True)

        # Every id's page opens from its link (as the script drew it).
        links = page.locator("#waiting-rows td.id a")
        hrefs = {link.inner_text(): link.get_attribute("href") for link in links.all()}
        assert set(hrefs) == {*odd_ids, *python_only, "far"}
        for message_id in [*odd_ids, *python_only]:
            page.goto(base + str(hrefs[message_id]))
            expect(page.locator("h1.id")).to_have_text(message_id)
        page.goto(f"{base}/queues/{quote(queue, safe='')}")

        # Buttons act on odd ids: cancel one from the list, reschedule one on its page.
        row = page.locator("#waiting-rows tr[data-id]").filter(
            has=page.get_by_role("link", name="quote'\"q", exact=True)
        )
        row.get_by_role("button", name="Cancel").click()
        expect(row).to_have_count(0)
        response = httpx.get(
            f"{base}/v1/queues/{quote(queue, safe='')}/messages/{quote(odd_ids[1], safe='')}"
        )
        assert response.status_code == 404
        page.get_by_role("link", name="héllo✓", exact=True).click()
        page.get_by_label("Reschedule to").fill("2h")
        page.get_by_role("button", name="Reschedule").click()
        expect(page.locator("time").first).to_contain_text("in 1h 59m")
        if "a/b" in python_only:
            page.go_back()
            slash = page.locator("#waiting-rows tr[data-id]").filter(
                has=page.get_by_role("link", name="a/b", exact=True)
            )
            expect(slash).to_contain_text("not over HTTP")


def test_ids_do_not_wrap_a_letter_a_line_on_a_phone(
    tmp_path: Path, browser: sync_api.Browser
) -> None:
    config = ServeConfig(url=f"sqlite:///{tmp_path / 'phone.db'}", dispatch=False)
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True)
    try:
        with serving(config) as base:
            put(base, "orders", "order-42", {"order": 42}, delay="10m")
            put(base, "orders", "a-rather-long-message-id-0123456789", {"n": 1}, delay="11m")
            tab = context.new_page()
            tab.goto(f"{base}/queues/orders")
            short = tab.locator('#waiting-rows tr[data-id="order-42"] td.id a')
            sync_api.expect(short).to_be_visible()
            # An inline element has one client rect per line it spans.
            assert short.evaluate("node => node.getClientRects().length") == 1
            long = tab.locator('#waiting-rows tr[data-id^="a-rather"] td.id a')
            assert long.evaluate("node => node.getClientRects().length") <= 3
            tab.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    finally:
        context.close()


def _dead_letter(url: str, queue: str, message_id: str) -> None:
    """A real Worker fails ``message_id`` of ``queue`` until it is dead."""

    def charge(msg: object) -> None:
        raise ValueError(f"card declined: {getattr(msg, 'payload', None)}")

    async def main() -> None:
        handle = AsyncQueue(url, name=queue, retry=RetryPolicy(max_attempts=1))
        await handle.put({"order": 9}, id=message_id)
        worker = Worker(handle, charge)
        task = asyncio.create_task(worker.serve())
        async with asyncio.timeout(20):
            while worker.counts["dead"] < 1:
                await asyncio.sleep(0.01)
        worker.stop()
        await asyncio.wait_for(task, 10)
        await handle.close()

    # Playwright's sync API runs a loop in this thread: the worker's runs in another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result()


def test_every_page_links_hints_and_ticks(tmp_path: Path, page: sync_api.Page) -> None:
    """A fresh server: no callbacks row, the first-message hint for this server, the
    footer's links; then a waiting cron tick (no lag warning), overdue work (a
    warning), a dead letter's traceback from the handler's frames. Each page is
    screenshotted into ``tmp_path``."""
    expect = sync_api.expect
    url = f"sqlite:///{tmp_path / 'pages.db'}"
    with serving(ServeConfig(url=url)) as base:  # the dispatcher runs: a callbacks queue
        page.goto(base + "/")
        expect(page.locator("#first-message")).to_be_visible()
        expect(page.locator("#queue-rows tr.empty")).to_have_text("No queue holds a message yet.")
        assert page.locator('#queue-rows tr[data-queue="callbacks"]').count() == 0
        curl = page.locator("#hint-curl").inner_text()
        assert curl.startswith(f"curl -X POST {base}/v1/queues/default/messages")
        assert f"--url {url}" in page.locator("#hint-put").inner_text()
        page.screenshot(path=str(tmp_path / "overview-empty.png"), full_page=True)
        for path in ("/docs", "/redoc", "/openapi.json", "/metrics", "/healthz"):
            link = page.locator(f'footer a[href="{path}"]')
            expect(link).to_be_visible()
            assert httpx.get(base + path, timeout=10).status_code == 200, path
        # The hint's own command works.
        body = json.loads(curl.rsplit("-d ", 1)[1].strip("'"))
        put(base, "default", "first", body["payload"], delay=body["delay"])
        expect(page.locator('#queue-rows tr[data-queue="default"]')).to_be_visible()
        expect(page.locator("#first-message")).to_be_hidden()

        # A tick a stopped worker left behind, and real work, both overdue by now.
        _dead_letter(url, "payments", "declined")
        with Queue(url, name="default") as queue:
            queue.put({"task": "report"}, headers={TICK_HEADER: str(int(time.time() * 1000))})
        put(base, "orders", "late", {"order": 1})
        time.sleep(2.5)
        page.reload()
        default = page.locator('#queue-rows tr[data-queue="default"] td').nth(6)
        expect(default).to_contain_text(re.compile(r"^0s tick waiting [2-9]s"))
        expect(default).not_to_have_class(re.compile(r"\bwarn\b"))
        orders = page.locator('#queue-rows tr[data-queue="orders"] td').nth(6)
        expect(orders).to_have_class(re.compile(r"\bwarn\b"))
        expect(orders).not_to_contain_text("tick")
        page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
        page.wait_for_timeout(1500)  # a refresh from the API draws the same cells
        expect(default).to_contain_text("tick waiting")
        expect(default).not_to_have_class(re.compile(r"\bwarn\b"))

        page.goto(f"{base}/queues/default")
        expect(page.locator('[data-stat="lag"]')).to_contain_text("tick waiting")
        page.screenshot(path=str(tmp_path / "queue.png"), full_page=True)

        page.goto(f"{base}/queues/payments")
        dead = page.locator('#dead-rows tr[data-id="declined"] td.error')
        expect(dead).to_contain_text("ValueError: card declined")
        expect(dead).to_contain_text("in charge")
        page.screenshot(path=str(tmp_path / "dead.png"), full_page=True)

        page.goto(f"{base}/queues/payments/messages/declined")
        shown = page.locator("#last-error").inner_text()
        first = shown.split("Traceback (most recent call last):\n", 1)[1].split("\n", 1)[0]
        assert Path(__file__).name in first, shown
        assert "runtime/pool.py" not in shown
        expect(page.locator("#last-error-full")).to_be_hidden()
        page.get_by_text("The whole text, delayq's own frames too").click()
        expect(page.locator("#last-error-full")).to_contain_text("runtime/pool.py")
        page.screenshot(path=str(tmp_path / "message.png"), full_page=True)

    with serving(ServeConfig(url=url, token=TOKEN, dispatch=False)) as base:
        page.goto(base + "/")
        expect(page.locator('input[name="token"]')).to_be_visible()
        page.screenshot(path=str(tmp_path / "login.png"), full_page=True)


def test_redoc_works_without_the_network(tmp_path: Path, browser: sync_api.Browser) -> None:
    """/redoc renders the API from local files; the one image ReDoc's bundle names
    on its CDN is refused by the page's policy, not fetched."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    aborted = local_only(context)
    tab = context.new_page()
    refused: list[str] = []
    tab.on("console", lambda message: refused.append(message.text))
    tab.on("pageerror", lambda error: refused.append(f"script error: {error}"))
    try:
        with serving(ServeConfig(url=f"sqlite:///{tmp_path / 'redoc.db'}", dispatch=False)) as base:
            tab.goto(f"{base}/redoc")
            sync_api.expect(tab.get_by_text("/v1/queues/{queue}/reserve").first).to_be_attached(
                timeout=WAIT_MS
            )
            tab.screenshot(path=str(tmp_path / "redoc.png"))
    finally:
        context.close()
    assert aborted == []
    problems = [text for text in refused if "cdn.redoc.ly" not in text]
    assert not [text for text in problems if "Content Security Policy" in text or "error" in text]
