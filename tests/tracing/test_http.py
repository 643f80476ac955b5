"""The HTTP API: a put takes the trace context of the request's own ``traceparent``
header to the handler's run, and an HTTP callback sends ``traceparent`` on."""

from __future__ import annotations

import asyncio
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from conformance.conftest import memory_url
from delayq import AsyncQueue, Worker
from delayq.durable.retry import RetryPolicy
from delayq.server import ServeConfig, create_app
from delayq.server._callbacks import parse_callback
from delayq.server._constants import CALLBACK_HEADER
from server.test_dispatch_e2e import QUEUE, Arrival, dispatching, put, serve_config, wait_until

from .conftest import Spans

with warnings.catch_warnings():  # starlette's note about httpx, at import
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e225e"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def http_puts(url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """One put and one batch put through the API with ``headers``; the messages as the
    API shows them."""
    with TestClient(create_app(ServeConfig(url=url)), base_url="http://localhost") as client:
        one = client.post("/v1/queues/jobs/messages", json={"payload": 1}, headers=headers)
        batch = client.post(
            "/v1/queues/jobs/messages/batch",
            json={"messages": [{"payload": 2}, {"payload": 3, "headers": {"x": "y"}}]},
            headers=headers,
        )
        assert one.status_code == 201, one.text
        assert batch.status_code == 201, batch.text
        ids = [one.json()["id"], *batch.json()["ids"]]
        return [client.get(f"/v1/queues/jobs/messages/{id}").json() for id in ids]


def test_an_http_put_carries_the_request_traceparent_to_the_run(spans: Spans) -> None:
    url = next(memory_url(Path(".")))
    messages = http_puts(url, {"traceparent": PARENT, "tracestate": "vendor=1"})
    for message in messages:
        assert message["headers"]["traceparent"] == PARENT
        assert message["headers"]["tracestate"] == "vendor=1"
    assert messages[2]["headers"]["x"] == "y"
    sends = spans.named("send jobs")  # the server's own send spans link to it
    assert {f"{link.context.span_id:016x}" for send in sends for link in send.links} == {
        "00f067aa0ba902b7"
    }

    def handler(msg: object) -> None:
        pass

    asyncio.run(Worker(AsyncQueue(url, name="jobs"), handler).burst())
    runs = spans.named("process jobs")
    assert len(runs) == 3
    for run in runs:  # one trace from the HTTP caller's span to the handler's run
        assert f"{run.context.trace_id:032x}" == TRACE_ID
        assert f"{run.parent.span_id:016x}" == "00f067aa0ba902b7"  # type: ignore[union-attr]


def test_without_an_sdk_the_server_stores_the_caller_context_as_it_came() -> None:
    url = next(memory_url(Path(".")))
    (one, *_) = http_puts(url, {"traceparent": PARENT})
    assert one["headers"] == {"traceparent": PARENT}
    bad = http_puts(url, {"traceparent": PARENT.upper(), "tracestate": "a=1"})
    assert [message["headers"] for message in bad] == [{}, {}, {"x": "y"}]  # ignored, stored


def test_the_body_s_own_traceparent_wins() -> None:
    url = next(memory_url(Path(".")))
    own = "00-" + "1" * 32 + "-" + "2" * 16 + "-00"
    with TestClient(create_app(ServeConfig(url=url)), base_url="http://localhost") as client:
        answer = client.post(
            "/v1/queues/jobs/messages",
            json={"payload": 1, "headers": {"traceparent": own}},
            headers={"traceparent": PARENT},
        )
        message = client.get(f"/v1/queues/jobs/messages/{answer.json()['id']}").json()
    assert message["headers"] == {"traceparent": own}


async def traced_callbacks(state: Any, url: str, count: int) -> None:
    cb = parse_callback({"url": url}, state.config)
    for n in range(count):
        headers = {CALLBACK_HEADER: cb.to_header(), "traceparent": PARENT, "tracestate": "v=1"}
        await state.queue(QUEUE).put({"n": n}, headers=headers)
    await put(state, cb, {"n": "plain"})  # no trace context: none sent


def logged_runs(caplog: pytest.LogCaptureFixture, event: str) -> dict[str, dict[str, Any]]:
    """The fields of the dispatcher's ``event`` lines, by the body of their message."""
    return {
        fields["id"]: fields
        for record in caplog.records
        if (fields := getattr(record, "delayq", None)) and fields["event"] == event
    }


