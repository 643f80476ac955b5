"""Messages, their states, and the pure state transitions of the durable contract.

Two shapes of a message live here:

* :class:`Record` is what a backend stores and returns: the payload as bytes, the
  due time in epoch milliseconds, a sequence number for FIFO among equal due times,
  and the lease (token and expiry) while the message is in flight.
* :class:`Message` is what a user sees: the payload deserialized, and the lease
  token only when it came from ``reserve``.

The ``apply_*`` functions are the contract's state machine, written once. Each takes
a stored record and the backend's :class:`Now` (its clock, never the client's), does
no I/O, and returns the record to store (or raises and changes nothing). The memory
backend calls them directly; SQL statements and Lua scripts mirror them line by line.

Two readings of one instant, so that nothing is ever early: a time *computed* from
the clock as now plus a positive duration (a due time from ``delay_ms``, a lease
expiry) starts from :attr:`Now.ceil`, so it is never reached before the duration has
really passed; every *check* against the clock (is it due, has the lease expired,
the lag) and "now" itself (due now, a past ``at_ms``) use :attr:`Now.floor`. The
observers (:func:`settle`, :func:`is_due`, :func:`observe`, ...) only check, so they
take ``now_ms``, the floor.

Stored states are ``SCHEDULED``, ``ACTIVE`` and ``DEAD``. ``READY`` is never stored: it
is a scheduled message whose due time has passed (:func:`observe`). An ``ACTIVE``
message whose lease has expired is, logically, already back to scheduled (due at its
lease expiry) or dead; :func:`settle` makes that explicit and every transition
starts from a settled record.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, NoReturn

from ..errors import DuplicateId, LeaseLost
from .build import builder, replacer

__all__ = [
    "EMPTY_HEADERS",
    "LEASE_EXPIRED_ERROR",
    "Claimed",
    "HeadersTooLarge",
    "Held",
    "Message",
    "Now",
    "OnConflict",
    "Position",
    "PutRequest",
    "PutResult",
    "Record",
    "State",
    "Stats",
    "UnreadableHeaders",
    "apply_ack",
    "apply_ack_many",
    "apply_extend",
    "apply_nack",
    "apply_put",
    "apply_release",
    "apply_reschedule",
    "apply_reserve",
    "apply_retry_dead",
    "apply_unclaim",
    "can_cancel",
    "compute_stats",
    "hold_seconds",
    "is_due",
    "lag_of",
    "load_headers",
    "matches_state",
    "new_message",
    "new_record",
    "observe",
    "put_request",
    "read_headers",
    "replace_record",
    "resolve_due",
    "row_record",
    "settle",
]

#: The ``last_error`` of a message whose lease expired.
LEASE_EXPIRED_ERROR = "lease expired"


class _NoHeaders(dict[str, str]):
    """The type of :data:`EMPTY_HEADERS`: an empty dict that refuses every write (a
    dict still, so that reading it, ``dict()`` of it and msgpack cost what an empty
    dict's do), copied and pickled as the one instance."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("EMPTY_HEADERS is shared by every record without headers: read-only")

    __setitem__ = __delitem__ = setdefault = pop = popitem = clear = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> str:
        return "EMPTY_HEADERS"


#: The headers of every record that has none, one mapping shared by all (a new empty
#: dict each took 64 bytes a scheduled message in the replicated scheduler): it
#: refuses writes, so that none can change another record's headers through it.
EMPTY_HEADERS: Mapping[str, str] = _NoHeaders()

OnConflict = Literal["ignore", "replace", "error"]
#: A place in a peek's order (:func:`~delayq.durable.inspection.peek_order`):
#: ``(due_at, seq)``, ``(lease_until, seq)`` for active messages, ``(seq,)`` for dead ones.
Position = tuple[int, ...]


class HeadersTooLarge(ValueError):
    """A message's headers are too many or too large (``MAX_MESSAGE_HEADERS``,
    ``MAX_MESSAGE_HEADER_BYTES``); nothing was stored."""


class UnreadableHeaders(dict[str, str]):
    """A record's headers that could not be decoded from what the store holds: empty,
    with ``error`` saying why (see :func:`load_headers`)."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def load_headers(text: str | bytes | None) -> Mapping[str, str]:
    """A record's headers from the JSON a backend stores them as. Never raises: JSON
    it cannot decode (malformed, or nested deeper than the reader recurses) gives
    :class:`UnreadableHeaders`, so that one record spoils nothing but itself; what
    is not names and values is left to :func:`read_headers`."""
    if not text:
        return EMPTY_HEADERS
    try:
        headers: Mapping[str, str] = json.loads(text)
    except RecursionError:
        return UnreadableHeaders("the headers nest too deep to be decoded: they cannot be shown")
    except ValueError as exc:
        return UnreadableHeaders(f"the headers cannot be decoded: {str(exc)[:200]}")
    return headers


def read_headers(headers: object) -> tuple[dict[str, str], str | None]:
    """``(headers, None)`` for a record's headers, or ``({}, why)`` when they cannot
    be given back: undecodable (:class:`UnreadableHeaders`), or not names and values
    that are strings (written below the checks of a put). Never raises, and never
    looks inside a value that is not a string."""
    if headers is EMPTY_HEADERS or (type(headers) is dict and not headers):  # none
        return {}, None
    if isinstance(headers, UnreadableHeaders):
        return {}, headers.error
    if isinstance(headers, Mapping) and all(
        type(key) is str and type(value) is str for key, value in headers.items()
    ):
        return dict(headers), None
    return {}, "the headers are not names and values that are strings: they cannot be shown"


class State(str, enum.Enum):
    """Where a message is in its life: ``scheduled -> ready -> active -> (gone |
    scheduled | dead)``."""

    SCHEDULED = "scheduled"
    """Waiting for its due time."""
    READY = "ready"
    """Due, waiting for a consumer (never stored: a scheduled message past its due time)."""
    ACTIVE = "active"
    """Reserved by a consumer that holds an unexpired lease."""
    DEAD = "dead"
    """Out of attempts; kept with its last error until retried or purged."""

    def __str__(self) -> str:
        return self.value


#: The states read once: a member read through the class goes through the enum
#: type's ``__getattr__`` hook (about a Python call), and the transitions read them
#: on every claim and ack.
_SCHEDULED, _READY, _ACTIVE, _DEAD = State.SCHEDULED, State.READY, State.ACTIVE, State.DEAD


@dataclass(frozen=True, slots=True)
class Message:
    """A durable message as a user sees it.

    ``due_at`` is epoch milliseconds; ``attempts`` counts how many times the message
    was reserved. ``lease`` (the fencing token) and ``lease_expires_at`` (epoch ms) are
    set only on messages returned by ``reserve``; ``ack``/``nack``/``extend`` need them.
    ``payload_error`` says why the stored payload cannot be given back (``payload`` is
    then None): it was written with another serializer, or nests deeper than delayq
    allows (stored before that limit). Such a message is still reserved, acked,
    nacked or cancelled like any other; it never fails the call that returns it.
    ``seq`` is its place in the queue's order (put order, renewed when it is
    rescheduled, nacked or retried): ``dead(after_seq=...)`` pages by it.
    ``headers_error``, like ``payload_error``, says why the stored headers cannot be
    given back (``headers`` is then empty): they were written below a put's checks.
    """

    id: str
    queue: str
    payload: Any
    due_at: int
    attempts: int
    max_attempts: int
    state: State
    headers: Mapping[str, str] = field(default_factory=dict)
    last_error: str | None = None
    lease: str | None = None
    lease_expires_at: int | None = None
    payload_error: str | None = None
    seq: int | None = None
    headers_error: str | None = None


@dataclass(frozen=True, slots=True)
class PutResult:
    """What one put did: the message's ``id``, and ``created``: True when the put
    stored its message (a new id, or ``on_conflict="replace"`` of a stored one, which
    starts afresh), False when the id existed and ``on_conflict="ignore"`` kept the
    stored message unchanged (payload, due time and attempts as they were)."""

    id: str
    created: bool


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of one queue.

    Counts per state; ``next_due_at`` is the earliest due time (epoch ms) of a message
    waiting to be reserved, ready ones included (None when there is none); ``lag`` is
    how many seconds the oldest ready message is overdue (0.0 when none is ready).
    """

    scheduled: int = 0
    ready: int = 0
    active: int = 0
    dead: int = 0
    next_due_at: int | None = None
    lag: float = 0.0

    @property
    def total(self) -> int:
        """Every message of the queue, in any state."""
        return self.scheduled + self.ready + self.active + self.dead


