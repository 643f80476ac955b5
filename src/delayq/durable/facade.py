"""What :class:`~delayq.Queue` and :class:`~delayq.AsyncQueue` share: argument checks,
payload encoding, the retry policy, and the mapping between records and messages.

Every check runs before the backend is called, so bad input raises and stores
nothing. ``TypeError`` means a wrong kind of value, ``ValueError`` a wrong value.
"""

from __future__ import annotations

import copy
import itertools
import random
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import TypeVar

from .._duration import DurationError, at_to_epoch, delay_to_seconds, seconds_to_ms
from .._fork import new_id, new_ids
from .._names import (
    MESSAGE_ID,
    QUEUE_NAME,
    InvalidQueueName,
    check_message_id,
    check_stored,
    queue_name_problem,
)
from ..errors import DuplicateId, QueueClosed
from .constants import (
    MAX_ACK_MANY,
    MAX_DUE_BUCKETS,
    MAX_DUE_HORIZON,
    MAX_DUE_MS,
    MAX_ERROR_LENGTH,
    MAX_MESSAGE_HEADER_BYTES,
    MAX_MESSAGE_HEADERS,
    MAX_PEEK_LIMIT,
    MAX_RESERVE_WAIT,
)
from .message import (
    HeadersTooLarge,
    Message,
    OnConflict,
    PutRequest,
    Record,
    State,
    new_message,
    put_request,
    read_headers,
)
from .registry import default_url, redact_url, scheme_of
from .retry import RetryPolicy
from .serializer import Codec

__all__ = ["QueueBase", "build_request", "check_identifier"]

_Q = TypeVar("_Q", bound="QueueBase")
_ON_CONFLICT = ("ignore", "replace", "error")
_PUT_KEYS = frozenset(("payload", "delay", "at", "id", "on_conflict", "max_attempts", "headers"))


def check_identifier(kind: str, value: object) -> str:
    """A name a read may address (a task name, a stored id): a non-empty str of at most
    255 characters, no NUL (:func:`delayq._names.check_stored`)."""
    return check_stored(kind, value)


def check_address(value: object) -> str:
    """A message id that a read (get, cancel, reschedule, retry_dead) may look up."""
    return check_stored(MESSAGE_ID, value)


def check_seq(value: object, kind: str = "after_seq") -> int:
    """A ``seq`` (or a time) to page after (``dead(after_seq=...)``): an int >= 0."""
    if type(value) is not int:
        raise TypeError(f"{kind} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{kind} must be >= 0, got {value}")
    return value


def check_position(state: State | None, value: object) -> tuple[int, ...]:
    """A place in ``peek(state)``'s order to page after: two ints >= 0 (a time and a
    seq), one (a seq) for the dead."""
    size = 1 if state is State.DEAD else 2
    if type(value) is not tuple or len(value) != size:
        shape = "(seq,)" if size == 1 else "(due_at or lease_expires_at, seq)"
        raise TypeError(f"after must be a tuple {shape}, not {value!r:.80}")
    for part in value:
        check_seq(part, "after")
    return value


def duplicate_item(requests: list[PutRequest], exc: DuplicateId) -> DuplicateId:
    """The :class:`DuplicateId` of a batch, with the index of the item it is about
    (the first item of that id that does not ignore a conflict) in front, as
    :func:`item_error` does for the other faults of an item."""
    for index, request in enumerate(requests):
        if request.id == exc.id and request.on_conflict != "ignore":
            return DuplicateId(f"item {index}: {exc}", exc.id)
    return exc


def item_error(index: int, exc: Exception) -> Exception:
    """``exc`` (a TypeError or ValueError of one item of a batch) with the item's index
    in front of its message, ``item 3: ...``: the one format of every face."""
    message = f"item {index}: {exc}"
    try:
        return type(exc)(message)
    except Exception:  # an exception class that takes other arguments
        return (TypeError if isinstance(exc, TypeError) else ValueError)(message)


def check_int(kind: str, value: object, low: int) -> int:
    """An int (not a bool) >= ``low``."""
    if type(value) is not int:
        raise TypeError(f"{kind} must be an int, not {type(value).__name__}")
    if value < low:
        raise ValueError(f"{kind} must be >= {low}, got {value}")
    return value


