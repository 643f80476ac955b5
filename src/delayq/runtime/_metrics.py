"""The Worker's Prometheus metrics (``delayq worker --metrics-port``).

Counted on the Worker's loop as runs end, in plain lists and ints (no lock, no
metric object per series): :meth:`WorkerMetrics.ran` when a handler returned or
raised (its run time and its lateness: from the message's due time to the handler's
start), :meth:`WorkerMetrics.settled` when the backend took its outcome (or did
not), :meth:`WorkerMetrics.outage` from the consumer's
:class:`~delayq.runtime.outage.Outage`. What is read rather than counted (the
messages in flight) is read when a scrape asks.

A :meth:`~WorkerMetrics.snapshot` is plain data (lists, dicts, numbers): what a
child of ``delayq worker --processes`` sends its supervisor, which adds them up
(:func:`merge`, keeping what its dead children counted) and renders the one page
(:func:`render`). The text is Prometheus' exposition format 0.0.4, written here so
that a Worker needs no client library; the names, labels and lateness buckets are
those of ``delayq serve``'s metrics where they mean the same thing.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from time import monotonic, time
from typing import Any

from .constants import LATENESS_BUCKETS, RUN_SECONDS_BUCKETS

__all__ = [
    "BY_QUEUE",
    "HELP",
    "METRICS_CONTENT_TYPE",
    "OUTCOMES",
    "UNKNOWN_TASK",
    "WorkerMetrics",
    "by_queue",
    "merge",
    "render",
]

#: The Content-Type of the text exposition format.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The ``outcome`` label values of ``delayq_runs_total``.
OUTCOMES = (
    "succeeded",  # returned, and acked
    "retried",  # raised Retry: back for another attempt after its delay
    "failed",  # raised: back for another attempt after its backoff
    "timeout",  # ran past its timeout: back for another attempt after its backoff
    "dead",  # raised or timed out on its last attempt: dead
    "discarded",  # raised Discard, or an unknown task or arguments it cannot take: dead
    "skipped",  # a cron tick not run (catch_up)
    "lease_lost",  # its lease had run out: another consumer has it
    "unsettled",  # the backend did not take its ack or nack: it comes back
)
_INDEX = {outcome: index for index, outcome in enumerate(OUTCOMES)}

#: What each metric is, by its Prometheus name (its HELP line, the OpenTelemetry
#: instrument's description).
HELP = {
    "delayq_runs_total": "Runs of a task that ended, by outcome.",
    "delayq_acks_total": "Messages acked by this worker.",
    "delayq_nacks_total": "Messages nacked by this worker (retried or dead).",
    "delayq_dead_total": "Messages this worker sent to dead.",
    "delayq_run_seconds": "How long a task's handler ran.",
    "delayq_lateness_seconds":
        "From a message's due time to its delivery (here: its handler's start).",
    "delayq_in_flight":
        "Messages reserved by this worker, not settled yet (waiting, running, acking).",
    "delayq_backend_up": "1 while the backend answers, 0 during an outage.",
    "delayq_backend_outages_total": "Outages of the backend: times it stopped answering.",
}  # fmt: skip

#: The counters by queue: the outcomes that acked the message, nacked it and sent it
#: to dead.
BY_QUEUE = {
    "delayq_acks_total": ("succeeded", "skipped"),
    "delayq_nacks_total": ("retried", "failed", "timeout", "dead", "discarded"),
    "delayq_dead_total": ("dead", "discarded"),
}

#: The ``task`` label of a message whose task this worker does not know (its name is
#: not shown: any producer could make up names without end).
UNKNOWN_TASK = "<unknown>"

#: A snapshot: ``{"series": {queue: {task: [outcomes, run buckets, run sum, lateness
#: buckets, lateness sum]}}, "in_flight": n, "backend_up": 0 or 1, "outages": n}``.
Snapshot = dict[str, Any]


class Series:
    """What one task of one queue counted."""

    __slots__ = ("attributes", "late", "late_sum", "outcomes", "queue", "run", "run_sum", "task")

    def __init__(self, queue: str, task: str) -> None:
        self.queue = queue
        self.task = task
        self.attributes: dict[str, str] | None = None  # its OpenTelemetry attributes
        self.outcomes = [0] * len(OUTCOMES)
        self.run = [0] * (len(RUN_SECONDS_BUCKETS) + 1)  # the last: above every bound
        self.run_sum = 0.0
        self.late = [0] * (len(LATENESS_BUCKETS) + 1)
        self.late_sum = 0.0


class WorkerMetrics:
    """The metrics of one Worker; every method is cheap, runs on the Worker's loop and
    never raises."""

    def __init__(self) -> None:
        self._series: dict[str, dict[str, Series]] = {}
        self._in_flight: Callable[[], int] | None = None
        self.outages = 0
        """Outages begun (the backend stopped answering)."""
        self.backend_up = True
        """False during an outage."""
        # time() - monotonic(), read again once a second of monotonic time: a start's
        # wall time without two clock reads per run (a step of the wall clock shows
        # within a second).
        self._offset = time() - monotonic()
        self._offset_until = monotonic() + 1.0
        self.record: Callable[[Series, float, float], None] | None = None
        """Given each run's series, run time and lateness (seconds, 0 when on time)
        while OpenTelemetry metrics report this Worker's counts."""

    def watch(self, in_flight: Callable[[], int] | None) -> None:
        """Read ``in_flight()`` (messages reserved and not settled yet) at each scrape
        (None: 0, a worker that does not serve)."""
        self._in_flight = in_flight

    def _new(self, queue: str, task: str) -> Series:
        series = self._series.setdefault(queue, {})[task] = Series(queue, task)
        return series

    def ran(self, queue: str, task: str, due_at: int, started: float, took: float) -> None:
        """A handler ran for ``took`` seconds from ``started`` (``time.monotonic()``)
        on a message due at ``due_at`` (epoch ms): its run time and its lateness (never
        below 0, as ``delayq serve``'s)."""
        tasks = self._series.get(queue)
        series = None if tasks is None else tasks.get(task)
        if series is None:
            series = self._new(queue, task)
        self._observe(series, due_at, started, took)

    def _observe(self, series: Series, due_at: int, started: float, took: float) -> None:
        series.run[bisect_left(RUN_SECONDS_BUCKETS, took)] += 1
        series.run_sum += took
        if started > self._offset_until:
            self._offset = time() - monotonic()
            self._offset_until = started + 1.0
        late = started + self._offset - due_at / 1000.0
        if late > 0.0:
            series.late[bisect_left(LATENESS_BUCKETS, late)] += 1
            series.late_sum += late
        else:
            series.late[0] += 1
            late = 0.0
        if self.record is not None:
            self.record(series, took, late)

    def ended(
        self, queue: str, task: str, outcome: str, due_at: int, started: float, *, took: float
    ) -> None:
        """:meth:`ran` and :meth:`settled` in one call (the fast path's runs)."""
        tasks = self._series.get(queue)
        series = None if tasks is None else tasks.get(task)
        if series is None:
            series = self._new(queue, task)
        series.outcomes[_INDEX[outcome]] += 1
        self._observe(series, due_at, started, took)

    def settled(self, queue: str, task: str | None, outcome: str) -> None:
        """A run ended with ``outcome`` (one of :data:`OUTCOMES`); ``task`` None: not
        known."""
        if task is None:
            task = UNKNOWN_TASK
        tasks = self._series.get(queue)
        series = None if tasks is None else tasks.get(task)
        if series is None:
            series = self._new(queue, task)
        series.outcomes[_INDEX[outcome]] += 1

    def outage(self, kind: str | None) -> None:
        """An :class:`~delayq.runtime.outage.Outage`'s ``on_change``: a step of an
        outage (``kind``, the error's), or its end (None)."""
        if kind is None:
            self.backend_up = True
        elif self.backend_up:
            self.backend_up = False
            self.outages += 1

    def snapshot(self) -> Snapshot:
        """Everything counted so far, and the gauges now, as plain data."""
        in_flight = self._in_flight
        return {
            "series": {
                queue: {
                    task: [list(s.outcomes), list(s.run), s.run_sum, list(s.late), s.late_sum]
                    for task, s in tasks.items()
                }
                for queue, tasks in self._series.items()
            },
            "in_flight": 0 if in_flight is None else in_flight(),
            "backend_up": int(self.backend_up),
            "outages": self.outages,
        }

    def render(self) -> bytes:
        """The text exposition of :meth:`snapshot`."""
        return render(self.snapshot())