@dataclass(frozen=True, slots=True)
class PutRequest:
    """One validated, serialized ``put``, as the facade hands it to a backend.

    At most one of ``delay_ms`` (relative to the backend's now) and ``at_ms`` (epoch
    ms) is set; neither means due now. Both are already rounded up by the facade.
    ``encoding`` is ``"bytes"`` for a payload the user gave as bytes, otherwise the
    name of the serializer that produced ``payload``. ``generated_id`` is True when the
    facade drew ``id`` (the caller gave none): time-ordered, with 79 random bits in
    each millisecond a thread draws in (:func:`delayq._fork.new_id`), which no stored
    message has,
    so a backend may store it without looking for one (``on_conflict`` cannot apply).
    """

    id: str
    payload: bytes
    encoding: str
    max_attempts: int
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_ms: int | None = None
    at_ms: int | None = None
    on_conflict: OnConflict = "ignore"
    generated_id: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """A message as a backend stores it.

    ``seq`` orders messages of equal ``due_at`` (put order); backends give each put,
    requeue, reschedule and death a new, increasing one. ``lease``/``lease_until``
    are set only while ``state`` is ``ACTIVE``. When a backend returns a record its
    ``state`` is the *observed* one (:func:`observe`: ``READY`` when due).
    """

    id: str
    payload: bytes
    encoding: str
    due_at: int
    seq: int
    attempts: int
    max_attempts: int
    state: State
    headers: Mapping[str, str] = field(default_factory=dict)
    last_error: str | None = None
    lease: str | None = None
    lease_until: int | None = None


