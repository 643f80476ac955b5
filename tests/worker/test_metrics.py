"""``Worker(metrics=True)``: the metrics a Python user scrapes from a Worker of their
own (``worker.metrics.render()``), counted on the same runs as ``delayq worker
--metrics-port`` (tests/e2e/test_worker_metrics.py); the supervisor's sum of its
children's counts; the one lateness histogram ``delayq serve`` shares."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from delayq import Discard
from delayq.durable.retry import RetryPolicy
from delayq.runtime import App, Worker
from delayq.runtime._metrics import WorkerMetrics, merge, render
from delayq.server._metrics import Metrics

from ._helpers import memory_url


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def test_a_workers_metrics_count_its_runs_and_render_as_prometheus_text() -> None:
    app = App(memory_url())

    @app.task(queue="orders", backoff=RetryPolicy(max_attempts=2, base=0.0, jitter=0.0))
    def flaky(n: int) -> None:
        raise ValueError(n)

    @app.task(queue="orders")
    def ok(n: int) -> None:
        pass

    @app.task(queue="orders")
    def gone() -> None:
        raise Discard

    for n in range(3):
        ok.send(n)
    flaky.send(1)
    gone.send()
    worker = Worker(app, metrics=True)
    asyncio.run(worker.burst())
    assert worker.metrics is not None
    samples = _samples(worker.metrics.render())
    assert worker.metrics.render() == render(merge([worker.metrics.snapshot()]))

    def runs(task: str, outcome: str) -> float:
        labels = (("outcome", outcome), ("queue", "orders"), ("task", task))
        return samples[("delayq_runs_total", labels)]

    assert (runs("ok", "succeeded"), runs("flaky", "failed"), runs("flaky", "dead")) == (3, 1, 1)
    assert runs("gone", "discarded") == 1
    orders = (("queue", "orders"),)
    assert samples[("delayq_acks_total", orders)] == 3
    assert samples[("delayq_nacks_total", orders)] == 3
    assert samples[("delayq_dead_total", orders)] == 2
    assert samples[("delayq_lateness_seconds_count", orders)] == 6
    assert samples[("delayq_run_seconds_count", (*orders, ("task", "ok")))] == 3
    assert samples[("delayq_in_flight", ())] == 0
    assert samples[("delayq_backend_up", ())] == 1
    assert Worker(app).metrics is None  # off unless asked for
    with pytest.raises(TypeError, match="metrics must be True or False"):
        Worker(app, metrics=1)  # type: ignore[arg-type]
    app.close()


def _one_run() -> WorkerMetrics:
    """The metrics of a Worker that ran one task ``ok`` of queue ``q``."""
    app = App(memory_url())

    @app.task(queue="q")
    def ok() -> None:
        pass

    ok.send()
    worker = Worker(app, metrics=True)
    asyncio.run(worker.burst())
    app.close()
    assert worker.metrics is not None
    return worker.metrics


def test_merge_adds_children_up_and_keeps_the_gauges_of_the_living() -> None:
    metrics = _one_run()
    one = metrics.snapshot()
    metrics.outage("ConnectionError")
    down = metrics.snapshot()
    gone = merge([one], gauges=False)
    total = _samples(render(merge([gone, one, down])))
    labels = (("outcome", "succeeded"), ("queue", "q"), ("task", "ok"))
    assert total[("delayq_runs_total", labels)] == 3
    assert total[("delayq_lateness_seconds_count", (("queue", "q"),))] == 3
    assert total[("delayq_backend_up", ())] == 0  # one child is in an outage
    assert total[("delayq_backend_outages_total", ())] == 1


def test_the_worker_and_serve_share_the_lateness_buckets() -> None:
    metrics = Metrics()
    metrics.observe_lateness("q", 0, 0.0)
    served = _samples(metrics.render(None))
    ran = _samples(_one_run().render())

    def bounds(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> list[str]:
        return [
            dict(labels)["le"]
            for name, labels in samples
            if name == "delayq_lateness_seconds_bucket"
        ]

    assert bounds(ran) == bounds(served)
    assert bounds(ran)[0] == "0.0001"
