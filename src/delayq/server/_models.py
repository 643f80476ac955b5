"""The request and response bodies of the HTTP API, as pydantic models, so that
``/openapi.json`` documents every field.

Requests refuse unknown fields (a typo is a 422, not a silently ignored option).
Units: every numeric field says its unit in its description, in one of three words:
"epoch milliseconds" (a moment: every time in an answer, and ``at_ms``), "seconds" (a
duration, or the moment a numeric ``at`` names: "epoch seconds") or "milliseconds" (a
length of time in an answer: ``bucket_ms``); a number that is no time says "a count".
No field is renamed for its unit (clients in use keep working); ``delay`` also takes a
duration string (``"250ms"``, ``"30m"``, ``"1h30m"``), ``at`` an RFC 3339 time.

Answers carry every field of their model, null where there is nothing (no field is
optional in an answer); a request field is nullable only where the server takes null.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .._names import MAX_ID_LENGTH
from ..durable.constants import DEFAULT_DEAD_LIMIT, DEFAULT_LEASE
from ._callbacks import CALLBACK_METHODS
from ._constants import CALLBACK_MAX_TIMEOUT, SERVE_MAX_BATCH, SERVE_MAX_LIMIT, SERVE_MAX_WAIT
from ._errors import ERROR_CODES

__all__ = [
    "AckRequest",
    "AckResponse",
    "BatchPutRequest",
    "BatchPutResponse",
    "CallbackSpec",
    "CancelResponse",
    "DeadRetryRequest",
    "DueResponse",
    "ErrorDetail",
    "ErrorResponse",
    "ExtendRequest",
    "ExtendResponse",
    "HealthResponse",
    "MessageList",
    "MessageOut",
    "NackRequest",
    "NackResponse",
    "PurgeRequest",
    "PurgeResponse",
    "PutRequestBody",
    "PutResponse",
    "QueueList",
    "QueueStats",
    "ReleaseResponse",
    "RescheduleRequest",
    "ReserveRequest",
    "ReservedList",
    "ReservedMessage",
    "RetriedResponse",
]

StateName = Literal["scheduled", "ready", "active", "dead"]
# A JSON number (an int or a float, never a bool), documented as one `number`, not as
# `anyOf [integer, number]`.
Number = Annotated[StrictInt | StrictFloat, WithJsonSchema({"type": "number"})]
# The time fields of requests: None when omitted, but documented without null, which
# the server refuses (see _no_null_times).
_SECONDS_SCHEMA = {"anyOf": [{"type": "number"}, {"type": "string"}]}
_Time = Annotated[StrictInt | StrictFloat | StrictStr | None, WithJsonSchema(_SECONDS_SCHEMA)]
_TimeMs = Annotated[StrictInt | None, WithJsonSchema({"type": "integer"})]


# Bounded numbers, documented with JSON Schema's own exclusiveMinimum/minimum/maximum
# (on a union pydantic writes its gt/ge/le as they are, which no OpenAPI tool knows).
_Lease = Annotated[
    StrictInt | StrictFloat,
    Field(gt=0, le=86_400),
    WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 86_400}),
]
_Wait = Annotated[
    StrictInt | StrictFloat,
    Field(ge=0, le=SERVE_MAX_WAIT),
    WithJsonSchema({"type": "number", "minimum": 0, "maximum": SERVE_MAX_WAIT}),
]
_DELAY_DOC = (
    'Seconds (90, "90") or a duration like "250ms", "30m", "1h30m"; a negative delay '
    '("-5", "-5s") means now.'
)
_AT_DOC = (
    "An RFC 3339 time with its offset (2030-01-31T09:00:00+01:00) or, as a number, epoch "
    "seconds; for epoch milliseconds (the unit of due_at) use at_ms."
)
_AT_MS_DOC = (
    "Epoch milliseconds, the unit of due_at and Date.now() (a due_at read from the API "
    "can be sent back as it is); instead of at."
)
_EPOCH_MS = "Epoch milliseconds."
_COUNT = "A count."


def _one_of(**fields: dict[str, Any]) -> dict[str, Any]:
    """A request schema's rule that it holds exactly one of ``fields`` (name: the
    schema of a value that counts), as ``oneOf`` branches that each require one: the
    shape openapi-typescript turns into ``core & (A | B)``, so a generated client
    refuses a body without any at compile time."""
    return {
        "oneOf": [
            {"type": "object", "required": [name], "properties": {name: schema}}
            for name, schema in fields.items()
        ]
    }


# JSON.stringify writes NaN and an invalid Date as null: a null time is refused, not
# read as "omitted" (which means due now, or the backoff for nack's delay).
_TIME_FIELDS = ("delay", "at", "at_ms")


def _no_null_times(data: Any) -> Any:
    """``data`` (a request body) unchanged; a 422 naming the field when a time field
    is null."""
    if isinstance(data, dict):
        for name in _TIME_FIELDS:
            if name in data and data[name] is None:
                raise PydanticCustomError(
                    "null_time",
                    "null is not a time (JSON.stringify writes NaN and an invalid "
                    "Date as null); omit {field} instead",
                    {"field": name},
                )
    return data


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Answer(BaseModel):
    # An answer is written with every field, its defaults included: the document says
    # each is required (nullable where its default is null).
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


# -- errors --------------------------------------------------------------------------


class ErrorDetail(_Answer):
    """What went wrong: a stable ``code`` (one of a closed set) and a message for
    people (a 422's names the field; a batch's, the item: ``item 3: ...``)."""

    code: str = Field(
        description="A stable, machine-readable reason: "
        + "; ".join(
            f"{code} ({status}): {meaning}" for code, (status, meaning) in ERROR_CODES.items()
        ),
        json_schema_extra={"enum": list(ERROR_CODES)},
    )
    message: str = Field(description="What went wrong, for people.")


class ErrorResponse(_Answer):
    """Every error answer."""

    error: ErrorDetail


# -- put -------------------------------------------------------------------------------


class CallbackSpec(_Request):
    """Deliver the message to ``url`` when it falls due (push delivery by the server's
    dispatcher); a 2xx answer acks it, anything else is retried with backoff."""

    url: StrictStr = Field(description="http(s) URL; its host must be on the allowlist.")
    method: Annotated[
        StrictStr, WithJsonSchema({"type": "string", "enum": list(CALLBACK_METHODS)})
    ] = Field(
        default="POST",
        description="HTTP method of the callback request. A GET request carries no "
        "body: a message with a GET callback needs a null payload (payload null, no "
        "payload_base64), else the put is a 422 invalid_callback.",
    )
    headers: dict[StrictStr, StrictStr] | None = Field(
        default=None, description="Extra request headers; their values ASCII only (else 422)."
    )
    timeout: (
        Annotated[
            Number,
            WithJsonSchema(
                {"type": "number", "exclusiveMinimum": 0, "maximum": CALLBACK_MAX_TIMEOUT}
            ),
        ]
        | None
    ) = Field(
        default=None,
        description="Seconds to wait for an answer: more than 0, at most the server's "
        f"--callback-timeout (which is at most {CALLBACK_MAX_TIMEOUT:g}); null or "
        "omitted: that limit.",
    )


class PutRequestBody(_Request):
    """One message. Give ``payload`` (any JSON value, null included) or
    ``payload_base64`` (bytes): one of them, not both."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra=_one_of(payload={}, payload_base64={"type": "string"})
    )

    payload: Any = Field(
        default=None,
        description="The message: any JSON value. To start a task of a delayq App, put "
        'its envelope on the task\'s queue: {"task": "name", "args": [...], "kwargs": '
        "{...}} (what Task.send and `delayq send` put; a worker of the App runs "
        "name(*args, **kwargs), and sends any other payload on that queue to the dead "
        "letters as UnknownTask).",
        examples=[{"order": 42}, {"task": "cancel_if_unpaid", "args": [42], "kwargs": {}}],
    )
    payload_base64: StrictStr | None = Field(
        default=None, description="The message as base64 bytes, instead of payload."
    )
    delay: _Time = Field(default=None, description=_DELAY_DOC)
    at: _Time = Field(default=None, description=_AT_DOC)
    at_ms: _TimeMs = Field(default=None, description=_AT_MS_DOC)
    id: StrictStr | None = Field(
        default=None,
        description="The message id (default: generated): 1 to 255 characters, no "
        "control characters, not '.' or '..', no space at either end ('/' and any "
        "other character may be in it: percent-encode the id in a path).",
        json_schema_extra={"minLength": 1, "maxLength": MAX_ID_LENGTH},
    )
    on_conflict: Literal["ignore", "replace", "error"] = Field(
        default="ignore",
        description="When the id exists: keep it, replace it, or answer 409.",
    )
    max_attempts: StrictInt | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="A count: attempts before the message is dead (default: the queue's).",
    )
    headers: dict[StrictStr, StrictStr] | None = None
    callback: CallbackSpec | None = None

    _null_times = model_validator(mode="before")(_no_null_times)


