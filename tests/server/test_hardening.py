"""What a hostile web page, a hostile client or a careless log reader can do to a
server, through the whole ASGI stack: cross-site writes, DNS rebinding, WebSockets,
oversized headers and forms, token guessing, sessions that outlive their logout,
waiting reserves held open by one client, secrets on the open health check, and
forged log lines."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import httpx
import pytest
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from delayq._log import log_event
from delayq.server import ServeConfig, create_app
from delayq.server._auth import SESSION_HEADER, AttemptThrottle, Sessions

from ._helpers import JSON_TYPE, TOKEN, error_of, put, session_of, signed_in, stats
from .conftest import MakeClient

EVIL = "https://evil.example"


# -- 1. cross-site writes and DNS rebinding --------------------------------------------


def test_a_simple_cross_site_request_cannot_reschedule_or_purge(client: Any) -> None:
    message_id = put(client, delay="1h")
    before = client.get(f"/v1/queues/q/messages/{message_id}").json()["due_at"]
    # What a page on another site can send without a preflight: text/plain or a form,
    # with or without a body.
    for headers in (
        {"Origin": EVIL, "Content-Type": "text/plain"},
        {"Origin": EVIL, "Content-Type": "application/x-www-form-urlencoded"},
        {"Origin": EVIL},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
    ):
        moved = client.post(f"/v1/queues/q/messages/{message_id}/reschedule", headers=headers)
        assert error_of(moved, 403) == "cross_site_request"
        purged = client.post("/v1/queues/q/purge", headers=headers)
        assert error_of(purged, 403) == "cross_site_request"
    # Even JSON is refused when the browser says it comes from elsewhere.
    refused = client.post("/v1/queues/q/purge", json={}, headers={"Origin": EVIL})
    assert error_of(refused, 403) == "cross_site_request"
    assert client.get(f"/v1/queues/q/messages/{message_id}").json()["due_at"] == before
    assert stats(client)["scheduled"] == 1


def test_a_write_without_origin_must_still_be_json(client: Any) -> None:
    """Old browsers and privacy settings may drop Origin: a write must then be JSON
    (which needs a preflight cross-site) or carry a header a form cannot send."""
    put(client, delay="1h")
    for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "multipart/form-data"}):
        response = client.post("/v1/queues/q/purge", headers=headers)
        assert error_of(response, 415) == "unsupported_media_type"
        assert "application/json" in response.json()["error"]["message"]
    assert stats(client)["scheduled"] == 1
    # An empty JSON request, or a custom header with no body, may write.
    now = client.post("/v1/queues/q/reserve", headers=JSON_TYPE)
    assert now.status_code == 200, now.text
    custom = client.post("/v1/queues/q/purge", headers={"X-Requested-With": "script"})
    assert custom.status_code == 200, custom.text
    assert stats(client)["ready"] == 0


def test_the_servers_own_pages_may_write(client: Any) -> None:
    put(client, delay="1h")
    for origin in ("http://localhost", "http://localhost:80"):
        response = client.post(
            "/v1/queues/q/purge",
            json={},
            headers={"Origin": origin, "Sec-Fetch-Site": "same-origin"},
        )
        assert response.status_code == 200, response.text


def test_a_rebound_host_name_gets_nothing(client: Any) -> None:
    put(client, delay="1h")
    for host in ("rebind.evil.example", "evil.example:8080", "192.168.1.5", "10.0.0.1:8080"):
        headers = {"Host": host}
        assert error_of(client.get("/v1/queues", headers=headers), 400) == "host_not_allowed"
        assert error_of(client.get("/", headers=headers), 400) == "host_not_allowed"
        written = client.post("/v1/queues/q/purge", json={}, headers=headers)
        assert error_of(written, 400) == "host_not_allowed"
        assert "--allowed-host" in written.json()["error"]["message"]
    assert stats(client)["scheduled"] == 1
    for host in ("localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:8080", "a.localhost"):
        assert client.get("/v1/queues", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_name_the_others(make_client: MakeClient) -> None:
    listed = make_client(allowed_hosts=("queue.example.com", "*.internal.example"))
    for host in ("queue.example.com", "QUEUE.example.com.:443", "a.internal.example"):
        assert listed.get("/v1/queues", headers={"Host": host}).status_code == 200, host
    for host in ("example.com", "internal.example", "evil.example"):
        refused = listed.get("/v1/queues", headers={"Host": host})
        assert error_of(refused, 400) == "host_not_allowed", host
    # A page served under a listed name may write from it.
    ok = listed.post(
        "/v1/queues/q/purge",
        json={},
        headers={"Host": "localhost", "Origin": "https://queue.example.com"},
    )
    assert ok.status_code == 200
    anything = make_client(allowed_hosts=("*",))
    assert anything.get("/v1/queues", headers={"Host": "whatever.example"}).status_code == 200


def test_a_token_server_on_every_interface_answers_any_name(make_client: MakeClient) -> None:
    """Bound beyond loopback, the token guards it; a rebound page has no token."""
    open_all = make_client(host="0.0.0.0", token=TOKEN)
    bearer = {"Authorization": f"Bearer {TOKEN}", "Host": "queue.example.com"}
    assert open_all.get("/v1/queues", headers=bearer).status_code == 200
    rebound = open_all.get("/v1/queues", headers={"Host": "rebind.evil.example"})
    assert error_of(rebound, 401) == "unauthorized"


@pytest.mark.parametrize("allowed", [(), ("x.example",)])
def test_bad_allowed_hosts_are_refused(allowed: tuple[str, ...]) -> None:
    bad = (*allowed, "http://x.example/")
    with pytest.raises(ValueError, match="allowed host"):
        ServeConfig(url="memory://x", allowed_hosts=bad)


# -- 2. headers: cookies dropped, sizes capped ------------------------------------------


def test_a_hostile_cookie_changes_nothing(make_client: MakeClient) -> None:
    """The guard drops the Cookie headers (the server reads none) before any parser
    sees them; their time is measured in test_hostile_input_time.py."""
    locked = make_client(token=TOKEN)
    hostile = {"Cookie": "x=" + '"' + "\\" * 30_000 + '"'}
    assert error_of(locked.get("/v1/queues", headers=hostile), 401) == "unauthorized"
    assert locked.get("/login", headers=hostile).status_code == 200
    session = signed_in(locked)
    assert locked.get("/v1/queues", headers={**hostile, **session}).status_code == 200


def test_oversized_headers_are_a_431(client: Any) -> None:
    big = {"X-Padding": "a" * 40_000}
    assert error_of(client.get("/healthz", headers=big), 431) == "headers_too_large"
    many = {f"X-Pad-{i}": "a" * 100 for i in range(400)}
    assert error_of(client.get("/v1/queues", headers=many), 431) == "headers_too_large"


def test_websockets_are_refused_everywhere(make_client: MakeClient) -> None:
    for client in (make_client(), make_client(token=TOKEN)):
        for path in ("/ws", "/static/dashboard.js", "/v1/queues"):
            with (
                pytest.raises((WebSocketDisconnect, WebSocketDenialResponse)) as caught,
                client.websocket_connect(path),
            ):
                pass
            if isinstance(caught.value, WebSocketDisconnect):
                assert caught.value.code == 1008


# -- 5. bodies: capped per route before they are read ---------------------------------


def test_the_login_form_reads_no_more_than_its_cap(make_client: MakeClient) -> None:
    locked = make_client(token=TOKEN)
    declared = locked.post(
        "/login",
        content=b"token=" + b"a" * 2_000_000,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert error_of(declared, 413) == "body_too_large"
    assert "8192 bytes" in declared.json()["error"]["message"]

    def chunks() -> Any:
        for _ in range(1000):
            yield b"a" * 2048

    streamed = locked.post(
        "/login", content=chunks(), headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert error_of(streamed, 413) == "body_too_large"


def test_a_client_holds_a_bounded_number_of_long_polls() -> None:
    async def main() -> None:
        config = ServeConfig(
            url=f"memory://polls-{uuid.uuid4().hex}", dispatch=False, max_long_polls_per_client=2
        )
        app = create_app(config)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 5000))
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:

                async def poll() -> httpx.Response:
                    return await http.post("/v1/queues/lp/reserve", json={"wait": 1.5})

                waiting = [asyncio.ensure_future(poll()) for _ in range(2)]
                await asyncio.sleep(0.3)
                third = await http.post("/v1/queues/lp/reserve", json={"wait": 1.5})
                assert error_of(third, 429) == "too_many_long_polls"
                assert third.headers["retry-after"] == "1"
                # Reserves that do not wait are not counted.
                quick = await http.post("/v1/queues/lp/reserve", json={"wait": 0})
                assert quick.status_code == 200
                for response in await asyncio.gather(*waiting):
                    assert response.json() == {"messages": []}
                again = await http.post("/v1/queues/lp/reserve", json={"wait": 0.1})
                assert again.status_code == 200

    asyncio.run(main())


# -- 6. token guessing ----------------------------------------------------------------


def test_wrong_tokens_are_throttled_and_logged(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    locked = make_client(token=TOKEN)
    session = signed_in(locked)
    wrong = {"Authorization": "Bearer not-the-token"}
    caplog.set_level(logging.WARNING, logger="delayq")
    for _ in range(20):
        assert error_of(locked.get("/v1/queues", headers=wrong), 401) == "unauthorized"
    throttled = locked.get("/v1/queues", headers=wrong)
    assert error_of(throttled, 429) == "too_many_attempts"
    assert int(throttled.headers["retry-after"]) >= 1
    # Now even the right token is refused from this address: guessing gains nothing.
    right = locked.get("/v1/queues", headers={"Authorization": f"Bearer {TOKEN}"})
    assert error_of(right, 429) == "too_many_attempts"
    login = locked.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert login.status_code == 429
    # A live session is no guess: it still works.
    assert locked.get("/v1/queues", headers=session).status_code == 200
    failed = [r for r in caplog.records if r.getMessage().startswith("auth.failed")]
    assert len(failed) == 20
    assert "client=testclient" in failed[0].getMessage()
    assert any(r.getMessage().startswith("auth.throttled") for r in caplog.records)


def test_the_login_form_counts_wrong_tokens_too(make_client: MakeClient) -> None:
    locked = make_client(token=TOKEN)
    for _ in range(20):
        wrong = locked.post("/login", data={"token": "nope"}, follow_redirects=False)
        assert wrong.status_code == 401
    assert locked.post("/login", data={"token": "nope"}).status_code == 429
    bearer = locked.get("/v1/queues", headers={"Authorization": f"Bearer {TOKEN}"})
    assert error_of(bearer, 429) == "too_many_attempts"


def test_the_throttle_refills_and_stays_bounded() -> None:
    now = [0.0]
    throttle = AttemptThrottle(burst=3, refill=10.0, tracked=100, clock=lambda: now[0])
    for _ in range(3):
        assert throttle.retry_after("a") == 0
        throttle.failed("a", via="bearer", path="/")
    assert throttle.retry_after("a") == pytest.approx(10.0)
    assert throttle.retry_after("b") == 0  # another address is not held up
    now[0] += 10.0
    assert throttle.retry_after("a") == 0
    for n in range(1000):
        throttle.failed(f"c{n}", via="bearer", path="/")
    assert throttle.retry_after("c999") == 0  # 2 of 3 left
    assert len(throttle._buckets) <= 100


# -- 9. sessions ----------------------------------------------------------------------


def test_logout_ends_a_copied_session(make_client: MakeClient) -> None:
    locked = make_client(token=TOKEN)
    copied = signed_in(locked)
    assert locked.get("/v1/queues", headers=copied).status_code == 200
    # Logging out is a POST: a link or an image cannot do it for the user.
    assert locked.get("/logout", headers=copied).status_code == 405
    out = locked.post("/logout", headers=copied, follow_redirects=False)
    assert out.status_code == 303
    assert error_of(locked.get("/v1/queues", headers=copied), 401) == "unauthorized"
    # A page fetched with it (as the login page's script does) too: the script then
    # forgets it and shows the form.
    page = locked.get("/", headers={**copied, "Accept": "text/html"}, follow_redirects=False)
    assert error_of(page, 401) == "unauthorized"
    assert "ended or expired" in page.json()["error"]["message"]
    # A new login is a new session.
    assert locked.get("/v1/queues", headers=signed_in(locked)).status_code == 200


def test_a_session_expires() -> None:
    now = [1_000_000.0]
    sessions = Sessions(TOKEN, ttl=3600, clock=lambda: now[0])
    value = sessions.start()
    assert sessions.live(value)
    now[0] += 3599
    assert sessions.live(value)
    now[0] += 2
    assert not sessions.live(value)
    # Forged or altered values, and values of another token, are never live.
    fresh = sessions.start()
    expires, nonce, mac = fresh.split(".")
    assert not sessions.live(f"{int(expires) + 86400}.{nonce}.{mac}")
    assert not sessions.live(Sessions("another-token", 3600, clock=lambda: now[0]).start())
    assert not sessions.live("")
    assert not sessions.live("a.b.c.d")


def test_the_session_is_no_cookie(make_client: MakeClient) -> None:
    """A cookie goes to every port of the host (RFC 6265 8.5): the session is handed
    to the page's script instead, and a cookie holding it is no credential."""
    locked = make_client(token=TOKEN, session_ttl=600)
    login = locked.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert login.status_code == 200
    assert "set-cookie" not in login.headers
    assert login.headers["cache-control"] == "no-store"
    value = session_of(login.text)
    assert 599 <= int(value.split(".")[0]) - time.time() <= 601
    for name in ("delayq_session", "session", SESSION_HEADER):
        cookie = {"Cookie": f"{name}={value}"}
        assert error_of(locked.get("/v1/queues", headers=cookie), 401) == "unauthorized"
        page = locked.get("/", headers={**cookie, "Accept": "text/html"}, follow_redirects=False)
        assert page.status_code == 303
    assert locked.get("/v1/queues", headers={SESSION_HEADER: value}).status_code == 200