def merge(snapshots: Iterable[Snapshot], *, gauges: bool = True) -> Snapshot:
    """The sum of ``snapshots`` (several processes' counts as one): the counters and
    histograms added up; ``in_flight`` added, ``backend_up`` 1 only when every one's
    is (``gauges`` False: both left at 0 and 1, for the counts of processes gone)."""
    series: dict[str, dict[str, list[Any]]] = {}
    in_flight, backend_up, outages = 0, 1, 0
    for snapshot in snapshots:
        for queue, tasks in snapshot["series"].items():
            into = series.setdefault(queue, {})
            for task, counted in tasks.items():
                total = into.get(task)
                if total is None:
                    into[task] = [list(part) if index in (0, 1, 3) else part
                                  for index, part in enumerate(counted)]  # fmt: skip
                    continue
                for index in (0, 1, 3):
                    total[index] = [
                        a + b for a, b in zip(total[index], counted[index], strict=True)
                    ]
                total[2] += counted[2]
                total[4] += counted[4]
        outages += snapshot["outages"]
        if gauges:
            in_flight += snapshot["in_flight"]
            backend_up = min(backend_up, snapshot["backend_up"])
    return {"series": series, "in_flight": in_flight, "backend_up": backend_up, "outages": outages}


def by_queue(snapshot: Snapshot, name: str) -> dict[str, int]:
    """One of :data:`BY_QUEUE`'s counters in ``snapshot``: its count by queue."""
    indexes = [_INDEX[outcome] for outcome in BY_QUEUE[name]]
    return {
        queue: sum(counted[0][index] for counted in tasks.values() for index in indexes)
        for queue, tasks in snapshot["series"].items()
    }


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample's value as Prometheus writes it (``1.0``, ``+Inf``)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _histogram(
    lines: list[str], name: str, labels: str, bounds: tuple[float, ...], counted: list[Any]
) -> None:
    """The lines of one histogram's series: ``counted`` is its bucket counts (the last
    above every bound), then the sum of what it observed."""
    counts, total = counted
    running = 0
    for bound, count in zip((*bounds, math.inf), counts, strict=True):
        running += count
        lines.append(f'{name}_bucket{{{labels},le="{_number(bound)}"}} {running}.0')
    lines.append(f"{name}_count{{{labels}}} {running}.0")
    lines.append(f"{name}_sum{{{labels}}} {_number(total)}")


