"""Fixtures of the tracing tests: an OpenTelemetry SDK tracer provider for one test,
and an SDK meter provider for one test.

The API's global provider can be set once per process, and a provider set for good
would trace every later test of the process (their messages would carry a
``traceparent``). So this process's global provider is a switch, set at the first use:
during a test that takes ``spans`` it hands out the tracers of that test's SDK provider
(an in-memory exporter); otherwise those of the API's no-op provider, which make no
span and write no header: as a process with no provider configured. The global meter
provider is a switch in the same way: the meter of the test's SDK provider (an
in-memory reader) during a test that takes ``meters``, else the API's no-op one (a
Worker then counts nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from delayq.durable.tracing import provider_set


class _SwitchTracer(trace.Tracer):
    def __init__(self, switch: _Switch, name: str) -> None:
        self._switch = switch
        self._name = name

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._switch.target.get_tracer(self._name).start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._switch.target.get_tracer(self._name).start_as_current_span(*args, **kwargs)


class _Switch(trace.TracerProvider):
    def __init__(self) -> None:
        self.target: trace.TracerProvider = trace.NoOpTracerProvider()

    def get_tracer(self, name: str, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchTracer(self, name)


_SWITCH = _Switch()


@dataclass
class Spans:
    """The test's SDK provider and what it exported."""

    provider: TracerProvider
    exporter: InMemorySpanExporter

    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name == name]


@pytest.fixture
def spans() -> Iterator[Spans]:
    """An SDK tracer provider with an in-memory exporter, the global one for this test."""
    if trace.get_tracer_provider() is not _SWITCH:
        trace.set_tracer_provider(_SWITCH)
        assert trace.get_tracer_provider() is _SWITCH, "another global provider is set"
        provider_set()  # delayq asked within the last second may not know yet
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _SWITCH.target = provider
    try:
        yield Spans(provider, exporter)
    finally:
        _SWITCH.target = trace.NoOpTracerProvider()
        provider.shutdown()


class _SwitchMeters(metrics.MeterProvider):
    def __init__(self) -> None:
        self.target: metrics.MeterProvider = metrics.NoOpMeterProvider()

    def get_meter(self, name: str, *args: Any, **kwargs: Any) -> metrics.Meter:
        return self.target.get_meter(name, *args, **kwargs)

    @contextmanager
    def serving(self, provider: MeterProvider) -> Iterator[None]:
        """Hand out ``provider``'s meters meanwhile (the switch set as the global
        provider at the first use), then shut it down."""
        if metrics.get_meter_provider() is not self:
            metrics.set_meter_provider(self)
            assert metrics.get_meter_provider() is self, "another global provider is set"
        self.target = provider
        try:
            yield
        finally:
            self.target = metrics.NoOpMeterProvider()
            provider.shutdown()


_METERS = _SwitchMeters()


@dataclass
class Meters:
    """The test's SDK meter provider and its reader."""

    provider: MeterProvider
    reader: InMemoryMetricReader

    def collect(self) -> dict[str, Metric]:
        """What the provider has now, by instrument name."""
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }


@pytest.fixture
def meters() -> Iterator[Meters]:
    """An SDK meter provider with an in-memory reader, the global one for this test."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with _METERS.serving(provider):
        yield Meters(provider, reader)


def traceparent_of(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` of ``span`` as delayq writes it."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
