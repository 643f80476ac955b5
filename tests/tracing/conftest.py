"""Fixtures of the tracing tests: an OpenTelemetry SDK tracer provider for one test.

The API's global provider can be set once per process, and a provider set for good
would trace every later test of the process (their messages would carry a
``traceparent``). So this process's global provider is a switch, set at the first use:
during a test that takes ``spans`` it hands out the tracers of that test's SDK provider
(an in-memory exporter); otherwise those of the API's no-op provider, which make no
span and write no header: as a process with no provider configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
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


def traceparent_of(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` of ``span`` as delayq writes it."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