# What the hot paths build by the thousand, without the frozen __init__ (see build):
# every field by keyword, a TypeError when one is missing, as the class would raise.
put_request: Callable[..., PutRequest] = builder(PutRequest)
new_record: Callable[..., Record] = builder(Record)
new_message: Callable[..., Message] = builder(Message)
#: ``dataclasses.replace`` of a record, for each transition below (see replacer).
replace_record: Callable[..., Record] = replacer(Record)


#: Each state by its value (a SQL row's state column).
_STATE_OF = {state.value: state for state in State}


def row_record(row: Sequence[Any], payload: bytes) -> Record:
    """The record of a SQL row of a message: its columns in Record's field order, the
    state as its value, the headers as the JSON :func:`load_headers` reads, ``payload``
    as the caller reads its column (SQLite's and PostgreSQL's drivers give them as
    ``bytes`` and ``memoryview``). Built without Record's frozen ``__init__``, with
    every field in order: once a claimed message."""
    return new_record(
        row[0],
        payload,
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        _STATE_OF[row[7]],
        load_headers(row[8]),
        row[9],
        row[10],
        row[11],
    )


class Now(NamedTuple):
    """The backend's clock read once, in epoch milliseconds, rounded both ways.

    ``floor`` is for checks ("is it due", "has the lease expired", the lag) and for
    "now" itself; ``ceil`` (``floor`` or ``floor + 1``) is where a computed time
    starts (``ceil + delay_ms``, ``ceil + lease_ms``), so it is never early.
    """

    floor: int
    ceil: int

    @classmethod
    def of_seconds(cls, seconds: float) -> Now:
        """The pair for a clock reading in epoch seconds (e.g. ``time.time()``)."""
        ms = seconds * 1000.0
        floor = math.floor(ms)
        return cls(floor, floor + 1 if ms > floor else floor)


