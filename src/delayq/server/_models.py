"""The request and response bodies of the HTTP API, as pydantic models, so that
``/openapi.json`` documents every field.

Requests refuse unknown fields (a typo is a 422, not a silently ignored option).
Times: ``delay`` is seconds (a number) or a duration string (``"250ms"``, ``"30m"``,
``"1h30m"``); ``at`` is an RFC 3339 time with its offset or epoch seconds. Times in
responses are epoch milliseconds (``due_at``, ``next_due_at``, ``lease_expires_at``).
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
from ..durable._constants import DEFAULT_DEAD_LIMIT, DEFAULT_LEASE
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
Seconds = Annotated[
    StrictInt | StrictFloat | StrictStr,
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string"}]}),
]


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
    "An RFC 3339 time with its offset (2030-01-31T09:00:00+01:00) or epoch seconds; for "
    "epoch milliseconds (the unit of due_at) use at_ms."
)
_AT_MS_DOC = (
    "Epoch milliseconds, the unit of due_at and Date.now() (a due_at read from the API "
    "can be sent back as it is); instead of at."
)
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


# -- errors --------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    """What went wrong: a stable ``code`` (one of a closed set) and a message for
    people (a 422's names the field; a batch's, the item: ``item 3: ...``)."""

    code: str = Field(
        description="A stable, machine-readable reason: "
        + "; ".join(
            f"{code} ({status}): {meaning}" for code, (status, meaning) in ERROR_CODES.items()
        ),
        json_schema_extra={"enum": list(ERROR_CODES)},
    )
    message: str


class ErrorResponse(BaseModel):
    """Every error answer."""

    error: ErrorDetail


# -- put -------------------------------------------------------------------------------


class CallbackSpec(_Request):
    """Deliver the message to ``url`` when it falls due (push delivery by the server's
    dispatcher); a 2xx answer acks it, anything else is retried with backoff."""

    url: StrictStr = Field(description="http(s) URL; its host must be on the allowlist.")
    method: StrictStr = Field(default="POST", description="HTTP method of the callback request.")
    headers: dict[StrictStr, StrictStr] | None = Field(
        default=None, description="Extra request headers; their values ASCII only (else 422)."
    )
    timeout: Number | None = Field(
        default=None,
        description=f"Seconds to wait for an answer (at most {CALLBACK_MAX_TIMEOUT:g}).",
    )


class PutRequestBody(_Request):
    """One message. Give ``payload`` (any JSON value) or ``payload_base64`` (bytes)."""

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
    delay: Seconds | None = Field(default=None, description=_DELAY_DOC)
    at: Seconds | None = Field(default=None, description=_AT_DOC)
    at_ms: StrictInt | None = Field(default=None, description=_AT_MS_DOC)
    id: StrictStr | None = Field(
        default=None,
        description="The message id (default: generated): 1 to 255 characters, no "
        "control characters or '/', not '.' or '..', no space at either end.",
        json_schema_extra={"minLength": 1, "maxLength": MAX_ID_LENGTH},
    )
    on_conflict: Literal["ignore", "replace", "error"] = Field(
        default="ignore",
        description="When the id exists: keep it, replace it, or answer 409.",
    )
    max_attempts: StrictInt | None = Field(default=None, ge=1, le=1_000_000)
    headers: dict[StrictStr, StrictStr] | None = None
    callback: CallbackSpec | None = None

    _null_times = model_validator(mode="before")(_no_null_times)


class PutResponse(BaseModel):
    """What the put did, with the message's id: ``created`` true (status 201) when it
    stored the message (a new id, or ``on_conflict`` ``"replace"``), false (status 200)
    when the id existed and ``on_conflict`` ``"ignore"`` kept that message unchanged."""

    id: str
    queue: str
    created: bool


class BatchPutRequest(_Request):
    """Many messages, stored all or none."""

    messages: list[PutRequestBody] = Field(min_length=1, max_length=SERVE_MAX_BATCH)


class BatchPutResponse(BaseModel):
    """The ids, in the order of the request, and for each whether it stored its message
    (``created[i]`` true: a new id or a replace) or kept an existing one (false: its id
    existed, or an earlier item stored it, and ``on_conflict`` is ``"ignore"``). Status
    201 when at least one item stored its message, 200 when every item kept one."""

    ids: list[str]
    created: list[bool]


# -- messages --------------------------------------------------------------------------


class MessageOut(BaseModel):
    """A message. ``payload_base64`` is set (and ``payload`` null) for a bytes payload;
    ``payload_error`` (and ``payload`` null) for a stored payload the server cannot
    give back; ``lease`` (the token) only on messages from reserve, ``lease_expires_at``
    on every message in flight."""

    id: str
    queue: str
    state: StateName
    due_at: int = Field(description="Epoch milliseconds.")
    due_at_iso: str | None = None
    attempts: int
    max_attempts: int
    headers: dict[str, str]
    headers_error: str | None = Field(
        default=None,
        description="Why the headers cannot be shown (they are then empty, and callback "
        "null): written to the store below a put's checks.",
    )
    last_error: str | None = None
    callback: CallbackSpec | None = Field(
        default=None, description="Where the server delivers it (callback queues)."
    )
    payload: Any = None
    payload_base64: str | None = None
    payload_error: str | None = Field(
        default=None,
        description="Why the payload cannot be shown (it is then null): written with "
        "another serializer, or nested deeper than the limit before there was one.",
    )
    lease: str | None = Field(
        default=None, description="The lease token: only on messages from reserve."
    )
    lease_expires_at: int | None = Field(
        default=None, description="When the lease ends (epoch ms), on every message in flight."
    )


class MessageList(BaseModel):
    """Messages, in the order the operation gives them: one page of it."""

    messages: list[MessageOut]
    next_cursor: str | None = Field(
        default=None,
        description="Pass it as cursor for the next page; null when this page is the last.",
    )


class ReservedMessage(MessageOut):
    """A message reserve claimed: ``lease`` is the token that ack, nack, extend and
    release take, ``lease_expires_at`` when the claim ends (epoch milliseconds)."""

    lease: str
    lease_expires_at: int


class ReservedList(BaseModel):
    """The messages reserve claimed (none when nothing fell due in time)."""

    messages: list[ReservedMessage]


class CancelResponse(BaseModel):
    """The message was removed."""

    cancelled: bool


class RescheduleRequest(_Request):
    """The new due time: ``delay``, ``at`` or ``at_ms``, one of them (``"delay": 0``
    is now); none is a 422."""

    delay: Seconds | None = Field(default=None, description=_DELAY_DOC)
    at: Seconds | None = Field(default=None, description=_AT_DOC)
    at_ms: StrictInt | None = Field(default=None, description=_AT_MS_DOC)

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

    max: StrictInt = Field(default=1, ge=1, le=SERVE_MAX_LIMIT)
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


class AckResponse(BaseModel):
    """The message is done and removed."""

    acked: bool


class NackRequest(AckRequest):
    """Retry later (``delay``, default: the backoff), or ``dead`` at once."""

    delay: Seconds | None = Field(default=None, description=_DELAY_DOC)
    error: StrictStr | None = Field(default=None, description="Kept as the message's last_error.")
    dead: StrictBool = False

    _null_times = model_validator(mode="before")(_no_null_times)


class NackResponse(BaseModel):
    """The message's new state."""

    state: StateName