class PutResponse(_Answer):
    """What the put did, with the message's id: ``created`` true (status 201) when it
    stored the message (a new id, or ``on_conflict`` ``"replace"``), false (status 200)
    when the id existed and ``on_conflict`` ``"ignore"`` kept that message unchanged."""

    id: str
    queue: str
    created: bool


class BatchPutRequest(_Request):
    """Many messages, stored all or none."""

    messages: list[PutRequestBody] = Field(min_length=1, max_length=SERVE_MAX_BATCH)


class BatchPutResponse(_Answer):
    """The ids, in the order of the request, and for each whether it stored its message
    (``created[i]`` true: a new id or a replace) or kept an existing one (false: its id
    existed, or an earlier item stored it, and ``on_conflict`` is ``"ignore"``). Status
    201 when at least one item stored its message, 200 when every item kept one."""

    ids: list[str]
    created: list[bool]


# -- messages --------------------------------------------------------------------------


class MessageOut(_Answer):
    """A message, every field present (null where there is nothing): ``payload_base64``
    is set (and ``payload`` null) for a bytes payload; ``payload_error`` (and
    ``payload`` null) for a stored payload the server cannot give back; ``lease``
    (the token) only on messages from reserve, ``lease_expires_at`` on every message
    in flight."""

    id: str
    queue: str
    state: StateName
    due_at: int = Field(description=_EPOCH_MS)
    due_at_iso: str = Field(description="due_at as an RFC 3339 UTC time, to the millisecond.")
    attempts: int = Field(description=f"{_COUNT} Attempts made so far.")
    max_attempts: int = Field(description=f"{_COUNT} Attempts before the message is dead.")
    headers: dict[str, str]
    headers_error: str | None = Field(
        default=None,
        description="Why the headers cannot be shown (they are then empty, and callback "
        "null): written to the store below a put's checks.",
    )
    last_error: str | None = Field(
        default=None,
        description="The error of the last failed attempt, whole: for a handler's "
        "exception its summary line, then its traceback.",
    )
    error_summary: str | None = Field(
        default=None,
        description="last_error in short: its first line and, when it has a traceback, "
        "where the handler's own code raised it (`ValueError: boom\\n  at tasks.py:12 in "
        "charge`).",
    )
    callback: CallbackSpec | None = Field(
        default=None, description="Where the server delivers it (callback queues)."
    )
    payload: Any = Field(
        default=None, description="The message's JSON value (null for bytes, see above)."
    )
    payload_base64: str | None = Field(default=None, description="A bytes payload, as base64.")
    payload_error: str | None = Field(
        default=None,
        description="Why the payload cannot be shown (it is then null): written with "
        "another serializer, or nested deeper than the limit before there was one.",
    )
    lease: str | None = Field(
        default=None, description="The lease token: only on messages from reserve."
    )
    lease_expires_at: int | None = Field(
        default=None,
        description="When the lease ends, epoch milliseconds: on every message in flight.",
    )


