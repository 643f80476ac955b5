"""The OpenTelemetry side of :mod:`.tracing`, imported only once the process has
imported the OpenTelemetry API: the spans, by the messaging semantic conventions.

* a put: one ``send {queue}`` span around the backend's call. A single put's span is
  the message's creation context (kind PRODUCER, written into its headers); a
  ``put_many`` makes a ``create {queue}`` span (PRODUCER) per message, whose context
  goes into that message, and its ``send`` span (CLIENT) links to them. A message
  whose headers carry a ``traceparent`` already keeps it, and the ``send`` span links
  to it.
* a run: one ``process {queue}`` span (CONSUMER), a child of the message's creation
  context with a link to it as well.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NoOpTracer,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ._w3c import TRACEPARENT, with_context
from .message import Message, PutRequest

__all__ = [
    "RUN_IDS",
    "context_of",
    "failed",
    "ids_of",
    "process_span",
    "recheck",
    "send_span",
    "traced",
    "tracer",
]

_PROPAGATOR = TraceContextTextMapPropagator()
_SYSTEM = "delayq"
#: The global provider's tracer, once a provider is set: the API sets it once for
#: good, so it is asked once (None: that provider makes no spans).
_found: tuple[Tracer | None] | None = None
#: While none is set, the API's answer is asked again after this many seconds (its
#: get_tracer_provider() then reads the environment: microseconds a call).
RECHECK = 1.0
_none_until = -math.inf


def tracer() -> Tracer | None:
    """delayq's tracer of the global provider, or None when that provider makes no
    spans: none set yet (the API's proxy: asked again every RECHECK seconds, or at
    once after :func:`recheck`), the API's no-op provider, or a provider whose tracers
    are the API's no-op one (the SDK's with ``OTEL_SDK_DISABLED``)."""
    global _found, _none_until
    found = _found
    if found is not None:
        return found[0]
    now = time.monotonic()
    if now < _none_until:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):
        _none_until = now + RECHECK
        return None
    made: Tracer | None = None
    if not isinstance(provider, NoOpTracerProvider):
        made = provider.get_tracer("delayq", __version__)
        if isinstance(made, NoOpTracer):
            made = None
    _found = (made,)
    return made


def recheck() -> None:
    """Ask the API for its provider at the next span instead of within RECHECK."""
    global _none_until
    _none_until = -math.inf


def _given(headers: Mapping[str, str]) -> SpanContext | None:
    """The valid creation context a message's headers carry, else None."""
    if TRACEPARENT not in headers:
        return None
    context = trace.get_current_span(_PROPAGATOR.extract(headers)).get_span_context()
    return context if context.is_valid else None


def context_of(span: Span) -> dict[str, str]:
    """``span``'s context as ``traceparent`` (and ``tracestate``) headers."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def _write(span: Span, request: PutRequest) -> None:
    headers = request.headers
    if isinstance(headers, dict):  # as the facade builds it: the request's own copy
        with_context(headers, context_of(span))


def _failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    text = str(exc)
    failed(
        span,
        type(exc).__qualname__,
        f"{type(exc).__name__}: {text}" if text else type(exc).__name__,
    )


def failed(span: Span, kind: str, description: str) -> None:
    """Mark ``span`` failed: ``error.type`` and an error status."""
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, description))


@contextmanager
def send_span(
    tracer: Tracer, queue: str, requests: Sequence[PutRequest], batch: bool
) -> Iterator[None]:
    """The ``send`` span of a put (and a ``put_many``'s ``create`` spans)."""
    attributes: dict[str, Any] = {
        "messaging.system": _SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "put_many" if batch else "put",
    }
    links: list[Link] = []
    own: list[PutRequest] = []
    for request in requests:
        given = _given(request.headers)
        if given is None:
            own.append(request)
        else:
            links.append(Link(given))
    if batch:
        attributes["messaging.batch.message_count"] = len(requests)
        for request in own:
            create = tracer.start_span(
                f"create {queue}",
                kind=SpanKind.PRODUCER,
                attributes={
                    "messaging.system": _SYSTEM,
                    "messaging.destination.name": queue,
                    "messaging.operation.type": "create",
                    "messaging.operation.name": "create",
                    "messaging.message.id": request.id,
                },
            )
            _write(create, request)
            links.append(Link(create.get_span_context()))
            create.end()
    else:
        attributes["messaging.message.id"] = requests[0].id
    # PRODUCER when its context is the creation context of the (one) message put.
    kind = SpanKind.PRODUCER if own and not batch else SpanKind.CLIENT
    with tracer.start_as_current_span(
        f"send {queue}",
        kind=kind,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        if own and not batch:
            _write(span, own[0])
        try:
            yield
        except BaseException as exc:
            _failed(span, exc)
            raise


def _due_text(due_at_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(due_at_ms / 1000.0, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@contextmanager
def process_span(tracer: Tracer, msg: Message, operation: str, task: str | None) -> Iterator[Span]:
    """The ``process`` span of a run of ``msg``: a child of its creation context,
    linked to it too; what the run raises is recorded."""
    now_ms = time.time() * 1000.0
    attributes: dict[str, Any] = {
        "messaging.system": _SYSTEM,
        "messaging.destination.name": msg.queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": operation,
        "messaging.message.id": msg.id,
        "messaging.delayq.message.attempt": msg.attempts,
        "messaging.delayq.message.due_at": _due_text(msg.due_at),
        "messaging.delayq.message.lateness": round(max(0.0, now_ms - msg.due_at) / 1000.0, 6),
    }
    if task is not None:
        attributes["messaging.delayq.task"] = task
    parent = None
    links = None
    given = _given(msg.headers) if msg.headers else None
    if given is not None:
        parent = trace.set_span_in_context(trace.NonRecordingSpan(given))
        links = [Link(given)]
    with tracer.start_as_current_span(
        f"process {msg.queue}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            _failed(span, exc)
            raise


def ids_of(span: Span) -> dict[str, str]:
    """``span``'s ``trace_id`` and ``span_id`` as log fields (hex, as in a traceparent);
    ``{}`` when it does not record (a no-op tracer's span carries its parent's ids)."""
    if not span.is_recording():
        return {}
    context = span.get_span_context()
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


#: The attribute of a handler :func:`traced` wrapped that holds its span's log fields
#: (:func:`ids_of`) once it ran.
RUN_IDS = "delayq_trace_ids"


def traced(
    tracer: Tracer, fn: Callable[..., Any], is_async: bool, msg: Message, task: str | None
) -> Callable[..., Any]:
    """``fn`` run in :func:`process_span`, on the thread or in the task that calls it
    (so the handler's own spans are its children); its span's ids, for the log lines
    of the run, in the wrapper's :data:`RUN_IDS` attribute."""
    ids: dict[str, str] = {}
    wrapper: Callable[..., Any]
    if is_async:

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with process_span(tracer, msg, "process", task) as span:
                ids.update(ids_of(span))
                return await fn(*args, **kwargs)

        wrapper = run_async
    else:

        def run(*args: Any, **kwargs: Any) -> Any:
            with process_span(tracer, msg, "process", task) as span:
                ids.update(ids_of(span))
                return fn(*args, **kwargs)

        wrapper = run
    setattr(wrapper, RUN_IDS, ids)
    return wrapper