class Claimed(NamedTuple):
    """What a claim that fires ahead answered (``reserve_ahead`` of a backend that
    fires ahead, :class:`~delayq.durable.backend.AsyncFiresAhead`): the records, the
    store's clock when it claimed them, in epoch microseconds (the floor), and
    ``arrived``, this process's ``time.monotonic()`` when the answer arrived, if the
    backend noted it as the reply came in (None: the holder takes it as it gets it,
    which may be a hop later: another thread's or task's)."""

    records: list[Record]
    now_us: int
    arrived: float | None = None


class Held(NamedTuple):
    """What :meth:`~delayq.AsyncQueue.reserve_ahead` claimed: the messages, and
    ``not_before``, this process's ``time.monotonic()`` instant before which none of
    them may be handed to its handler (0.0: all are due)."""

    messages: list[Message]
    not_before: float


def hold_seconds(claimed: Claimed) -> float:
    """How long the holder of a claim waits, counted from when the answer arrived,
    before it hands the records over: from the store's now to the latest due time
    among them (0.0 when all are due). The answer arrives after the store read its
    clock, so a record is never handed over before its due time by the store's clock,
    whatever the holder's own clock says."""
    if not claimed.records:
        return 0.0
    due_us = max(record.due_at for record in claimed.records) * 1000
    return max(due_us - claimed.now_us, 0) / 1e6


# -- helpers -----------------------------------------------------------------------


def resolve_due(delay_ms: int | None, at_ms: int | None, now: Now) -> int:
    """The due time for ``delay_ms`` or ``at_ms`` at ``now``; never before now.

    A positive delay counts from ``now.ceil`` (never early); no delay, a delay <= 0
    and a past ``at_ms`` mean due now, ``now.floor`` (so a message put without a
    delay can be reserved at once, in the same millisecond).
    """
    if at_ms is not None:
        due = at_ms
    elif delay_ms is not None and delay_ms > 0:
        due = now.ceil + delay_ms
    else:
        return now.floor
    return due if due > now.floor else now.floor


def settle(record: Record, now_ms: int) -> Record:
    """Apply a lease expiry that has already happened (the same record otherwise).

    An expired lease makes the message scheduled again, due at the lease expiry, with
    the attempt counted; or dead once ``attempts`` has reached ``max_attempts``.
    """
    if record.state is not _ACTIVE or record.lease_until is None:
        return record
    if record.lease_until > now_ms:
        return record
    if record.attempts >= record.max_attempts:
        return replace_record(
            record,
            state=_DEAD,
            lease=None,
            lease_until=None,
            last_error=LEASE_EXPIRED_ERROR,
        )
    return replace_record(
        record,
        state=_SCHEDULED,
        due_at=record.lease_until,
        lease=None,
        lease_until=None,
        last_error=LEASE_EXPIRED_ERROR,
    )


def is_due(record: Record, now_ms: int) -> bool:
    """True when a settled record may be reserved at ``now_ms``."""
    return record.state is _SCHEDULED and record.due_at <= now_ms


def observe(record: Record, now_ms: int, *, with_lease: bool = True) -> Record:
    """The record as a caller should see it at ``now_ms``: settled, ``READY`` when due,
    and without its lease token unless ``with_lease`` (``get`` and ``peek`` show when
    an active message's lease expires, never the token that settles it)."""
    record = settle(record, now_ms)
    if is_due(record, now_ms):
        record = replace_record(record, state=_READY)
    if not with_lease and record.lease is not None:
        record = replace_record(record, lease=None)
    return record


def matches_state(record: Record, state: State | None, now_ms: int) -> bool:
    """True when the settled record is in the observed ``state`` (None matches all)."""
    return state is None or observe(record, now_ms).state is state


# -- transitions -------------------------------------------------------------------