class MessageList(_Answer):
    """Messages, in the order the operation gives them: one page of it."""

    messages: list[MessageOut]
    next_cursor: str | None = Field(
        default=None,
        description="Pass it as cursor for the next page; null when this page is the last.",
    )


class ReservedMessage(MessageOut):
    """A message reserve claimed: ``lease`` is the token that ack, nack, extend and
    release take, ``lease_expires_at`` when the claim ends (epoch milliseconds)."""

    lease: str = Field(description="The lease token.")
    lease_expires_at: int = Field(description="When the lease ends, epoch milliseconds.")


class ReservedList(_Answer):
    """The messages reserve claimed (none when nothing fell due in time)."""

    messages: list[ReservedMessage]


class CancelResponse(_Answer):
    """The message was removed."""

    cancelled: bool


class RescheduleRequest(_Request):
    """The new due time: ``delay``, ``at`` or ``at_ms``, exactly one of them
    (``"delay": 0`` is now); none, or two, is a 422."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra=_one_of(
            delay=_SECONDS_SCHEMA, at=_SECONDS_SCHEMA, at_ms={"type": "integer"}
        ),
    )

    delay: _Time = Field(default=None, description=_DELAY_DOC)
    at: _Time = Field(default=None, description=_AT_DOC)
    at_ms: _TimeMs = Field(default=None, description=_AT_MS_DOC)

    _null_times = model_validator(mode="before")(_no_null_times)


# -- consuming -------------------------------------------------------------------------


def _former_name(data: Any, former: str, name: str) -> Any:
    """``data`` (a request body) with ``former``, an earlier spelling of the field
    ``name``, renamed to it; both at once is a 422."""
    if isinstance(data, dict) and former in data:
        if name in data:
            raise ValueError(f"give {name} (or {former}, its former name), not both")
        data = {**data, name: data[former]}
        del data[former]
    return data


class ReserveRequest(_Request):
    """Claim up to ``max`` due messages, each for ``lease_seconds``, waiting up to
    ``wait`` seconds. (``lease``, the former name of ``lease_seconds``, is still
    accepted: ``lease`` is the token of a claimed message everywhere else.)"""

    max: StrictInt = Field(
        default=1, ge=1, le=SERVE_MAX_LIMIT, description=f"{_COUNT} At most this many messages."
    )
    lease_seconds: _Lease = Field(
        default=DEFAULT_LEASE,
        description="How long each message is held (seconds); ack, nack, extend or "
        "release it before then with its lease token.",
    )
    wait: _Wait = Field(default=0, description="Seconds to wait for a message.")

    @model_validator(mode="before")
    @classmethod
    def _lease_renamed(cls, data: Any) -> Any:
        return _former_name(data, "lease", "lease_seconds")


class AckRequest(_Request):
    """The lease token from reserve."""

    lease: StrictStr = Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="The lease token of the message, from reserve.",
    )


class AckResponse(_Answer):
    """The message is done and removed."""

    acked: bool


class NackRequest(AckRequest):
    """Retry later (``delay``, default: the backoff), or ``dead`` at once."""

    delay: _Time = Field(
        default=None, description=f"{_DELAY_DOC} Omitted: the queue's backoff for the attempt."
    )
    error: StrictStr | None = Field(default=None, description="Kept as the message's last_error.")
    dead: StrictBool = False

    _null_times = model_validator(mode="before")(_no_null_times)


class NackResponse(_Answer):
    """The message's new state."""

    state: StateName


