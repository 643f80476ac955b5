"""What crosses the broker, in msgpack: records, put requests, the arguments of a
request, the outcome of its reply, and the log's entries.

A record is a 12-item array in the order of :class:`~delayq.durable.message.Record`'s
fields, a put request an 8-item array in the order of
:class:`~delayq.durable.message.PutRequest`'s; ``State`` travels as its value.

What a decoded record keeps is shared where it can be, as the scheduler holds a
million of them: the encoding is interned (msgpack makes a new str of each; one that
is not a str, which no client sends, is kept as it came), no headers are
:data:`~delayq.durable.message.EMPTY_HEADERS`, and a record decoded with others
(:func:`decode_records`: a logged entry's) shares the due time, lease expiry and last
error of the one before it when they are equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from sys import intern
from typing import Any

import msgpack

from ...durable.message import (
    EMPTY_HEADERS,
    PutRequest,
    Record,
    State,
    Stats,
    new_record,
    put_request,
)
from ...errors import DuplicateId, LeaseLost, QueueClosed
from ._transport import LogFull

__all__ = [
    "decode_outcome",
    "decode_record",
    "decode_records",
    "decode_requests",
    "encode_outcome",
    "encode_record",
    "encode_requests",
    "error_reply",
    "pack",
    "packer",
    "raise_error",
    "reserve_items",
    "unpack",
    "unpack_each",
]


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)


def packer() -> Callable[[Any], bytes]:
    """:func:`pack` for one caller that packs many small values, one at a time: a
    packer of its own (``packb`` makes one a call, most of a small value's cost; one
    is not to be shared between threads)."""
    return msgpack.Packer(use_bin_type=True).pack  # type: ignore[no-any-return]


def unpack_each(blobs: list[bytes]) -> list[Any]:
    """:func:`unpack` of each of ``blobs``, read by one unpacker (the many small values
    of a far page: ``unpackb`` makes an unpacker a call)."""
    unpacker = msgpack.Unpacker(raw=False, use_list=True, strict_map_key=False)
    unpacker.feed(b"".join(blobs))
    return list(unpacker)


#: Each state by its value (``State(value)`` goes through the enum's lookup: a
#: tenth of a decoded record's cost).
_STATES = {state.value: state for state in State}


def encode_record(r: Record) -> list[Any]:
    return [
        r.id,
        r.payload,
        r.encoding,
        r.due_at,
        r.seq,
        r.attempts,
        r.max_attempts,
        r.state.value,
        dict(r.headers) if r.headers else {},
        r.last_error,
        r.lease,
        r.lease_until,
    ]


def decode_record(item: Sequence[Any]) -> Record:
    return decode_records((item,))[0]


def decode_records(items: Iterable[Sequence[Any]]) -> list[Record]:
    """The records ``items`` encode; one that has the due time, lease expiry or last
    error of the record before it holds that record's object (a logged put_many's
    records are due at one time: 32 B a record)."""
    records: list[Record] = []
    due = until = error = None
    for item in items:
        (id, payload, encoding, due_at, seq, attempts, max_attempts, state) = item[:8]
        headers, last_error, lease, lease_until = item[8:12]
        if due_at == due:
            due_at = due
        else:
            due = due_at
        if lease_until == until:
            lease_until = until
        else:
            until = lease_until
        if last_error == error:
            last_error = error
        else:
            error = last_error
        records.append(  # in Record's field order (positional: the cheaper call)
            new_record(
                id,
                payload,
                intern(encoding) if type(encoding) is str else encoding,
                due_at,
                seq,
                attempts,
                max_attempts,
                _STATES[state],
                headers or EMPTY_HEADERS,
                last_error,
                lease,
                lease_until,
            )
        )
    return records


def encode_requests(requests: Sequence[PutRequest]) -> list[list[Any]]:
    return [
        [
            r.id,
            r.payload,
            r.encoding,
            r.max_attempts,
            dict(r.headers),
            r.delay_ms,
            r.at_ms,
            r.on_conflict,
        ]
        for r in requests
    ]


def decode_requests(items: Sequence[Sequence[Any]]) -> list[PutRequest]:
    return [
        put_request(
            id=id,
            payload=payload,
            encoding=intern(encoding) if type(encoding) is str else encoding,
            max_attempts=max_attempts,
            headers=headers,
            delay_ms=delay_ms,
            at_ms=at_ms,
            on_conflict=on_conflict,
            generated_id=False,
        )
        for (id, payload, encoding, max_attempts, headers, delay_ms, at_ms, on_conflict) in items
    ]


_RECORD_LISTS = frozenset({"reserve", "dead", "peek"})


def encode_outcome(op: str, value: Any) -> Any:
    """``value``, the outcome of ``op`` on the scheduler's state, as msgpack takes it."""
    if op in _RECORD_LISTS:
        return [encode_record(r) for r in value]
    if op == "get":
        return None if value is None else encode_record(value)
    if op == "stats":
        s: Stats = value
        return [s.scheduled, s.ready, s.active, s.dead, s.next_due_at, s.lag]
    if op == "nack":
        return value.value
    return value


def reserve_items(kind: str, body: bytes) -> Any:
    """The encoded records a reserve's reply carries: an ``ok`` reply's body is their
    list, a ``held`` one's ``[how long to hold them, their list]``."""
    data = unpack(body)
    return data if kind == "ok" else data[1]


def decode_outcome(op: str, data: Any) -> Any:
    """The outcome of ``op`` as the contract returns it, from :func:`encode_outcome`."""
    if op in _RECORD_LISTS:
        return decode_records(data)
    if op == "get":
        return None if data is None else decode_record(data)
    if op == "stats":
        return Stats(*data)
    if op == "nack":
        return State(data)
    if op == "due_counts":
        return data[0], data[1]
    return data


_ERRORS: dict[str, type[Exception]] = {
    "DuplicateId": DuplicateId,
    "LeaseLost": LeaseLost,
    "LogFull": LogFull,
    "QueueClosed": QueueClosed,
}


def error_reply(exc: Exception) -> tuple[str, Any]:
    """The reply's kind and body for an error of the contract."""
    return type(exc).__name__, [str(exc), getattr(exc, "id", None)]


def raise_error(kind: str, body: Any) -> None:
    """Raise the error a reply of ``kind`` carries (a kind delayq does not know: a
    RuntimeError naming it)."""
    message, id = body
    error = _ERRORS.get(kind)
    if error is DuplicateId:
        raise DuplicateId(message, id)
    if error is None:
        raise RuntimeError(f"the scheduler failed: {kind}: {message}")
    raise error(message)
