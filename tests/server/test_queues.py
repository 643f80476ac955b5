"""Queue-wide routes: list, stats, peek, due counts, dead letters, purge; and the
operational ones, /healthz and /metrics."""

from __future__ import annotations

import http.server
import json
import queue
import threading
import time
from typing import Any, ClassVar

import pytest
from fastapi.testclient import TestClient

from delayq.server import ServeConfig, create_app, verify

from ._helpers import JSON_TYPE, error_of, put, stats


def kill(client: TestClient, message_id: str, queue: str = "q") -> None:
    held = client.post(f"/v1/queues/{queue}/reserve", headers=JSON_TYPE).json()["messages"][0]
    assert held["id"] == message_id
    response = client.post(
        f"/v1/queues/{queue}/messages/{message_id}/nack",
        json={"lease": held["lease"], "dead": True, "error": "gave up"},
    )
    assert response.json() == {"state": "dead"}


def test_list_queues_and_stats(any_client: TestClient) -> None:
    put(any_client, "alpha")
    put(any_client, "alpha", delay="1h")
    put(any_client, "beta", delay="2h")
    queues = {entry["name"]: entry for entry in any_client.get("/v1/queues").json()["queues"]}
    assert set(queues) == {"alpha", "beta"}  # an empty callback queue is not listed
    assert (queues["alpha"]["ready"], queues["alpha"]["scheduled"]) == (1, 1)
    assert queues["beta"]["next_due_at"] is not None
    alpha = stats(any_client, "alpha")
    grows = {"lag": None, "work_lag": None}  # they grow meanwhile
    assert {**alpha, **grows} == {**queues["alpha"], **grows}


def test_peek_by_state_and_limit(any_client: TestClient) -> None:
    later = put(any_client, delay="1h")
    now = put(any_client)
    ids = [m["id"] for m in any_client.get("/v1/queues/q/messages").json()["messages"]]
    assert ids == [now, later]
    one = any_client.get("/v1/queues/q/messages", params={"limit": 1}).json()["messages"]
    assert [m["id"] for m in one] == [now]
    scheduled = any_client.get("/v1/queues/q/messages", params={"state": "scheduled"}).json()
    assert [m["id"] for m in scheduled["messages"]] == [later]
    for params in ({"state": "gone"}, {"limit": 0}, {"limit": 1001}):
        response = any_client.get("/v1/queues/q/messages", params=params)
        assert error_of(response, 422) == "invalid_request"


def test_due_counts(any_client: TestClient) -> None:
    put(any_client, delay="10m")
    put(any_client, delay="50m")
    put(any_client, delay="55m")
    body = any_client.get("/v1/queues/q/due", params={"horizon": 3600, "buckets": 4}).json()
    assert body["bucket_ms"] == 900_000
    assert body["counts"] == [1, 0, 0, 2]
    assert body["start"] > 0
    for params in ({"horizon": 0}, {"buckets": 0}, {"buckets": 1001}, {"horizon": "x"}):
        assert error_of(any_client.get("/v1/queues/q/due", params=params), 422)


