"""Prometheus metrics of one server, on a registry of its own (so several servers,
or tests, in one process never share counters).

Counters and the lateness histogram are fed as things happen; the per-state message
gauges are refreshed from ``stats()`` just before each scrape (:meth:`Metrics.render`),
and ``delayq_backend_up`` says whether that read succeeded: during an outage a scrape
still answers, without the message gauges.
Every series is labelled by queue, and a scrape keeps only the series of the queues it
shows: those that hold messages and the configured ones. A queue seen in neither of
two scrapes in a row loses its series (counters start again from 0 if it comes back,
which Prometheus reads as a reset), so queue names that come and go, or that were
only ever asked about, leave nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from ..durable.message import Stats
from ..runtime.constants import LATENESS_BUCKETS

__all__ = ["CALLBACK_OUTCOMES", "Metrics"]

#: The ``outcome`` label values of ``delayq_callbacks_total``.
CALLBACK_OUTCOMES = ("delivered", "http_error", "timeout", "connection_error", "refused")


class Metrics:
    """The server's metrics; every method is cheap and never raises."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.messages = Gauge(
            "delayq_messages",
            "Messages per queue and state, read from the backend at scrape time.",
            ["queue", "state"],
            registry=self.registry,
        )
        self.backend_up = Gauge(
            "delayq_backend_up",
            "1 when the backend answered this scrape's stats, else 0 (the message gauges "
            "are then left out).",
            registry=self.registry,
        )
        self.outages = Counter(
            "delayq_backend_outages",
            "Outages of the backend: times it stopped answering (as the Worker's).",
            registry=self.registry,
        )
        self.long_polls = Gauge(
            "delayq_long_polls",
            "Reserves waiting for a message (long polls) on this server now.",
            registry=self.registry,
        )
        self.puts = Counter(
            "delayq_puts", "Messages put through this server.", ["queue"], registry=self.registry
        )
        self.acks = Counter(
            "delayq_acks", "Messages acked through this server.", ["queue"], registry=self.registry
        )
        self.nacks = Counter(
            "delayq_nacks",
            "Messages nacked through this server.",
            ["queue"],
            registry=self.registry,
        )
        self.dead = Counter(
            "delayq_dead",
            "Messages this server sent to dead (nack or callback out of attempts).",
            ["queue"],
            registry=self.registry,
        )
        self.lateness = Histogram(
            "delayq_lateness_seconds",
            "From a message's due time to its delivery (reserve over HTTP or callback sent).",
            ["queue"],
            buckets=LATENESS_BUCKETS,  # the Worker's too: one histogram adds up
            registry=self.registry,
        )
        self.callbacks = Counter(
            "delayq_callbacks",
            "Callback requests by outcome.",
            ["queue", "outcome"],
            registry=self.registry,
        )
        # The series fed as things happen, with their label names (queue first).
        self._by_queue: list[tuple[MetricWrapperBase, tuple[str, ...]]] = [
            (self.puts, ("queue",)),
            (self.acks, ("queue",)),
            (self.nacks, ("queue",)),
            (self.dead, ("queue",)),
            (self.lateness, ("queue",)),
            (self.callbacks, ("queue", "outcome")),
        ]
        self._absent: set[str] = set()

    def observe_lateness(self, queue: str, due_at_ms: int, delivered_at_ms: float) -> None:
        """Record one delivery ``delivered_at_ms - due_at_ms`` late (never below 0)."""
        self.lateness.labels(queue).observe(max(0.0, (delivered_at_ms - due_at_ms) / 1000.0))

    def observe_callback(self, queue: str, outcome: str) -> None:
        """Count one callback attempt; ``outcome`` is one of :data:`CALLBACK_OUTCOMES`."""
        if outcome not in CALLBACK_OUTCOMES:
            raise ValueError(f"unknown callback outcome {outcome!r}")
        self.callbacks.labels(queue, outcome).inc()

    def render(self, stats: Mapping[str, Stats] | None, long_polls: int = 0) -> bytes:
        """The text exposition, with the message gauges set from ``stats`` (every
        queue to show), ``delayq_long_polls`` from ``long_polls``, and the series of
        queues gone since the last scrape dropped.

        ``stats`` None means the backend did not answer: ``delayq_backend_up`` is 0,
        the message gauges are left out and every other series is kept as it is (a
        counter dropped during an outage would read as a reset)."""
        self.messages.clear()
        self.backend_up.set(0 if stats is None else 1)
        self.long_polls.set(long_polls)
        if stats is not None:
            for queue, snapshot in stats.items():
                for state in ("scheduled", "ready", "active", "dead"):
                    self.messages.labels(queue, state).set(getattr(snapshot, state))
            self._drop_gone(stats.keys())
        return generate_latest(self.registry)

    def _drop_gone(self, shown: Iterable[str]) -> None:
        """Remove the series of queues absent from ``shown`` and from the previous
        scrape's: a queue first used between the stats of a scrape and its rendering
        keeps what it counted, since the next scrape shows it."""
        keep = set(shown)
        absent: set[str] = set()
        for metric, names in self._by_queue:
            series = {
                tuple(sample.labels[name] for name in names)
                for family in metric.collect()
                for sample in family.samples
            }
            for labels in series:
                if labels[0] in keep:
                    continue
                absent.add(labels[0])
                if labels[0] in self._absent:
                    metric.remove(*labels)
        self._absent = absent