def apply_put(
    existing: Record | None,
    request: PutRequest,
    now: Now,
    seq: int,
    *,
    due_at: int | None = None,
) -> Record | None:
    """Store ``request`` over ``existing`` (the record with its id, if any).

    Returns the record to store, or None when nothing changes (``ignore`` of an
    existing id). ``error`` on an existing id, and ``replace`` of a message in flight,
    raise :class:`DuplicateId`. A replaced message starts afresh (attempts 0), due at
    ``due_at`` when the caller resolved it already (:func:`resolve_due` of the request
    at ``now``: the records of a batch then share one int), else as the request says.
    """
    if existing is not None:
        existing = settle(existing, now.floor)
        if request.on_conflict == "ignore":
            return None
        if request.on_conflict == "error":
            raise DuplicateId(f"a message with id {request.id!r} exists", request.id)
        if existing.state is _ACTIVE:
            raise DuplicateId(
                f"message {request.id!r} is in flight: it cannot be replaced", request.id
            )
    return Record(
        id=request.id,
        payload=request.payload,
        encoding=request.encoding,
        due_at=resolve_due(request.delay_ms, request.at_ms, now) if due_at is None else due_at,
        seq=seq,
        attempts=0,
        max_attempts=request.max_attempts,
        state=_SCHEDULED,
        headers=dict(request.headers) if request.headers else EMPTY_HEADERS,
    )


def apply_reserve(record: Record, now: Now, lease_ms: int, token: str) -> Record:
    """Claim a due record: ``ACTIVE`` under ``token`` until ``now.ceil + lease_ms`` (a
    lease never ends before ``lease_ms`` has passed), with one more attempt counted.
    The caller has checked :func:`is_due` at ``now.floor``."""
    # Every field in order (the claim's copy, once a message: no keywords to match).
    return new_record(
        record.id,
        record.payload,
        record.encoding,
        record.due_at,
        record.seq,
        record.attempts + 1,
        record.max_attempts,
        _ACTIVE,
        record.headers,
        record.last_error,
        token,
        now.ceil + lease_ms,
    )


def _held(record: Record | None, token: str, now_ms: int) -> Record:
    """The settled record if ``token`` still holds its lease; :class:`LeaseLost` if not."""
    if record is not None:
        record = settle(record, now_ms)
        if record.state is _ACTIVE and record.lease == token:
            return record
    raise LeaseLost("the lease expired or the message was reserved, acked or removed since")


def apply_ack(record: Record | None, token: str, now: Now) -> None:
    """Check that ``token`` holds the lease; the caller then deletes the record."""
    _held(record, token, now.floor)


def apply_ack_many(
    records: Mapping[str, Record], items: Iterable[tuple[str, str]], now: Now
) -> tuple[list[str], list[str]]:
    """:func:`apply_ack` for each ``(id, token)`` of ``items``, in order, over the stored
    ``records`` (by id). Returns ``(acked, lost)``: the ids the caller then deletes, and,
    in input order, the ids whose lease was not held (those change nothing). An id acked
    earlier in the same batch is gone for later items, so a duplicate counts as lost."""
    acked: list[str] = []
    lost: list[str] = []
    gone: set[str] = set()
    get, now_ms = records.get, now.floor
    for id, token in items:
        # _held's test, inline: a record still holds the lease when, settled at now_ms,
        # it is active under ``token``; settling changes only a record whose lease
        # expired by then, which is no longer active.
        record = None if id in gone else get(id)
        if (
            record is not None
            and record.state is _ACTIVE
            and record.lease == token
            and (record.lease_until is None or record.lease_until > now_ms)
        ):
            gone.add(id)
            acked.append(id)
        else:
            lost.append(id)
    return acked, lost


def apply_nack(
    record: Record | None,
    token: str,
    now: Now,
    *,
    delay_ms: int,
    error: str | None,
    seq: int,
    dead: bool = False,
) -> Record:
    """Give a held message back: scheduled in ``delay_ms``, or dead when ``dead`` or
    once ``attempts`` has reached ``max_attempts`` (due time kept); ``error`` becomes
    its ``last_error``. Either way a new ``seq`` and the lease dropped."""
    held = _held(record, token, now.floor)
    if dead or held.attempts >= held.max_attempts:
        return replace_record(
            held, state=_DEAD, lease=None, lease_until=None, last_error=error, seq=seq
        )
    return replace_record(
        held,
        state=_SCHEDULED,
        due_at=resolve_due(delay_ms, None, now),
        seq=seq,
        lease=None,
        lease_until=None,
        last_error=error,
    )