class ExtendRequest(AckRequest):
    """Renew the lease for ``lease_seconds`` from now."""

    lease_seconds: _Lease = Field(
        default=DEFAULT_LEASE, description="The new lease, seconds from now."
    )


class ExtendResponse(_Answer):
    """The new expiry, epoch milliseconds."""

    lease_expires_at: int = Field(description="When the lease ends, epoch milliseconds.")


class ReleaseResponse(_Answer):
    """The message is back where it was, its attempt not counted."""

    released: bool


# -- queues ----------------------------------------------------------------------------


class QueueStats(_Answer):
    """A queue's counts per state, next due time (epoch ms) and lag (seconds)."""

    name: str
    scheduled: int = Field(description=f"{_COUNT} Messages due later.")
    ready: int = Field(description=f"{_COUNT} Messages due now, waiting for a consumer.")
    active: int = Field(description=f"{_COUNT} Messages in flight (reserved).")
    dead: int = Field(description=f"{_COUNT} Dead messages.")
    next_due_at: int | None = Field(
        default=None,
        description="The earliest due time of a message waiting to be reserved (ready "
        "ones included), epoch milliseconds; null when none is waiting.",
    )
    lag: float = Field(
        description="How long the oldest ready message is overdue, in seconds (0 when "
        "none is ready): a duration, not a time."
    )
    work_lag: float = Field(
        default=0.0,
        description="lag without the cron ticks that wait for a worker (a stopped "
        "worker leaves one per `@app.cron` / `@app.every` task): how long the oldest "
        "ready message that is not a tick is overdue, in seconds.",
    )


class QueueList(_Answer):
    """Every queue that holds messages (a callback queue too, once it holds one)."""

    queues: list[QueueStats]


class DueResponse(_Answer):
    """How many messages fall due in each bucket from ``start`` (epoch ms) on."""

    start: int = Field(description="Where the first bucket starts, epoch milliseconds.")
    bucket_ms: int = Field(description="The length of each bucket, milliseconds.")
    counts: list[int] = Field(description=f"{_COUNT} Per bucket, the messages due in it.")


class DeadRetryRequest(_Request):
    """The dead messages to retry (null: all)."""

    ids: list[StrictStr] | None = Field(default=None, max_length=SERVE_MAX_LIMIT)


class RetriedResponse(_Answer):
    """How many dead messages are ready again."""

    retried: int = Field(description=f"{_COUNT} Messages made ready.")


class PurgeRequest(_Request):
    """Remove the messages in ``state`` (null: all, in flight included)."""

    state: StateName | None = None


class PurgeResponse(_Answer):
    """How many messages were removed."""

    purged: int = Field(description=f"{_COUNT} Messages removed.")


class HealthResponse(_Answer):
    """The server and its backend answer."""

    status: Literal["ok"]


#: ``limit`` of the listing endpoints, and its default.
LIMIT_DEFAULT = DEFAULT_DEAD_LIMIT
