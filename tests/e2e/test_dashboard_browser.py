"""The dashboard in a real browser: Debian's chromium driven by Playwright.

The server is the real app on uvicorn (a background thread, a free port) over a SQLite
file in ``tmp_path``; messages go in through the HTTP API, and the test clicks what a
user clicks. Screenshots are saved in ``tmp_path``. Never ``playwright install``: the
browser is the system's ``/usr/bin/chromium`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest
import uvicorn

from delayq import Queue
from delayq.server import ServeConfig, create_app

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


def put(base: str, queue: str, message_id: str, payload: object, **extra: object) -> None:
    """Put one message through the HTTP API."""
    body = {"id": message_id, "payload": payload, **extra}
    response = httpx.post(f"{base}/v1/queues/{queue}/messages", json=body, timeout=10)
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
        response = httpx.post(
            f"{base}/v1/queues/invoices/messages",
            json={"id": "inv-1", "payload": {"amount": 10}, "delay": "1h"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert response.status_code == 201, response.text

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
        # The auto-refresh reaches the API with the session cookie.
        expect(page.locator("#refresh-status")).to_contain_text("updated")
        page.screenshot(path=str(tmp_path / "signed-in.png"), full_page=True)

        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(f"{base}/login**")


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