class ExtendRequest(AckRequest):
    """Renew the lease for ``lease_seconds`` from now."""

    lease_seconds: _Lease = Field(
        default=DEFAULT_LEASE, description="The new lease, seconds from now."
    )


class ExtendResponse(BaseModel):
    """The new expiry, epoch milliseconds."""

    lease_expires_at: int


class ReleaseResponse(BaseModel):
    """The message is back where it was, its attempt not counted."""

    released: bool


# -- queues ----------------------------------------------------------------------------


class QueueStats(BaseModel):
    """A queue's counts per state, next due time (epoch ms) and lag (seconds)."""

    name: str
    scheduled: int
    ready: int
    active: int
    dead: int
    next_due_at: int | None = None
    lag: float


class QueueList(BaseModel):
    """Every queue that holds messages, and the callback queues."""

    queues: list[QueueStats]


class DueResponse(BaseModel):
    """How many messages fall due in each bucket from ``start`` (epoch ms) on."""

    start: int
    bucket_ms: int
    counts: list[int]


class DeadRetryRequest(_Request):
    """The dead messages to retry (null: all)."""

    ids: list[StrictStr] | None = Field(default=None, max_length=SERVE_MAX_LIMIT)


class RetriedResponse(BaseModel):
    """How many dead messages are ready again."""

    retried: int


class PurgeRequest(_Request):
    """Remove the messages in ``state`` (null: all, in flight included)."""

    state: StateName | None = None


class PurgeResponse(BaseModel):
    """How many messages were removed."""

    purged: int


class HealthResponse(BaseModel):
    """The server and its backend answer."""

    status: Literal["ok"]


#: ``limit`` of the listing endpoints, and its default.
LIMIT_DEFAULT = DEFAULT_DEAD_LIMIT