def _head(lines: list[str], name: str, kind: str) -> None:
    lines.append(f"# HELP {name} {HELP[name]}")
    lines.append(f"# TYPE {name} {kind}")


def render(snapshot: Snapshot) -> bytes:
    """The text exposition (format 0.0.4) of a :meth:`WorkerMetrics.snapshot` or of a
    :func:`merge` of several."""
    series: dict[str, dict[str, list[Any]]] = snapshot["series"]
    lines: list[str] = []
    _head(lines, "delayq_runs_total", "counter")
    for queue, tasks in sorted(series.items()):
        for task, counted in sorted(tasks.items()):
            for outcome, count in zip(OUTCOMES, counted[0], strict=True):
                labels = f'queue="{_label(queue)}",task="{_label(task)}",outcome="{outcome}"'
                lines.append(f"delayq_runs_total{{{labels}}} {count}.0")
    for name in BY_QUEUE:
        _head(lines, name, "counter")
        for queue, count in sorted(by_queue(snapshot, name).items()):
            lines.append(f'{name}{{queue="{_label(queue)}"}} {count}.0')
    _head(lines, "delayq_run_seconds", "histogram")
    for queue, tasks in sorted(series.items()):
        for task, counted in sorted(tasks.items()):
            labels = f'queue="{_label(queue)}",task="{_label(task)}"'
            _histogram(lines, "delayq_run_seconds", labels, RUN_SECONDS_BUCKETS, counted[1:3])
    _head(lines, "delayq_lateness_seconds", "histogram")
    for queue, tasks in sorted(series.items()):
        late = [
            sum(column) for column in zip(*(counted[3] for counted in tasks.values()), strict=True)
        ]
        total = sum(counted[4] for counted in tasks.values())
        labels = f'queue="{_label(queue)}"'
        _histogram(lines, "delayq_lateness_seconds", labels, LATENESS_BUCKETS, [late, total])
    _head(lines, "delayq_in_flight", "gauge")
    lines.append(f"delayq_in_flight {snapshot['in_flight']}.0")
    _head(lines, "delayq_backend_up", "gauge")
    lines.append(f"delayq_backend_up {snapshot['backend_up']}.0")
    _head(lines, "delayq_backend_outages_total", "counter")
    lines.append(f"delayq_backend_outages_total {snapshot['outages']}.0")
    return ("\n".join(lines) + "\n").encode()