def check_headers(headers: object) -> dict[str, str]:
    """A mapping of str to str (copied), of at most MAX_MESSAGE_HEADERS entries and
    MAX_MESSAGE_HEADER_BYTES of names and values (UTF-8)."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a dict of str to str, not {type(headers).__name__}")
    chars = 0
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"headers must map str to str, got {key!r}: {value!r:.80}")
        chars += len(key) + len(value)
    if len(headers) > MAX_MESSAGE_HEADERS:
        raise HeadersTooLarge(
            f"a message has at most {MAX_MESSAGE_HEADERS} headers, got {len(headers)}"
        )
    if chars * 4 > MAX_MESSAGE_HEADER_BYTES:  # else surely within it: 4 bytes a char at most
        size = sum(len(_utf8(key)) + len(_utf8(value)) for key, value in headers.items())
        if size > MAX_MESSAGE_HEADER_BYTES:
            raise HeadersTooLarge(
                f"a message's headers are {size} bytes (names and values, UTF-8), "
                f"the limit is {MAX_MESSAGE_HEADER_BYTES}"
            )
    return dict(headers)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def check_seconds(kind: str, value: object, *, positive: bool) -> float:
    """Seconds (a number, timedelta or duration string), > 0 or >= 0."""
    seconds = delay_to_seconds(value, kind)
    if seconds < 0 or (positive and seconds == 0):
        raise DurationError(
            f"{kind} must be {'> 0' if positive else '>= 0'} seconds, got {value!r}", kind
        )
    return seconds


def to_ms(seconds: float, kind: str = "delay") -> int:
    """Seconds as whole milliseconds, rounded up (a due time is never early).

    ValueError beyond the latest due time (1e308 seconds is finite, but not once
    multiplied by 1000); a value as far below 0 comes out as ``-MAX_DUE_MS`` (every
    caller reads a negative as "now")."""
    product = seconds * 1000.0
    if not product <= MAX_DUE_MS:  # NaN included
        raise DurationError(
            f"{kind} of {seconds!r} seconds is out of range (past the year 9999)", kind
        )
    if product < -MAX_DUE_MS:
        return -MAX_DUE_MS
    return seconds_to_ms(seconds)


def epoch_of(at: object) -> float:
    """``at`` (an aware datetime or epoch seconds) as epoch seconds; ValueError for an
    int too large for a float."""
    try:
        return at_to_epoch(at)
    except OverflowError:
        raise DurationError(f"at= is out of range: an int of {len(str(at))} digits", "at") from None


def due_arguments(delay: object, at: object) -> tuple[int | None, int | None]:
    """``(delay_ms, at_ms)`` for ``delay=``/``at=``; negative or past means due now."""
    if at is not None:
        if delay is not None:
            raise ValueError("give delay= or at=, not both")
        return None, max(0, to_ms(epoch_of(at), "at"))
    if delay is None:
        return None, None
    return max(0, to_ms(delay_to_seconds(delay))), None


def reschedule_arguments(delay: object, at: object) -> tuple[int | None, int | None]:
    """``(delay_ms, at_ms)`` of a reschedule, which needs one of them: a reschedule
    without a time is a mistake (a forgotten argument), not "due now"."""
    if delay is None and at is None:
        raise TypeError("reschedule needs the new due time: delay or at (a delay of 0 means now)")
    return due_arguments(delay, at)


def error_text(error: object) -> str | None:
    """``last_error`` for ``nack(error=...)``: a str, or an exception as its one-line
    summary (``KeyError: 'zz'``) followed, when it was raised, by its traceback (the
    whole chain); cut to 8192 characters, keeping the summary and the traceback's end
    (the exception raised last, where it was raised)."""
    if error is None:
        return None
    if isinstance(error, BaseException):
        summary = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        if error.__traceback__ is None:
            return summary[:MAX_ERROR_LENGTH]
        trace = "".join(traceback.format_exception(error)).rstrip("\n")
        text = f"{summary}\n\n{trace}"
        if len(text) <= MAX_ERROR_LENGTH:
            return text
        head = f"{summary[: MAX_ERROR_LENGTH // 4]}\n\n...\n"
        return head + trace[len(head) - MAX_ERROR_LENGTH :]
    if isinstance(error, str):
        return error[:MAX_ERROR_LENGTH]
    raise TypeError(f"error must be a str or an exception, not {type(error).__name__}")


def build_request(  # noqa: PLR0917 (positional: put_many calls it once per item)
    codec: Codec,
    default_attempts: int,
    payload: object,
    delay: object = None,
    at: object = None,
    id: object = None,
    on_conflict: object = "ignore",
    max_attempts: object = None,
    headers: object = None,
    drawn: str | None = None,
) -> PutRequest:
    """The checked request of a put, its payload encoded by ``codec`` (an id drawn when
    ``id`` is None: ``drawn`` if given, a batch's id drawn ahead; ``default_attempts``
    when ``max_attempts`` is None): every check of a put, for the queue faces and for
    writers outside them (the PostgreSQL backend's ``enqueue``)."""
    if on_conflict not in _ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {_ON_CONFLICT}, got {on_conflict!r}")
    mode: OnConflict = on_conflict  # type: ignore[assignment]
    message_id = (drawn or new_id()) if id is None else check_message_id(id)
    attempts = (
        default_attempts if max_attempts is None else check_int("max_attempts", max_attempts, 1)
    )
    header_map = {} if headers is None else check_headers(headers)
    if delay is None and at is None:
        delay_ms = at_ms = None
    else:
        delay_ms, at_ms = due_arguments(delay, at)
    data, encoding = codec.encode(payload)
    return put_request(
        id=message_id,
        payload=data,
        encoding=encoding,
        max_attempts=attempts,
        headers=header_map,
        delay_ms=delay_ms,
        at_ms=at_ms,
        on_conflict=mode,
        generated_id=id is None,
    )


class QueueBase:
    """The shared, I/O-free half of the two queue facades."""

    def __init__(
        self,
        url: str | None,
        name: str,
        retry: RetryPolicy | None,
        serializer: object,
        max_payload: int | None,
    ) -> None:
        if url is None:
            url = default_url()
        scheme_of(url)  # UnsupportedURL before anything else
        self._url = url
        self._name = check_stored(QUEUE_NAME, name)
        self._name_problem = queue_name_problem(name)
        if retry is None:
            retry = RetryPolicy()
        elif not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        self._retry = retry
        self._codec = Codec(serializer, max_payload)
        self._closed = False
        self._owns_backend = True

    @property
    def name(self) -> str:
        """The queue's name (its namespace in the backend)."""
        return self._name

    @property
    def url(self) -> str:
        """The URL the backend was opened from."""
        return self._url

    @property
    def retry(self) -> RetryPolicy:
        """The queue's retry policy (``max_attempts`` default and ``nack`` backoff)."""
        return self._retry

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def _sibling(self: _Q, name: str) -> _Q:
        """A copy of this queue named ``name`` that shares the backend without owning it."""
        self._check_open()
        sibling = copy.copy(self)
        other: QueueBase = sibling  # an instance of this class: its fields are ours to set
        other._name = check_stored(QUEUE_NAME, name)
        other._name_problem = queue_name_problem(name)
        other._owns_backend = False
        return sibling

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"queue {self._name!r} is closed")

    def _check_writable(self) -> None:
        """Open, and named so that a put may write to it (:mod:`delayq._names`): a
        queue stored under a name an older delayq accepted can be read, not written."""
        if self._closed:
            raise QueueClosed(f"queue {self._name!r} is closed")
        if self._name_problem is not None:
            raise InvalidQueueName(self._name_problem)

    def _request(  # noqa: PLR0917 (positional: put_many calls it once per item)
        self,
        payload: object,
        delay: object = None,
        at: object = None,
        id: object = None,
        on_conflict: object = "ignore",
        max_attempts: object = None,
        headers: object = None,
    ) -> PutRequest:
        """The checked, encoded request of a put (an id drawn when ``id`` is None)."""
        return build_request(
            self._codec,
            self._retry.max_attempts,
            payload,
            delay,
            at,
            id,
            on_conflict,
            max_attempts,
            headers,
        )

    def _requests(self, items: object) -> list[PutRequest]:
        if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
            raise TypeError(f"put_many takes a list of dicts, not {type(items).__name__}")
        requests: list[PutRequest] = []
        append, codec, attempts = requests.append, self._codec, self._retry.max_attempts
        encode = codec.encode
        # The ids of the items that give none, drawn at the first such item for every
        # item left (new_ids: a third of new_id's cost each).
        drawn: Iterator[str] = iter(())
        size = len(items) if isinstance(items, Sized) else None
        for index, item in enumerate(items):
            try:
                if type(item) is not dict and not isinstance(item, Mapping):  # ABC: slow
                    raise TypeError(f"a put_many item is a dict, not a {type(item).__name__}")
                keys = len(item)
                if keys == 1 and "payload" in item:  # every option at its default
                    item_attempts = attempts
                elif keys == 2 and "payload" in item and "max_attempts" in item:
                    # App.send_many's items: a task's attempts, every other option left out
                    item_attempts = item["max_attempts"]
                    item_attempts = (
                        attempts
                        if item_attempts is None
                        else check_int("max_attempts", item_attempts, 1)
                    )
                else:
                    if item.get("id") is None:  # its id drawn in line with the others'
                        id = next(drawn, None)
                        if id is None:
                            drawn = iter(new_ids(64 if size is None else size - index))
                            id = next(drawn)
                        append(self._item_request(item, id))
                    else:
                        append(self._item_request(item))
                    continue
                # build_request(codec, attempts, item["payload"]), inline: what a put of
                # its payload alone checks and stores.
                data, encoding = encode(item["payload"])
                id = next(drawn, None)
                if id is None:
                    drawn = iter(new_ids(64 if size is None else size - index))
                    id = next(drawn)
                append(
                    put_request(id, data, encoding, item_attempts, {}, None, None, "ignore", True)
                )
            except (TypeError, ValueError) as exc:
                raise item_error(index, exc) from None
        return requests

    def _item_request(self, item: Mapping[str, object], drawn: str | None = None) -> PutRequest:
        """The request of a put_many item that sets options beyond max_attempts (its id
        ``drawn`` with the batch's when it gives none, so that they rise in order)."""
        if not item.keys() <= _PUT_KEYS:
            unknown = sorted(set(item) - _PUT_KEYS)
            raise TypeError(f"unknown keys {unknown}")
        if "payload" not in item:
            raise TypeError("no 'payload'")
        get = item.get
        # The item's values as _request(**item) would get them, in order, without a
        # dict to unpack or keywords to match (nor _request's frame).
        return build_request(
            self._codec,
            self._retry.max_attempts,
            item["payload"],
            get("delay"),
            get("at"),
            get("id"),
            get("on_conflict", "ignore"),
            get("max_attempts"),
            get("headers"),
            drawn,
        )

    def _reserve_arguments(
        self, wait: object, lease: object, max: object
    ) -> tuple[float | None, int, int]:
        wait_s = None if wait is None else check_seconds("wait", wait, positive=False)
        if wait_s is not None and wait_s > MAX_RESERVE_WAIT:
            raise ValueError(
                f"wait must be at most {MAX_RESERVE_WAIT:.0f} seconds (a century), got "
                f"{wait!r}: wait=None waits until a message is due"
            )
        lease_ms = to_ms(check_seconds("lease", lease, positive=True), "lease")
        return wait_s, lease_ms, check_int("max", max, 1)

    def _held(self, msg: object) -> tuple[str, str]:
        if not isinstance(msg, Message):
            raise TypeError(f"expected a Message from reserve(), not {type(msg).__name__}")
        if msg.queue != self._name:
            raise ValueError(
                f"message {msg.id!r} belongs to queue {msg.queue!r}, not {self._name!r}"
            )
        if msg.lease is None:
            raise ValueError(
                f"message {msg.id!r} carries no lease: only messages from reserve() "
                "can be acked, nacked, released or extended"
            )
        return msg.id, msg.lease

    def _held_many(self, msgs: object) -> list[tuple[str, str]]:
        """``(id, token)`` of each message for ``ack_many``: every one a leased
        :class:`Message` of this queue, at most :data:`MAX_ACK_MANY` of them."""
        if isinstance(msgs, (str, bytes, Mapping, Message)) or not isinstance(msgs, Iterable):
            raise TypeError(
                f"ack_many takes a list of Messages from reserve(), not {type(msgs).__name__}"
            )
        name, held, taken = self._name, self._held, iter(msgs)
        # Each message checked in turn (what _held checks, inline for the common case: a
        # worker's batches); one more after the most is refused before it is looked at.
        items = [
            (msg.id, msg.lease)
            if type(msg) is Message and msg.queue == name and msg.lease is not None
            else held(msg)
            for msg in itertools.islice(taken, MAX_ACK_MANY)
        ]
        for _ in taken:
            raise ValueError(f"ack_many takes at most {MAX_ACK_MANY} messages per call")
        return items

    def _nack_arguments(
        self, msg: Message, delay: object, error: object, dead: object
    ) -> tuple[int, str | None, bool]:
        """``(delay_ms, error text, dead)`` for ``nack``; a dead message has no delay."""
        if type(dead) is not bool:
            raise TypeError(f"dead must be True or False, not {type(dead).__name__}")
        text = error_text(error)
        if dead:
            if delay is not None:
                raise ValueError("give delay= or dead=True, not both")
            return 0, text, True
        if delay is None:
            seconds = self._retry.delay_for(max(msg.attempts, 1), random.random())
            return to_ms(seconds), text, False
        return max(0, to_ms(delay_to_seconds(delay))), text, False

    @staticmethod
    def _limit(limit: object) -> int:
        return check_int("limit", limit, 1)

    @classmethod
    def _peek_arguments(cls, state: object, limit: object) -> tuple[State | None, int]:
        """``(state, limit)`` for ``peek``: a State, its name or None; 1..10_000."""
        checked = cls._state(state)
        count = check_int("limit", limit, 1)
        if count > MAX_PEEK_LIMIT:
            raise ValueError(f"limit must be <= {MAX_PEEK_LIMIT}, got {count}")
        return checked, count

    @staticmethod
    def _due_count_arguments(horizon: object, buckets: object) -> tuple[int, int]:
        """``(horizon_ms, buckets)`` for ``due_counts``: a horizon > 0 and at most 366
        days (seconds, timedelta or a duration string); 1..1000 buckets."""
        seconds = check_seconds("horizon", horizon, positive=True)
        if seconds > MAX_DUE_HORIZON:
            raise ValueError(f"horizon must be at most 366 days, got {horizon!r}")
        count = check_int("buckets", buckets, 1)
        if count > MAX_DUE_BUCKETS:
            raise ValueError(f"buckets must be <= {MAX_DUE_BUCKETS}, got {count}")
        return to_ms(seconds, "horizon"), count

    @staticmethod
    def _state(state: object) -> State | None:
        if state is None or isinstance(state, State):
            return state
        if isinstance(state, str):
            try:
                return State(state.lower())
            except ValueError:
                pass
        raise ValueError(f"state must be a delayq.State or None, got {state!r}")

    @staticmethod
    def _ids(ids: object) -> list[str] | None:
        if ids is None:
            return None
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"ids must be a list of str or None, not {type(ids).__name__}")
        return [check_address(value) for value in ids]

    def _message(self, record: Record) -> Message:
        payload, payload_error = self._codec.read(record.payload, record.encoding)
        headers, headers_error = read_headers(record.headers)
        # Every field in the order of Message's (one a reserved message: no keywords).
        return new_message(
            record.id,
            self._name,
            payload,
            record.due_at,
            record.attempts,
            record.max_attempts,
            record.state,
            headers,
            record.last_error,
            record.lease,
            record.lease_until,
            payload_error,
            record.seq,
            headers_error,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self._name!r} at {redact_url(self._url)!r} {state}>"