def apply_release(record: Record | None, token: str, now: Now) -> Record:
    """Give a held message back without charging the attempt: scheduled again with
    ``attempts - 1`` and the lease dropped; ``due_at``, ``seq`` and ``last_error``
    unchanged, so it keeps its place (exactly the record before its claim)."""
    held = _held(record, token, now.floor)
    return replace_record(
        held, state=_SCHEDULED, attempts=held.attempts - 1, lease=None, lease_until=None
    )


def apply_unclaim(record: Record | None, token: str) -> Record | None:
    """Undo a claim that no caller received (a reserve's answer its link gives back):
    the record before the claim, as :func:`apply_release` makes it, and also once the
    lease has run out, so long as the stored record still carries it (nothing settled
    the expiry since). None when it does not: acked, or settled and perhaps claimed
    again; the attempt then stays counted."""
    if record is None or record.state is not _ACTIVE or record.lease != token:
        return None
    return replace_record(
        record, state=_SCHEDULED, attempts=record.attempts - 1, lease=None, lease_until=None
    )


def apply_extend(record: Record | None, token: str, now: Now, lease_ms: int) -> Record:
    """Renew a held lease: it now expires at ``now.ceil + lease_ms``."""
    held = _held(record, token, now.floor)
    return replace_record(held, lease_until=now.ceil + lease_ms)


def can_cancel(record: Record | None, now: Now) -> bool:
    """True when the record exists and is not in flight (the caller then deletes it)."""
    return record is not None and settle(record, now.floor).state is not _ACTIVE


def apply_reschedule(record: Record | None, now: Now, due_at: int, seq: int) -> Record | None:
    """Move a scheduled or ready message to ``due_at`` (from :func:`resolve_due`;
    never before ``now.floor``), behind messages already due then; None when it is
    unknown, in flight or dead."""
    if record is None:
        return None
    record = settle(record, now.floor)
    if record.state is not _SCHEDULED:
        return None
    return replace_record(record, due_at=max(due_at, now.floor), seq=seq)


def apply_retry_dead(record: Record | None, now: Now, seq: int) -> Record | None:
    """Make a dead message ready now (``now.floor``) with ``attempts`` reset to 0
    (``last_error`` kept); None when the record is not dead."""
    if record is None:
        return None
    record = settle(record, now.floor)
    if record.state is not _DEAD:
        return None
    return replace_record(record, state=_SCHEDULED, due_at=now.floor, seq=seq, attempts=0)


def lag_of(oldest_ready: int | None, now_ms: int) -> float:
    """Seconds by which the oldest ready message (due at ``oldest_ready``, epoch ms)
    is overdue at ``now_ms``; 0.0 when none is ready."""
    return 0.0 if oldest_ready is None else max(0, now_ms - oldest_ready) / 1000.0


def compute_stats(records: Iterable[Record], now_ms: int) -> Stats:
    """Counts per observed state, the next due time and the lag, at ``now_ms``."""
    counts = dict.fromkeys(State, 0)
    next_due: int | None = None
    oldest_ready: int | None = None
    for stored in records:
        record = observe(stored, now_ms)
        counts[record.state] += 1
        if record.state is _SCHEDULED or record.state is _READY:
            if next_due is None or record.due_at < next_due:
                next_due = record.due_at
            if record.state is _READY and (oldest_ready is None or record.due_at < oldest_ready):
                oldest_ready = record.due_at
    return Stats(
        scheduled=counts[_SCHEDULED],
        ready=counts[_READY],
        active=counts[_ACTIVE],
        dead=counts[_DEAD],
        next_due_at=next_due,
        lag=lag_of(oldest_ready, now_ms),
    )
