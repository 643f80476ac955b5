"""A Worker's metrics through OpenTelemetry when the process has a meter provider (an
SDK one with an in-memory reader in this process): the same counts as its Prometheus
page, under the names docs/guide/observability.md gives; the counts of a Worker that
stopped stay; without a provider that records, nothing is counted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from conformance.conftest import memory_url
from delayq import App, Discard, Worker
from delayq.durable.retry import RetryPolicy
from delayq.runtime.constants import LATENESS_BUCKETS, RUN_SECONDS_BUCKETS

from .conftest import Meters


def _failing(n: int) -> None:
    raise ValueError(n)


async def _discarding() -> None:
    raise Discard


def _app() -> tuple[App, Any, Any, Any]:
    """An app of three tasks of "orders": flaky (fails twice: dead), ok, gone
    (discarded)."""
    app = App(next(memory_url(Path("."))))
    twice = RetryPolicy(max_attempts=2, base=0.0, jitter=0.0)
    flaky = app.task(queue="orders", name="flaky", backoff=twice)(_failing)
    ok = app.task(queue="orders", name="ok")(lambda n: None)
    gone = app.task(queue="orders", name="gone")(_discarding)
    return app, flaky, ok, gone


def _serve(worker: Worker, until: Any) -> None:
    """Run ``worker`` until ``until()`` holds, then stop it."""

    async def main() -> None:
        serving = asyncio.create_task(worker.serve())
        for _ in range(1000):
            if until():
                break
            await asyncio.sleep(0.01)
        worker.stop()
        await serving

    asyncio.run(main())


def _points(meters: Meters, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
    metric = meters.collect()[name]
    return {
        tuple(sorted((point.attributes or {}).items())): point
        for point in metric.data.data_points  # type: ignore[union-attr]
    }


def test_a_workers_metrics_are_reported_as_on_its_prometheus_page(meters: Meters) -> None:
    app, flaky, ok, gone = _app()
    for n in range(3):
        ok.send(n)
    flaky.send(1)
    gone.send()
    worker = Worker(app)  # no metrics=True: the provider turns them on
    _serve(worker, lambda: worker.counts["succeeded"] == 3 and worker.counts["dead"] == 2)
    assert worker.metrics is not None
    page = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(worker.metrics.render().decode())
        for sample in family.samples
    }
    names = {name: meters.collect()[name] for name in meters.collect()}
    assert sorted(names) == [
        "delayq.acks", "delayq.backend.outages", "delayq.backend.up", "delayq.dead",
        "delayq.in_flight", "delayq.lateness", "delayq.nacks", "delayq.runs",
        "messaging.process.duration",
    ]  # fmt: skip
    runs = _points(meters, "delayq.runs")
    for task, outcome, count in (
        ("ok", "succeeded", 3), ("flaky", "failed", 1), ("flaky", "dead", 1),
        ("gone", "discarded", 1), ("ok", "failed", 0),
    ):  # fmt: skip
        key = (("messaging.delayq.outcome", outcome), ("messaging.delayq.task", task),
               ("messaging.destination.name", "orders"))  # fmt: skip
        assert runs[key].value == count
        labels = (("outcome", outcome), ("queue", "orders"), ("task", task))
        assert page[("delayq_runs_total", labels)] == count
    orders = (("messaging.destination.name", "orders"),)
    for name, prometheus, count in (
        ("delayq.acks", "delayq_acks_total", 3),
        ("delayq.nacks", "delayq_nacks_total", 3),
        ("delayq.dead", "delayq_dead_total", 2),
    ):
        assert _points(meters, name)[orders].value == count
        assert page[(prometheus, (("queue", "orders"),))] == count
    assert _points(meters, "delayq.in_flight")[()].value == 0
    assert _points(meters, "delayq.backend.up")[()].value == 1
    assert _points(meters, "delayq.backend.outages")[()].value == 0
    durations = _points(meters, "messaging.process.duration")
    lateness = _points(meters, "delayq.lateness")
    for task, count in (("ok", 3), ("flaky", 2), ("gone", 1)):
        key = (("messaging.delayq.task", task), ("messaging.destination.name", "orders"),
               ("messaging.operation.name", "process"), ("messaging.system", "delayq"))  # fmt: skip
        run, late = durations[key], lateness[key]
        assert (run.count, late.count) == (count, count)
        labels = (("queue", "orders"), ("task", task))
        assert page[("delayq_run_seconds_count", labels)] == count
        assert run.sum == page[("delayq_run_seconds_sum", labels)]
        assert tuple(run.explicit_bounds) == RUN_SECONDS_BUCKETS
        assert tuple(late.explicit_bounds) == LATENESS_BUCKETS
        assert late.min >= 0
    assert (
        sum(point.sum for point in lateness.values())
        == page[("delayq_lateness_seconds_sum", (("queue", "orders"),))]
    )


def test_the_counts_of_a_stopped_worker_stay_in_the_totals(meters: Meters) -> None:
    app, _, ok, _ = _app()
    ok.send(1)
    first = Worker(app)
    _serve(first, lambda: first.counts["succeeded"] == 1)
    ok.send(2)
    ok.send(3)
    second = Worker(app)
    _serve(second, lambda: second.counts["succeeded"] == 2)
    key = (("messaging.delayq.outcome", "succeeded"), ("messaging.delayq.task", "ok"),
           ("messaging.destination.name", "orders"))  # fmt: skip
    assert _points(meters, "delayq.runs")[key].value == 3
    assert _points(meters, "delayq.acks")[(("messaging.destination.name", "orders"),)].value == 3


def test_without_a_provider_that_records_a_worker_counts_nothing() -> None:
    app, _, ok, _ = _app()
    ok.send(1)
    worker = Worker(app)  # the API imported here, its provider the no-op one
    _serve(worker, lambda: worker.counts["succeeded"] == 1)
    assert worker.metrics is None
