"""From request bodies to the queue facade's arguments: times, payloads, callbacks.

Everything here only checks and converts (no I/O), raising :class:`~._errors.ApiError`
for what the client got wrong, so a route validates a whole request, a whole batch
included, before it writes anything.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .._duration import seconds_to_ms
from ..durable.constants import MAX_DUE_MS
from ..durable.tracing import carried, with_context
from ._callbacks import parse_callback
from ._config import ServeConfig
from ._constants import CALLBACK_HEADER
from ._errors import ApiError
from ._models import PutRequestBody

__all__ = ["due_time", "put_arguments", "to_at"]


def to_at(value: int | float | str | None) -> int | float | datetime | None:
    """``at`` for the facade: epoch seconds, or an aware datetime of an RFC 3339 time.

    A number past the year 9999 in seconds is most likely epoch milliseconds (what
    ``due_at`` and ``Date.now()`` give): the error says so and names ``at_ms``."""
    if not isinstance(value, str):
        if value is not None and value * 1000 > MAX_DUE_MS:
            raise ApiError(
                422,
                "invalid_request",
                f"at is epoch seconds, and {value!r:.40} seconds is past the year 9999: "
                "for epoch milliseconds (what due_at and Date.now() give) send at_ms",
                field="at",
            )
        return value
    text = value.strip()
    try:
        return to_at(float(text))
    except ValueError:
        pass
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(
            422,
            "invalid_request",
            f"at must be an RFC 3339 time with offset or epoch seconds, got {value!r:.80}",
            field="at",
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ApiError(
            422,
            "invalid_request",
            f"at needs a time zone offset (e.g. Z or +01:00): {value!r:.80}",
            field="at",
        )
    return moment


def _seconds_of_ms(ms: int) -> float:
    """Epoch seconds that the queue turns back into exactly ``ms`` (``ms / 1000``
    alone may land a float's width above it, which the queue rounds up a whole
    millisecond: a ``due_at`` sent back as ``at_ms`` must keep its value)."""
    seconds = ms / 1000
    while seconds_to_ms(seconds) > ms:
        seconds = math.nextafter(seconds, -math.inf)
    return seconds


def due_time(at: int | float | str | None, at_ms: int | None) -> int | float | datetime | None:
    """The facade's ``at`` for a request's ``at`` (epoch seconds or RFC 3339) or
    ``at_ms`` (epoch milliseconds, the unit of ``due_at``); None when neither."""
    if at_ms is None:
        return to_at(at)
    if at is not None:
        raise ApiError(
            422,
            "invalid_request",
            "give at (epoch seconds or RFC 3339) or at_ms (epoch milliseconds), not both",
        )
    if abs(at_ms) > MAX_DUE_MS:
        raise ApiError(
            422,
            "invalid_request",
            f"at_ms of {at_ms!r} milliseconds is out of range (past the year 9999)",
            field="at_ms",
        )
    return _seconds_of_ms(at_ms)


def _payload(body: PutRequestBody) -> Any:
    given = body.model_fields_set
    if body.payload_base64 is not None:
        if "payload" in given:
            raise ApiError(422, "payload_conflict", "give payload or payload_base64, not both")
        try:
            return base64.b64decode(body.payload_base64, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(422, "invalid_base64", "payload_base64 is not valid base64") from None
    if "payload" not in given:
        raise ApiError(422, "missing_payload", "a message needs payload or payload_base64")
    return body.payload


def _callback_header(body: PutRequestBody, queue: str, config: ServeConfig) -> str | None:
    if body.callback is None:
        return None
    if queue not in config.callback_queues:
        names = ", ".join(repr(name) for name in config.callback_queues)
        raise ApiError(
            422,
            "callback_queue_not_dispatched",
            f"a message with a callback must go to a callback queue ({names}), not {queue!r}",
        )
    raw = body.callback.model_dump(exclude_none=True)
    try:
        with_body = body.payload is not None or bool(body.payload_base64)
        callback = parse_callback(raw, config, with_body=with_body)
    except ValueError as exc:
        code = getattr(exc, "code", None)
        raise ApiError(
            422, code if isinstance(code, str) else "invalid_callback", str(exc)
        ) from None
    return callback.to_header()


def request_trace(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The trace context of a request (its raw headers): ``traceparent`` when it has
    exactly one that is valid, with its ``tracestate`` (several fields joined with
    commas, as W3C Trace Context allows); ``{}`` otherwise, and the put goes on without
    one, as a receiver of a malformed ``traceparent`` does."""
    parents: list[str] = []
    states: list[str] = []
    for key, value in raw:
        if key == b"traceparent":
            parents.append(value.decode("latin-1"))
        elif key == b"tracestate":
            states.append(value.decode("latin-1"))
    if len(parents) != 1:
        return {}
    return carried(parents[0], ",".join(states) if states else None)


def put_arguments(
    body: PutRequestBody,
    queue: str,
    config: ServeConfig,
    trace: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``AsyncQueue.put`` (and a ``put_many`` item) for
    ``body`` put to ``queue``; ``trace``, the request's trace context
    (:func:`request_trace`), goes into the message's headers unless they carry one."""
    headers = dict(body.headers or {})
    if any(key.lower() == CALLBACK_HEADER for key in headers):
        raise ApiError(
            422, "reserved_header", f"the header {CALLBACK_HEADER!r} is set by 'callback'"
        )
    callback = _callback_header(body, queue, config)
    if callback is not None:
        headers[CALLBACK_HEADER] = callback
    if trace:
        with_context(headers, trace)
    arguments: dict[str, Any] = {
        "payload": _payload(body),
        "delay": body.delay,  # seconds or a duration string: the queue's one parser
        "at": due_time(body.at, body.at_ms),
        "on_conflict": body.on_conflict,
        "max_attempts": body.max_attempts,
        "headers": headers,
    }
    if body.id is not None:
        arguments["id"] = body.id  # checked by the queue (delayq._names), as on every face
    return arguments
