"""A put carries the caller's trace context to the run of its message, on every face of
the Python API, and a failing run is recorded (an SDK provider in this process)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from opentelemetry.trace import SpanKind, StatusCode

from conformance.conftest import memory_url
from delayq import App, AsyncQueue, Queue, Worker
from delayq.durable.constants import MAX_MESSAGE_HEADERS
from delayq.durable.tracing import carried, with_context

from .conftest import Spans, traceparent_of

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_each_face_writes_its_send_span_and_the_run_is_its_child(spans: Spans) -> None:
    url = next(memory_url(Path(".")))
    app = App(url)
    ran: list[str] = []

    @app.task(queue="jobs")
    def work(n: int) -> None:
        ran.append(str(n))

    @app.task(queue="jobs")
    async def fail(n: int) -> None:
        raise ValueError(f"boom {n}")

    caller = spans.provider.get_tracer("test")
    with caller.start_as_current_span("request") as request:
        one = work.send(1)
        many = app.send_many([work.message(2), work.message(3)])

        async def send_async() -> list[str]:
            return [
                await fail.send_async(4),
                *(
                    await AsyncQueue(url, name="jobs").put_many(
                        [{"payload": {"task": "work", "args": [5]}}]
                    )
                ),
            ]

        others = asyncio.run(send_async())
    queue = Queue(url, name="jobs")
    ids = [one, *many, *others]
    headers = {id: queue.get(id).headers for id in ids}  # type: ignore[union-attr]
    trace_id = request.get_span_context().trace_id

    singles = {
        span.attributes["messaging.message.id"]: span
        for span in spans.named("send jobs")
        if span.attributes["messaging.operation.name"] == "put"
    }
    assert set(singles) == {one, others[0]}  # send and send_async
    for id, send in singles.items():
        assert send.kind is SpanKind.PRODUCER  # its context is the message's
        assert send.parent.span_id == request.get_span_context().span_id  # type: ignore[union-attr]
        assert send.attributes["messaging.system"] == "delayq"
        assert send.attributes["messaging.destination.name"] == "jobs"
        assert send.attributes["messaging.operation.type"] == "send"
        assert headers[id] == {"traceparent": traceparent_of(send)}
    creates = {span.attributes["messaging.message.id"]: span for span in spans.named("create jobs")}
    assert set(creates) == {*many, others[1]}  # one per message of a put_many
    for id, create in creates.items():
        assert create.kind is SpanKind.PRODUCER
        assert create.attributes["messaging.operation.type"] == "create"
        assert headers[id] == {"traceparent": traceparent_of(create)}
    batch = [
        span
        for span in spans.named("send jobs")
        if span.attributes.get("messaging.batch.message_count")
    ]
    assert sorted(span.attributes["messaging.batch.message_count"] for span in batch) == [1, 2]
    for span in batch:
        assert span.kind is SpanKind.CLIENT
        assert {link.context.span_id for link in span.links} <= {
            c.context.span_id for c in creates.values()
        }

    asyncio.run(Worker(app, concurrency=2).burst())
    assert sorted(ran) == ["1", "2", "3", "5"]
    runs = {span.attributes["messaging.message.id"]: span for span in spans.named("process jobs")}
    assert set(runs) == set(ids)
    for id, run in runs.items():
        creation = headers[id]["traceparent"]
        assert run.kind is SpanKind.CONSUMER
        assert run.context.trace_id == trace_id  # one trace, from the request to the run
        assert f"{run.parent.span_id:016x}" == creation.split("-")[2]  # type: ignore[union-attr]
        assert [f"{link.context.span_id:016x}" for link in run.links] == [creation.split("-")[2]]
        assert run.attributes["messaging.operation.type"] == "process"
        assert run.attributes["messaging.delayq.message.attempt"] == 1
        assert run.attributes["messaging.delayq.message.lateness"] >= 0
        assert run.attributes["messaging.delayq.message.due_at"].endswith("Z")
    failed = runs[others[0]]
    assert failed.attributes["messaging.delayq.task"] == "fail"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ValueError"
    assert [event.name for event in failed.events] == ["exception"]
    assert failed.events[0].attributes["exception.message"] == "boom 4"  # type: ignore[index]
    assert runs[one].status.status_code is StatusCode.UNSET


def test_a_given_creation_context_is_kept_and_linked(spans: Spans) -> None:
    url = next(memory_url(Path(".")))
    queue = Queue(url, name="jobs")
    id = queue.put(1, headers={"traceparent": PARENT, "tracestate": "k=v"})
    assert queue.get(id).headers == {"traceparent": PARENT, "tracestate": "k=v"}  # type: ignore[union-attr]
    (send,) = spans.named("send jobs")
    assert send.kind is SpanKind.CLIENT  # the message's creation context is the caller's
    assert [f"{link.context.span_id:016x}" for link in send.links] == ["b7ad6b7169203331"]

    def handler(msg: object) -> None:
        pass

    asyncio.run(Worker(AsyncQueue(url, name="jobs"), handler).burst())
    (run,) = spans.named("process jobs")
    assert f"{run.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{run.parent.span_id:016x}" == "b7ad6b7169203331"  # type: ignore[union-attr]
    assert "messaging.delayq.task" not in run.attributes  # a handler, not a task


def test_no_provider_writes_nothing() -> None:
    """With no SDK configured (this process's provider hands out no-op tracers), a put
    writes no trace header and a run makes no span."""
    url = next(memory_url(Path(".")))
    queue = Queue(url, name="jobs")
    id = queue.put(1)
    ids = queue.put_many([{"payload": 2}])
    assert [queue.get(i).headers for i in [id, *ids]] == [{}, {}]  # type: ignore[union-attr]


def test_a_trace_context_never_fails_a_put_nor_passes_the_header_limits() -> None:
    full = {f"h{i}": "v" for i in range(MAX_MESSAGE_HEADERS)}
    assert not with_context(full, {"traceparent": PARENT})
    assert len(full) == MAX_MESSAGE_HEADERS
    room_for_one = {f"h{i}": "v" for i in range(MAX_MESSAGE_HEADERS - 1)}
    assert with_context(room_for_one, {"traceparent": PARENT, "tracestate": "k=v"})
    assert room_for_one["traceparent"] == PARENT
    assert "tracestate" not in room_for_one  # dropped first, as a propagator may
    given = {"TraceParent": "00-" + "1" * 32 + "-" + "2" * 16 + "-00"}
    assert not with_context(given, {"traceparent": PARENT})  # the caller's own is kept


def test_only_a_valid_w3c_traceparent_is_carried() -> None:
    assert carried(PARENT, "a=1,b=2") == {"traceparent": PARENT, "tracestate": "a=1,b=2"}
    assert carried(f" {PARENT} ") == {"traceparent": PARENT}
    for bad in (
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero parent id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # version ff
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # upper case
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-00",  # 00 has 4 fields
        PARENT + "\n",
    ):
        assert carried(bad, "a=1") == {}, bad
    assert carried("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-ab") != {}
    assert carried(PARENT, "a=\u00e9") == {"traceparent": PARENT}  # not ASCII: left out
    assert carried(PARENT, "a" * 513) == {"traceparent": PARENT}


def test_a_postgres_enqueue_in_the_caller_transaction_writes_its_send_span(
    spans: Spans, tmp_path: Path
) -> None:
    import psycopg  # noqa: PLC0415 (optional: postgres_url skips without it)

    from conformance.conftest import postgres_url  # noqa: PLC0415
    from delayq.backends.postgres import enqueue  # noqa: PLC0415

    for url in postgres_url(tmp_path):
        base, _, schema = url.rpartition("schema=")
        with psycopg.connect(base.rstrip("?&")) as conn, conn.transaction():
            id = enqueue(conn, "jobs", 1, schema=schema)
        (send,) = spans.named("send jobs")
        assert send.attributes["messaging.message.id"] == id
        msg = Queue(url, name="jobs").get(id)
        assert msg is not None
        assert msg.headers == {"traceparent": traceparent_of(send)}
