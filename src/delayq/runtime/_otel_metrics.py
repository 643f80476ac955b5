"""The Worker's metrics through the OpenTelemetry metrics API, imported by a Worker's
start only once the process has imported ``opentelemetry.metrics``.

The counts are those of :class:`~._metrics.WorkerMetrics`, read when the provider
collects: the counters and gauges are asynchronous instruments whose callbacks read
a snapshot, so a run costs them nothing. The API has no asynchronous histogram, so
the run time and the lateness are recorded as each run ends, where the Prometheus
histograms count it (:attr:`~._metrics.WorkerMetrics.record`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeter, Observation

from .. import __version__
from ._metrics import BY_QUEUE, HELP, OUTCOMES, Series, Snapshot, WorkerMetrics, by_queue, merge
from .constants import LATENESS_BUCKETS, RUN_SECONDS_BUCKETS

__all__ = ["NAMES", "recording", "report"]

#: The instruments' names, by the Prometheus names of the same metrics: the messaging
#: semantic conventions' where they name the same thing, else delayq's (an
#: OpenTelemetry Prometheus exporter adds the unit and ``_total`` back).
NAMES = {
    "delayq_runs_total": "delayq.runs",
    "delayq_acks_total": "delayq.acks",
    "delayq_nacks_total": "delayq.nacks",
    "delayq_dead_total": "delayq.dead",
    "delayq_run_seconds": "messaging.process.duration",
    "delayq_lateness_seconds": "delayq.lateness",
    "delayq_in_flight": "delayq.in_flight",
    "delayq_backend_up": "delayq.backend.up",
    "delayq_backend_outages_total": "delayq.backend.outages",
}
#: The attributes of the queue, the task and the outcome (the spans' names).
QUEUE, TASK, OUTCOME = (
    "messaging.destination.name",
    "messaging.delayq.task",
    "messaging.delayq.outcome",
)

_Read = Callable[[CallbackOptions], Iterable[Observation]]


def recording() -> Meter | None:
    """delayq's meter of the global provider, or None when it records nothing: none
    set (the API's proxy), the API's no-op provider, or a provider whose meters are
    the API's no-op one (the SDK's with ``OTEL_SDK_DISABLED``)."""
    provider = metrics.get_meter_provider()
    if type(provider).__module__.startswith("opentelemetry.metrics"):
        return None  # the API's own classes: its proxy (none set) or its no-op one
    meter = provider.get_meter("delayq", __version__)
    return None if isinstance(meter, NoOpMeter) else meter


class _Reporter:
    """The instruments of one meter, and the Workers whose counts they report."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.live: list[WorkerMetrics] = []
        self.gone: Snapshot = merge([])  # the counts of the Workers stopped
        self._run = meter.create_histogram(
            NAMES["delayq_run_seconds"],
            unit="s",
            description=HELP["delayq_run_seconds"],
            explicit_bucket_boundaries_advisory=list(RUN_SECONDS_BUCKETS),
        )
        self._late = meter.create_histogram(
            NAMES["delayq_lateness_seconds"],
            unit="s",
            description=HELP["delayq_lateness_seconds"],
            explicit_bucket_boundaries_advisory=list(LATENESS_BUCKETS),
        )
        counter = meter.create_observable_counter
        for name, unit, make, read in (
            ("delayq_runs_total", "{run}", counter, self._runs),
            *((name, "{message}", counter, self._by_queue(name)) for name in BY_QUEUE),
            ("delayq_in_flight", "{message}", meter.create_observable_up_down_counter,
             self._gauge("in_flight")),
            ("delayq_backend_up", "1", meter.create_observable_gauge, self._gauge("backend_up")),
            ("delayq_backend_outages_total", "{outage}", counter, self._gauge("outages")),
        ):  # fmt: skip
            make(NAMES[name], callbacks=[read], unit=unit, description=HELP[name])

    def record(self, series: Series, took: float, late: float) -> None:
        """A run's time and lateness (:attr:`WorkerMetrics.record`)."""
        attributes = series.attributes
        if attributes is None:
            attributes = series.attributes = {
                "messaging.system": "delayq",
                "messaging.operation.name": "process",
                QUEUE: series.queue,
                TASK: series.task,
            }
        self._run.record(took, attributes)
        self._late.record(late, attributes)

    def _snapshot(self) -> Snapshot:
        return merge([self.gone, *(worker.snapshot() for worker in self.live)])

    def _runs(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(count, {QUEUE: queue, TASK: task, OUTCOME: outcome})
            for queue, tasks in self._snapshot()["series"].items()
            for task, counted in tasks.items()
            for outcome, count in zip(OUTCOMES, counted[0], strict=True)
        ]

    def _by_queue(self, name: str) -> _Read:
        def read(options: CallbackOptions) -> Iterable[Observation]:
            counts = by_queue(self._snapshot(), name)
            return [Observation(count, {QUEUE: queue}) for queue, count in counts.items()]

        return read

    def _gauge(self, key: str) -> _Read:
        def read(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(self._snapshot()[key])]

        return read


#: The reporter of the last meter seen (the global provider is set once a process).
_reporter: _Reporter | None = None


def report(meter: Meter, worker: WorkerMetrics) -> Callable[[], None]:
    """Report ``worker``'s counts through ``meter`` from now on; what it returns, called
    as the Worker stops, leaves them in the totals, as counted then."""
    global _reporter
    reporter = _reporter
    if reporter is None or reporter.meter is not meter:
        reporter = _reporter = _Reporter(meter)
    reporter.live.append(worker)
    worker.record = reporter.record

    def stop() -> None:
        worker.record = None
        reporter.live.remove(worker)
        reporter.gone = merge([reporter.gone, worker.snapshot()], gauges=False)

    return stop
