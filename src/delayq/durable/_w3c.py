"""W3C Trace Context as message headers, pure text: what :mod:`.tracing` and
:mod:`._otel` share (no OpenTelemetry needed)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from .facade import check_headers
from .message import HeadersTooLarge

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "carried",
    "has_context",
    "valid_traceparent",
    "with_context",
]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

#: version 00's form (a later version may add fields after a dash: its first four
#: are read the same, W3C Trace Context 4.3).
_TRACEPARENT = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[0-9a-f][0-9a-f-]*)?"
)
_TRACEPARENT_MAX = 256
#: A tracestate is carried when it is printable ASCII of at most this many characters
#: (W3C: at most 32 entries of at most 256 characters, which a propagator may trim).
_TRACESTATE_MAX = 512
_TRACESTATE = re.compile(r"[\x20-\x7e]*")


def valid_traceparent(value: str) -> bool:
    """Whether ``value`` is a W3C ``traceparent`` a receiver may use: the form, a
    version other than ``ff``, a trace id and a parent id not all zero, and nothing
    after the fourth field in version 00."""
    match = _TRACEPARENT.fullmatch(value) if len(value) <= _TRACEPARENT_MAX else None
    if match is None:
        return False
    version, trace_id, parent_id, _flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return False
    return trace_id != "0" * 32 and parent_id != "0" * 16


def carried(traceparent: str | None, tracestate: str | None = None) -> dict[str, str]:
    """The trace context headers of a message from the outside (an HTTP request's
    headers, the environment): ``{}`` unless ``traceparent`` is valid; ``tracestate``
    only with it, and only when it is printable ASCII of a bounded length (else left
    out, as a propagator drops a tracestate it cannot parse)."""
    if traceparent is None:
        return {}
    traceparent = traceparent.strip(" \t")
    if not valid_traceparent(traceparent):
        return {}
    context = {TRACEPARENT: traceparent}
    if tracestate is not None:
        tracestate = tracestate.strip(" \t")
        if tracestate and len(tracestate) <= _TRACESTATE_MAX and _TRACESTATE.fullmatch(tracestate):
            context[TRACESTATE] = tracestate
    return context


def has_context(headers: Mapping[str, str]) -> bool:
    """Whether ``headers`` carry a ``traceparent`` already (any case of the name)."""
    if TRACEPARENT in headers:
        return True
    return any(key.lower() == TRACEPARENT for key in headers)


def with_context(headers: dict[str, str], context: Mapping[str, str]) -> bool:
    """Add ``context`` (``traceparent`` and maybe ``tracestate``) to ``headers`` in
    place, unless they carry a ``traceparent`` already or the message's header limits
    would be passed (a put never fails for its trace context: without ``tracestate``
    first, then without any). True when it was added."""
    if not context or has_context(headers):
        return False
    for extra in (context, {TRACEPARENT: context[TRACEPARENT]}):
        try:
            check_headers({**headers, **extra})
        except HeadersTooLarge:
            continue
        headers.update(extra)
        return True
    return False