@pytest.mark.timeout(30)
def test_a_callback_sends_the_message_traceparent_on_without_an_sdk(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    ids: dict[bytes, str] = {}

    async def scenario() -> None:
        async with dispatching(serve_config(next(memory_url(Path("."))))) as (state, _, receiver):
            await traced_callbacks(state, receiver.url(), 1)
            await wait_until(lambda: len(receiver.arrivals) == 2)
            traced = [a for a in receiver.arrivals if a.body == b'{"n":0}']
            assert traced[0].headers["traceparent"] == PARENT
            assert traced[0].headers["tracestate"] == "v=1"
            (plain,) = [a for a in receiver.arrivals if a.body != b'{"n":0}']
            assert "traceparent" not in plain.headers
            ids.update((a.body, a.id) for a in receiver.arrivals)
            await wait_until(lambda: len(logged_runs(caplog, "callback.delivered")) == 2)

    asyncio.run(scenario())
    delivered = logged_runs(caplog, "callback.delivered")
    # no SDK: the message's own trace id, and no span of the run
    traced = delivered[ids[b'{"n":0}']]
    assert (traced["trace_id"], "span_id" in traced) == (TRACE_ID, False)
    assert "trace_id" not in delivered[ids[b'{"n":"plain"}']]


@pytest.mark.timeout(30)
def test_a_callback_run_is_a_process_span_whose_context_the_receiver_gets(
    spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")

    async def answer(arrival: Arrival, nth: int) -> int:
        return 500 if arrival.body == b'{"n":1}' else 200

    arrivals: list[Arrival] = []

    async def scenario() -> None:
        config = serve_config(
            next(memory_url(Path("."))), backend_options={"retry": RetryPolicy(max_attempts=1)}
        )
        async with dispatching(config, answer) as (state, _, receiver):
            await traced_callbacks(state, receiver.url(), 2)
            await wait_until(lambda: len(spans.named(f"process {QUEUE}")) == 3)
            arrivals.extend(receiver.arrivals)
            await wait_until(
                lambda: (
                    len(logged_runs(caplog, "callback.delivered")) == 2
                    and len(logged_runs(caplog, "callback.http_error")) == 1
                )
            )

    asyncio.run(scenario())
    runs = {f"{run.context.span_id:016x}": run for run in spans.named(f"process {QUEUE}")}
    lines = {
        **logged_runs(caplog, "callback.delivered"),
        **logged_runs(caplog, "callback.http_error"),
    }
    for arrival in arrivals:
        _, trace_id, span_id, _ = arrival.headers["traceparent"].split("-")
        line = lines[arrival.id]  # the log line of the run: its span's trace and span ids
        assert (line["trace_id"], line["span_id"]) == (trace_id, span_id)
        run = runs[span_id]  # the receiver's parent is the dispatcher's process span
        assert run.attributes["messaging.operation.name"] == "callback"
        assert run.attributes["messaging.message.id"] == arrival.id
        if arrival.body == b'{"n":"plain"}':  # put in this process: its send span's context
            (send,) = [s for s in spans.named(f"send {QUEUE}") if not s.links]
            assert run.parent.span_id == send.context.span_id  # type: ignore[union-attr]
            continue
        assert trace_id == TRACE_ID
        assert f"{run.parent.span_id:016x}" == "00f067aa0ba902b7"  # type: ignore[union-attr]
        if arrival.body == b'{"n":1}':
            assert run.status.status_code is StatusCode.ERROR
            assert run.attributes["error.type"] == "http_error"
            assert run.status.description.startswith("HTTP 500 from ")  # type: ignore[union-attr]
        else:
            assert run.status.status_code is StatusCode.UNSET
