"""W3C trace context on messages, and OpenTelemetry spans where an SDK is configured.

A message carries its creation context in the headers ``traceparent`` and
``tracestate`` (W3C Trace Context, the same text as the HTTP headers). Two things put
it there:

* :func:`sending`, around every put of the queue faces (``put``, ``put_many``, and so
  ``App.send``/``send_many`` and the CLI): a ``send`` span of the caller's current
  context whose context goes into each message that has none yet. A message that
  already carries a ``traceparent`` keeps it (a creation context given by the
  caller), and the ``send`` span links to it.
* :func:`with_context`, for the faces that take the context from outside the process:
  the HTTP API from the request's own ``traceparent`` header, the CLI from the
  ``TRACEPARENT``/``TRACESTATE`` environment variables. That is text checked against
  the W3C format, with no OpenTelemetry needed.

On the way out, :func:`traced` wraps a Worker's handler in a ``process`` span and
:func:`processing` is the callback dispatcher's ``process`` span; either is a child of
the message's creation context and links to it (docs/guide/tracing.md says why).

The cost when OpenTelemetry is not in use is one ``sys.modules`` look-up: nothing here
imports ``opentelemetry``. Only once the process has imported ``opentelemetry.trace``
(an SDK configured, or any library that uses the API) is the global tracer provider
looked at (:mod:`._otel`, imported then): once for good when one is set (the API sets
it once), at most once a second while none is (:func:`provider_set` says at once).
Only a provider that is neither the API's proxy (none set) nor its no-op one, and
whose tracer is not the API's no-op one, makes spans.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import ModuleType
from typing import Any

from ._w3c import TRACEPARENT, TRACESTATE, carried, has_context, valid_traceparent, with_context
from .message import Message, PutRequest

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "Run",
    "carried",
    "has_context",
    "log_ids",
    "processing",
    "provider_set",
    "run_ids",
    "sending",
    "spans_on",
    "traced",
    "valid_traceparent",
    "with_context",
]

_NO_SPAN: AbstractContextManager[None] = nullcontext()

# -- spans, where OpenTelemetry is in use ---------------------------------------------

_otel: ModuleType | None = None


def _api() -> Any:
    """:mod:`._otel` when the process has imported the OpenTelemetry API, else None
    (and then nothing of it is imported here)."""
    global _otel
    if _otel is None:
        if "opentelemetry.trace" not in sys.modules:
            return None
        from . import _otel as otel  # noqa: PLC0415

        _otel = otel
    return _otel


def _active() -> tuple[Any, Any] | None:
    """(:mod:`._otel`, delayq's tracer) when spans are made, else None."""
    otel = _api()
    if otel is None:
        return None
    tracer = otel.tracer()
    return None if tracer is None else (otel, tracer)


def provider_set() -> None:
    """Say that the global tracer provider was just set: delayq's next put or run
    asks for it at once. Without this call it does within a second (while no provider
    is set, the API is asked at most once a second: asking it costs microseconds)."""
    otel = _api()
    if otel is not None:
        otel.recheck()


def sending(
    queue: str, requests: Sequence[PutRequest], *, batch: bool
) -> AbstractContextManager[None]:
    """The ``send`` span of a put of ``requests`` to ``queue`` (``batch``: a
    ``put_many``), current while the backend stores them, its context written into
    each message that has none. A context manager that does nothing when no SDK is
    configured."""
    active = _active()
    if active is None:
        return _NO_SPAN
    otel, tracer = active
    result: AbstractContextManager[None] = otel.send_span(tracer, queue, requests, batch)
    return result


def spans_on() -> bool:
    """Whether spans are made now (an SDK configured): :func:`traced` gives back the
    function itself while they are not, so a caller of it for many messages at once
    may look once."""
    return _active() is not None


def traced(
    fn: Callable[..., Any], is_async: bool, msg: Message, task: str | None
) -> Callable[..., Any]:
    """``fn`` (a Worker's handler of ``msg``) run in a ``process`` span: the
    exception it raises recorded and the span's status set to error. ``fn`` itself when
    no SDK is configured."""
    active = _active()
    if active is None:
        return fn
    otel, tracer = active
    wrapped: Callable[..., Any] = otel.traced(tracer, fn, is_async, msg, task)
    return wrapped


def log_ids(traceparent: str | None, *, span: bool = False) -> dict[str, str]:
    """The log fields that tie a line to a trace: ``trace_id`` of ``traceparent``
    (W3C text), and its ``span_id`` when ``span`` (it is a recording span's); ``{}``
    when there is none, or it is not a valid one."""
    if traceparent is None or not valid_traceparent(traceparent):
        return {}
    if span:
        return {"trace_id": traceparent[3:35], "span_id": traceparent[36:52]}
    return {"trace_id": traceparent[3:35]}


def run_ids(msg: Message, fn: Callable[..., Any] | None) -> dict[str, str]:
    """The log fields of a Worker's line about its run of ``msg`` (``fn``: the
    handler as :func:`traced` gave it): the ``trace_id`` and ``span_id`` of its
    ``process`` span when one was made, else the ``trace_id`` of the message's own
    ``traceparent``; ``{}`` without either (nothing imported)."""
    if _otel is not None:
        ids: dict[str, str] | None = getattr(fn, _otel.RUN_IDS, None)
        if ids:
            return ids
    headers = msg.headers
    return log_ids(headers.get(TRACEPARENT)) if headers else {}


class Run:
    """One callback run, as :func:`processing` yields it: ``context``, the trace
    context headers to send on, and :meth:`failed` to mark its span failed."""

    __slots__ = ("context", "span")

    def __init__(self, context: dict[str, str], span: Any = None) -> None:
        self.context = context
        self.span = span

    def log_ids(self) -> dict[str, str]:
        """The log fields of a line about this run: its span's ``trace_id`` and
        ``span_id`` when it records (a no-op provider's carries the parent's ids),
        else the ``trace_id`` of the message's own ``traceparent`` (``{}`` without
        one)."""
        span = self.span is not None and self.span.is_recording()
        return log_ids(self.context.get(TRACEPARENT), span=span)

    def failed(self, kind: str, description: str) -> None:
        """The run failed: ``kind`` (low cardinality: ``timeout``, ``http_error``...)
        as ``error.type``, ``description`` as the status message."""
        if self.span is not None:
            otel = _api()
            assert otel is not None
            otel.failed(self.span, kind, description)


@contextmanager
def processing(msg: Message, operation: str) -> Iterator[Run]:
    """The ``process`` span of the callback dispatcher's run of ``msg`` (``operation``:
    its ``messaging.operation.name``), yielding a :class:`Run` whose ``context`` is
    that span's (or, with no SDK, the message's own trace context, passed on as is)."""
    active = _active()
    if active is None:
        headers = msg.headers
        yield Run(carried(headers.get(TRACEPARENT), headers.get(TRACESTATE)) if headers else {})
        return
    otel, tracer = active
    with otel.process_span(tracer, msg, operation, None) as span:
        yield Run(otel.context_of(span), span)
