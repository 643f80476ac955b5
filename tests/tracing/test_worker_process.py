"""One trace across processes: a put in this process (an SDK provider), its run in a
``delayq worker`` process whose app module configures an SDK exporting to a file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from delayq import App, Queue

from .conftest import Spans, traceparent_of

APP = """
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from delayq import App

provider = TracerProvider()
provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(
            out=open(os.environ["SPANS"], "a", buffering=1),
            formatter=lambda span: span.to_json(indent=None) + "\\n",
        )
    )
)
trace.set_tracer_provider(provider)
app = App()  # $DELAYQ_URL


@app.task(queue="jobs")
def work(n):
    with trace.get_tracer("app").start_as_current_span("inside work"):
        pass


@app.task(queue="jobs", max_attempts=1)
async def fail(n):
    raise ValueError(f"boom {n}")
"""


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_worker_process_continues_the_trace_of_the_put(spans: Spans, tmp_path: Path) -> None:
    (tmp_path / "traced_app.py").write_text(textwrap.dedent(APP))
    out = tmp_path / "spans.jsonl"
    out.touch()
    url = f"sqlite:///{tmp_path / 'q.db'}"
    app = App(url)
    work = app.task(queue="jobs", name="work")(lambda n: None)
    fail = app.task(queue="jobs", name="fail")(lambda n: None)
    with spans.provider.get_tracer("test").start_as_current_span("request"):
        ok_id = work.send(1)
        fail_id = fail.send(2)
    sends = {span.attributes["messaging.message.id"]: span for span in spans.named("send jobs")}
    env = {key: value for key, value in os.environ.items() if key != "FORCE_COLOR"}
    env.update(DELAYQ_URL=url, SPANS=str(out))
    worker = subprocess.Popen(
        [sys.executable, "-m", "delayq.cli", "worker", "traced_app:app", "--grace", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 45
        while len([s for s in read_spans(out) if s["name"] == "process jobs"]) < 2:
            assert worker.poll() is None, worker.communicate()[1]
            assert time.monotonic() < deadline, read_spans(out)
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    runs = {
        s["attributes"]["messaging.message.id"]: s
        for s in read_spans(out)
        if s["name"] == "process jobs"
    }
    for id in (ok_id, fail_id):
        send, run = sends[id], runs[id]
        _, trace_id, span_id, _ = traceparent_of(send).split("-")
        assert run["context"]["trace_id"] == f"0x{trace_id}"  # one trace
        assert run["parent_id"] == f"0x{span_id}"  # the run is the send's child...
        assert [link["context"]["span_id"] for link in run["links"]] == [
            f"0x{span_id}"
        ]  # and linked
        assert run["kind"] == "SpanKind.CONSUMER"
        attributes = run["attributes"]
        assert attributes["messaging.system"] == "delayq"
        assert attributes["messaging.destination.name"] == "jobs"
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["messaging.delayq.message.attempt"] == 1
        assert attributes["messaging.delayq.message.lateness"] >= 0
    assert runs[ok_id]["attributes"]["messaging.delayq.task"] == "work"
    assert runs[ok_id]["status"]["status_code"] == "UNSET"
    (inside,) = [s for s in read_spans(out) if s["name"] == "inside work"]
    assert inside["parent_id"] == runs[ok_id]["context"]["span_id"]  # the handler's own spans
    failed = runs[fail_id]
    assert failed["status"]["status_code"] == "ERROR"
    assert failed["status"]["description"] == "ValueError: boom 2"
    assert failed["attributes"]["error.type"] == "ValueError"
    assert [event["name"] for event in failed["events"]] == ["exception"]
    assert Queue(url, name="jobs").dead()[0].id == fail_id