def test_dead_list_retry_and_purge(any_client: TestClient) -> None:
    first, second = put(any_client, id="d1"), put(any_client, id="d2")
    kill(any_client, first)
    kill(any_client, second)
    dead = any_client.get("/v1/queues/q/dead").json()["messages"]
    assert [m["id"] for m in dead] == ["d1", "d2"]
    assert dead[0]["last_error"] == "gave up"
    assert len(any_client.get("/v1/queues/q/dead", params={"limit": 1}).json()["messages"]) == 1
    assert error_of(any_client.get("/v1/queues/q/dead", params={"limit": 0}), 422)
    retried = any_client.post("/v1/queues/q/dead/retry", json={"ids": ["d1"]})
    assert retried.json() == {"retried": 1}
    assert any_client.post("/v1/queues/q/dead/retry", json={"ids": None}).json() == {"retried": 1}
    kill(any_client, "d1")
    assert any_client.post("/v1/queues/q/dead/retry", headers=JSON_TYPE).json() == {"retried": 1}
    put(any_client, delay="1h")
    assert any_client.post("/v1/queues/q/purge", json={"state": "scheduled"}).json() == {
        "purged": 1
    }
    assert any_client.post("/v1/queues/q/purge", headers=JSON_TYPE).json() == {"purged": 2}
    assert stats(any_client)["ready"] == 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/queues/q/purge", {"state": "gone"}),
        ("/v1/queues/q/purge", {"states": None}),
        ("/v1/queues/q/dead/retry", {"ids": "d1"}),
        ("/v1/queues/q/dead/retry", {"ids": [""]}),
    ],
)
def test_bad_queue_wide_requests_change_nothing(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    put(client)
    assert error_of(client.post(path, json=body), 422) in ("invalid_request", "invalid_id")
    assert stats(client)["ready"] == 1


def test_healthz(any_client: TestClient) -> None:
    response = any_client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_healthz_is_503_when_the_backend_does_not_answer(make_client: Any) -> None:
    client = make_client("redis://127.0.0.1:1/0")
    response = client.get("/healthz")
    assert error_of(response, 503) == "backend_unavailable"


def test_metrics(any_client: TestClient) -> None:
    put(any_client, "m", delay="1h")
    message_id = put(any_client, "m")
    held = any_client.post("/v1/queues/m/reserve", headers=JSON_TYPE).json()["messages"][0]
    any_client.post(f"/v1/queues/m/messages/{message_id}/ack", json={"lease": held["lease"]})
    response = any_client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert 'delayq_messages{queue="m",state="scheduled"} 1.0' in text
    assert 'delayq_puts_total{queue="m"} 2.0' in text
    assert 'delayq_acks_total{queue="m"} 1.0' in text
    assert 'delayq_lateness_seconds_count{queue="m"} 1.0' in text


class _Hooks(http.server.BaseHTTPRequestHandler):
    """A receiver of callbacks: records each request's path, headers and body."""

    arrivals: ClassVar[queue.Queue[tuple[str, dict[str, str], bytes]]] = queue.Queue()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.arrivals.put((self.path, dict(self.headers.items()), body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.timeout(60)
def test_lifespan_runs_the_dispatcher_when_asked(tmp_path: Any) -> None:
    """With ``dispatch`` the app's lifespan runs the dispatcher: a callback put over
    the API is delivered (signed) and acked, and leaving the app stops it."""
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    port = receiver.server_address[1]
    config = ServeConfig(
        url=f"sqlite:///{tmp_path / 'd.db'}",
        dispatch=True,
        allow_loopback_callbacks=True,
        signing_secret="lifespan-secret",
    )
    try:
        with TestClient(create_app(config), base_url="http://localhost") as client:
            answer = client.post(
                "/v1/queues/callbacks/messages",
                json={"payload": {"n": 1}, "callback": {"url": f"http://127.0.0.1:{port}/hook"}},
            )
            assert answer.status_code == 201, answer.text
            message_id = answer.json()["id"]
            path, headers, body = _Hooks.arrivals.get(timeout=30)
            assert path == "/hook"
            assert headers["X-Delayq-Message-Id"] == message_id
            assert json.loads(body) == {"n": 1}
            assert verify("lifespan-secret", headers["X-Delayq-Signature"], body, tolerance=600)
            deadline = time.monotonic() + 30
            while client.get(f"/v1/queues/callbacks/messages/{message_id}").status_code != 404:
                assert time.monotonic() < deadline, "the delivered callback was not acked"
                time.sleep(0.02)
        # Leaving the block ran the lifespan's shutdown: the dispatcher stopped cleanly.
    finally:
        receiver.shutdown()
        receiver.server_close()
    assert _Hooks.arrivals.empty()  # delivered once