# -- 7. and 8. what is logged and shown ------------------------------------------------


def test_a_log_field_cannot_forge_a_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    forged = "x\r\ncallback.delivered id=forged queue=q"
    log_event(logging.INFO, "callback.dead", id=forged, queue="q", error='a "quoted" text')
    [record] = caplog.records
    line = record.getMessage()
    assert "\n" not in line
    assert "\r" not in line
    assert line.startswith("callback.dead id=")
    assert r'"x\r\ncallback.delivered id=forged queue=q"' in line
    assert r'error="a \"quoted\" text"' in line
    assert record.delayq["id"] == forged  # structured handlers get the value itself


def test_the_health_check_does_not_show_where_the_backend_is(
    make_client: MakeClient, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "no-such-directory" / "q.db"
    broken = make_client(f"sqlite:///{missing}")
    caplog.set_level(logging.WARNING, logger="delayq")
    response = broken.get("/healthz")
    assert error_of(response, 503) == "backend_unavailable"
    assert str(tmp_path) not in response.text
    assert "no-such-directory" not in response.text
    assert any("no-such-directory" in r.getMessage() for r in caplog.records)


def test_the_startup_url_hides_its_password() -> None:
    from delayq.durable.registry import redact_url  # noqa: PLC0415

    assert redact_url("redis://:hunter2@db:6379/0") == "redis://:***@db:6379/0"
    assert redact_url("redis://app:hunter2@db/0?password=x&db=1") == (
        "redis://app:***@db/0?password=***&db=1"
    )
    assert redact_url("redis://hunter2@db/0") == "redis://***@db/0"
    assert redact_url("sqlite:///var/q.db") == "sqlite:///var/q.db"


def test_session_values_do_not_reveal_the_token() -> None:
    value = Sessions(TOKEN, ttl=60, clock=time.time).start()
    assert TOKEN not in value
    assert len(value) < 128


def test_a_queue_and_an_app_do_not_show_their_password() -> None:
    from delayq import App, Queue  # noqa: PLC0415

    url = "redis://:hunter2@127.0.0.1:6379/0"
    queue = Queue(url)
    try:
        assert "hunter2" not in repr(queue)
        assert "***" in repr(queue)
    finally:
        queue.close()
    assert "hunter2" not in repr(App(url))


@pytest.mark.parametrize(
    "pattern",
    ["api.example.com:abc", "api.example.com:0", "api.example.com:99999", "api.example.com:",
     "*", "*.", "a*.b",
     "https://api.example.com", "[::1", "[::1]8080", "user@api.example.com", " "],
)  # fmt: skip
def test_a_malformed_callback_host_is_refused_at_start(pattern: str) -> None:
    with pytest.raises(ValueError, match="callback host must be"):
        ServeConfig(url="memory://x", callback_hosts=(pattern,))


def test_well_formed_callback_hosts_are_accepted() -> None:
    hosts = ("api.example.com", "*.example.com:8443", "10.0.0.7:*", "[2001:db8::1]:443", "::1")
    assert ServeConfig(url="memory://x", callback_hosts=hosts).callback_hosts == hosts


def test_a_callback_host_list_edited_after_start_changes_nothing() -> None:
    hosts = ["api.example.com"]
    config = ServeConfig(url="memory://x", callback_hosts=hosts)  # type: ignore[arg-type]
    hosts.append("not a [pattern")  # never checked: it must not reach the allowlist
    assert config.callback_hosts == ("api.example.com",)
    with pytest.raises(ValueError, match="callback_hosts must be a tuple of str"):
        ServeConfig(url="memory://x", callback_hosts="api.example.com")  # type: ignore[arg-type]
