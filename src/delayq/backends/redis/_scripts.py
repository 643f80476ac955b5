"""The Redis side of the backend: key names, the Lua scripts, and the codecs between
Python values and script arguments and replies, shared by both faces (no I/O here).

Every state change is one script of ``scripts/*.lua`` and takes the same six KEYS of one
queue shard (:func:`queue_keys`). The files are the source of two forms: a script for
EVALSHA, the shared prelude ``lib.lua`` followed by its body (:func:`script_source`),
and one Redis Functions library of them all (:func:`library_source`), in which the
prelude is compiled and its functions defined once per server instead of on every
call. Replies are decoded here into
:class:`~delayq.durable.message.Record` / :class:`~delayq.durable.message.Stats`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ...durable.message import (
    EMPTY_HEADERS,
    LEASE_EXPIRED_ERROR,
    PutRequest,
    Record,
    State,
    Stats,
    lag_of,
    load_headers,
    new_record,
)
from ...durable.serializer import RAW_ENCODING
from ...errors import DuplicateId
from ._settings import REDIS_KEY_SUFFIXES

__all__ = [
    "DRAINING_SCRIPTS",
    "READ_ONLY_SCRIPTS",
    "RESEND_SAFE",
    "SCRIPT_NAMES",
    "Claim",
    "decode_claim",
    "decode_due_counts",
    "decode_record",
    "decode_stats",
    "function_name",
    "library_source",
    "nack_args",
    "pack_id",
    "put_args",
    "queue_keys",
    "queue_names",
    "queue_of_key",
    "queues_pattern",
    "raise_put_status",
    "script_source",
    "unpack_id",
]

#: Every script of ``scripts/`` but the prelude, by the name the backends call it.
SCRIPT_NAMES = (
    "ack",
    "ack_many",
    "cancel",
    "dead",
    "due_counts",
    "extend",
    "get",
    "nack",
    "peek",
    "purge",
    "put",
    "put_one",
    "release",
    "reschedule",
    "reserve",
    "retry_dead",
    "stats",
    "take_seqs",
    "wake",
)

#: The scripts that write nothing: their library functions carry the ``no-writes`` flag.
READ_ONLY_SCRIPTS = frozenset(("due_counts", "get", "peek"))

#: The scripts that run even when Redis is out of memory (``maxmemory`` reached with
#: ``noeviction``): their functions carry the ``allow-oom`` flag. They free memory (ack,
#: ack_many, cancel, purge) or change it by a few bytes for each message they touch
#: (claiming, renewing, releasing and settling leases; the wake-up marker), so a full
#: Redis refuses new messages but its consumers still drain it; without the flag a claim
#: was refused too and nothing could ever free the memory. Scripts that store a message
#: or an error text (put, nack, reschedule, retry_dead) are refused, as Redis means.
DRAINING_SCRIPTS = frozenset(
    ("ack", "ack_many", "cancel", "dead", "extend", "purge", "release", "reserve", "stats", "wake")
)

#: The flag of each script's library function that has one.
_FLAGS = dict.fromkeys(READ_ONLY_SCRIPTS, "no-writes") | dict.fromkeys(
    DRAINING_SCRIPTS, "allow-oom"
)

#: The scripts sent again after their reply was lost (the only list of them, used by
#: every face): a second run changes nothing and answers as the first would have. The
#: read-only ones, ``stats``/``dead`` (they only settle expired leases, which a second
#: run finds settled), ``extend`` (the lease is renewed from the new now), ``wake`` (the
#: marker holds at most one element) and ``take_seqs`` (the seqs of the lost run are
#: skipped: gaps in the counter are harmless). Any other script may have run when its
#: reply is lost: it is sent again only when it surely was not sent.
RESEND_SAFE = READ_ONLY_SCRIPTS | frozenset(("dead", "extend", "stats", "take_seqs", "wake"))

_STATES = {state.value: state for state in State}
_CONFLICT = {"ignore": b"i", "replace": b"r", "error": b"e"}
#: put.lua's on_conflict of a uniform batch whose ids the facade drew: stored unseen.
_DRAWN = b"n"
#: The default serializer's name is stored as an empty string (a few bytes a message).
_DEFAULT_ENCODING = "json"
_NACK_STATES = {1: State.SCHEDULED, 3: State.DEAD}


def queue_keys(prefix: str, queue: str, shard: int = 0) -> list[bytes]:
    """The KEYS of every script for one shard of ``queue``: ``<prefix>:{<queue>:<shard>}:
    <suffix>`` for the suffixes msg, due, lease, dead, seq, wake.

    The braces make the queue shard one cluster hash slot. The shard index is always
    present (a single-node queue is shard 0), so the key names of queue ``"a:1"`` and of
    shard 1 of queue ``"a"`` differ; no suffix holds a brace, so two queues never share a
    key even when a name holds ``}`` (which only narrows its hash tag).
    """
    base = f"{prefix}:{{{queue}:{shard}}}:".encode("utf-8", "surrogatepass")
    return [base + suffix for suffix in REDIS_KEY_SUFFIXES]


_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
_MSG_TAIL = "}:msg"


def queues_pattern(prefix: str) -> str:
    """The SCAN MATCH pattern of every queue shard's ``msg`` key under ``prefix``: the
    prefix with its glob characters escaped, then ``:{*}:msg``."""
    return _GLOB_SPECIAL.sub(r"\\\1", prefix) + ":{*" + _MSG_TAIL


def queue_of_key(prefix: str, key: bytes) -> str | None:
    """The queue whose shard's ``msg`` key ``key`` is (the inverse of
    :func:`queue_keys`), or None for a key of another layout."""
    text = key.decode("utf-8", "surrogatepass")
    head = prefix + ":{"
    if not (text.startswith(head) and text.endswith(_MSG_TAIL)):
        return None
    queue, colon, shard = text[len(head) : -len(_MSG_TAIL)].rpartition(":")
    if not (colon and queue and shard.isascii() and shard.isdigit()):
        return None
    return queue


def queue_names(prefix: str, keys: Iterable[bytes]) -> list[str]:
    """The sorted queue names of the ``msg`` keys ``keys`` (a SCAN of
    :func:`queues_pattern`): each queue once, whatever its shards."""
    names = {queue_of_key(prefix, key) for key in keys}
    return sorted(name for name in names if name is not None)


def pack_id(id: str) -> bytes:
    """The stored form of a message id: a generated id (32 lowercase hex digits) as NUL
    plus its 16 bytes, which saves 32 bytes of memory per message (ids never hold NUL,
    so the two forms cannot meet); any other id as UTF-8."""
    if len(id) == 32:
        # fromhex() also takes upper case and spaces: the round trip rules them out.
        try:
            raw = bytes.fromhex(id)
        except ValueError:
            pass
        else:
            if raw.hex() == id:
                return b"\x00" + raw
    return id.encode("utf-8", "surrogatepass")


def _packed_id(request: PutRequest) -> bytes:
    """:func:`pack_id` of a request's id; one the facade drew (``generated_id``: 32
    lowercase hex digits, :func:`delayq._fork.new_id`) without checking its form."""
    if request.generated_id:
        return b"\x00" + bytes.fromhex(request.id)
    return pack_id(request.id)


def unpack_id(data: bytes) -> str:
    """The inverse of :func:`pack_id`."""
    if len(data) == 17 and data[0] == 0:
        return data[1:].hex()
    return data.decode("utf-8", "surrogatepass")


def _read(name: str) -> str:
    folder = resources.files(__package__).joinpath("scripts")
    return folder.joinpath(f"{name}.lua").read_text("utf-8")


def _prelude() -> str:
    return (
        _read("lib")
        .replace("@LEASE_EXPIRED@", json.dumps(LEASE_EXPIRED_ERROR))
        .replace("@RAW_ENCODING@", json.dumps(RAW_ENCODING))
    )


@cache
def script_source(name: str) -> str:
    """The text sent to Redis for script ``name``: the prelude, then the script."""
    return _prelude() + _read(name)


#: The line of ``lib.lua`` that binds the key aliases from KEYS (a script's globals).
_ALIASES = "K_MSG, K_DUE, K_LEASE, K_DEAD, K_SEQ, K_WAKE"
_BINDING = f"local {_ALIASES} = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]\n"


@cache
def library_source() -> tuple[str, str]:
    """The library's name and code: ``#!lua name=delayq_<hash>``, then the prelude with
    the key aliases declared (not bound), then one function per script, which binds the
    aliases from its KEYS and runs the script's body with its ARGV.

    The name holds a hash of the code, so versions of delayq sharing a server each
    load their own library (``FUNCTION LOAD REPLACE`` of the same code is harmless).
    The aliases are upvalues of the library shared by its functions; binding them at
    the start of every call is safe as a function runs alone and to its end.
    """
    prelude = _prelude()
    if prelude.count(_BINDING) != 1:
        raise RuntimeError("lib.lua must bind the key aliases from KEYS on one line")
    parts = [prelude.replace(_BINDING, f"local {_ALIASES}\n")]
    for name in SCRIPT_NAMES:
        callback = f"function(KEYS, ARGV)\n{_BINDING[len('local ') :]}{_read(name)}\nend"
        flag = _FLAGS.get(name)
        if flag is not None:
            parts.append(
                f"redis.register_function{{function_name='@LIB@_{name}', callback={callback}, "
                f"flags={{'{flag}'}}}}\n"
            )
        else:
            parts.append(f"redis.register_function('@LIB@_{name}', {callback})\n")
    body = "\n".join(parts)
    library = "delayq_" + hashlib.sha1(body.encode("utf-8")).hexdigest()[:16]
    return library, f"#!lua name={library}\n" + body.replace("@LIB@", library)


def function_name(script: str) -> str:
    """The library function that runs ``script`` (a name of :data:`SCRIPT_NAMES`)."""
    return f"{library_source()[0]}_{script}"


def _uniform(requests: Sequence[PutRequest]) -> tuple[bool, bool, bool]:
    """Whether the requests share every value but their id, payload and due time (and
    have no headers: equal dicts may still differ in order, so in their JSON), whether
    they share their due time too, and whether the facade drew every id."""
    first = requests[0]
    on_conflict, delay_ms, at_ms = first.on_conflict, first.delay_ms, first.at_ms
    max_attempts, encoding = first.max_attempts, first.encoding
    same_due = drawn = True
    for request in requests:
        if (
            request.headers
            or request.on_conflict != on_conflict
            or request.max_attempts != max_attempts
            or request.encoding != encoding
        ):
            return False, False, False
        if same_due and (request.delay_ms != delay_ms or request.at_ms != at_ms):
            same_due = False
        if drawn and not request.generated_id:
            drawn = False
    return True, same_due, drawn


def put_args(requests: Sequence[PutRequest], dues: Sequence[int] | None = None) -> list[Any]:
    """ARGV of ``put.lua``; ``dues``: each request's due time, resolved by the caller,
    sent as its ``at_ms`` (then the script must be told they are exact: ``'x'``).

    Requests that share all but their id, payload and due time go in the script's
    uniform form: the shared values once, then per request its id and payload (and its
    delay and at when those differ), a quarter to a half of the values to send, pack
    and parse."""
    conflict, default = _CONFLICT, _DEFAULT_ENCODING
    uniform, same_due, drawn = (False, False, False)
    if dues is None and len(requests) > 1:
        uniform, same_due, drawn = _uniform(requests)
    if uniform:
        first = requests[0]
        args: list[Any] = [
            -len(requests),
            # Ids the facade drew: no stored message has one (PutRequest.generated_id),
            # so the script stores them without looking.
            _DRAWN if drawn else conflict[first.on_conflict],
            (b"" if first.delay_ms is None else first.delay_ms) if same_due else b"*",
            (b"" if first.at_ms is None else first.at_ms) if same_due else b"*",
            first.max_attempts,
            "" if first.encoding == default else first.encoding,
            "",
        ]
        if same_due:  # the default put_many: _packed_id inlined
            fromhex = bytes.fromhex
            for request in requests:
                id = request.id
                packed = b"\x00" + fromhex(id) if request.generated_id else pack_id(id)
                args += (packed, request.payload)
        else:
            for request in requests:
                delay_ms, at_ms = request.delay_ms, request.at_ms
                args += (
                    _packed_id(request),
                    b"" if delay_ms is None else delay_ms,
                    b"" if at_ms is None else at_ms,
                    request.payload,
                )
        return args
    args = [len(requests)]
    for index, request in enumerate(requests):
        if dues is None:
            delay_ms, at_ms = request.delay_ms, request.at_ms
            delay: Any = b"" if delay_ms is None else delay_ms
            at: Any = b"" if at_ms is None else at_ms
        else:
            delay, at = b"", dues[index]
        args += (
            _packed_id(request),
            conflict[request.on_conflict],
            delay,
            at,
            request.max_attempts,
            "" if request.encoding == default else request.encoding,
            _headers_arg(request.headers),
            request.payload,
        )
    return args


def put_one_args(request: PutRequest) -> list[Any]:
    """ARGV of ``put_one.lua``: one request with ``on_conflict="ignore"``, on a queue
    that is not sharded; the encoding and headers only when either is not the default."""
    delay_ms, at_ms = request.delay_ms, request.at_ms
    args: list[Any] = [
        _packed_id(request),
        b"" if delay_ms is None else delay_ms,
        b"" if at_ms is None else at_ms,
        request.max_attempts,
        request.payload,
    ]
    encoding, headers = request.encoding, request.headers
    if headers or encoding != _DEFAULT_ENCODING:
        args += ("" if encoding == _DEFAULT_ENCODING else encoding, _headers_arg(headers))
    return args


def _headers_arg(headers: Mapping[str, str]) -> str:
    """Headers as the scripts take them: compact JSON, or '' for none."""
    return json.dumps(dict(headers), separators=(",", ":")) if headers else ""


def raise_put_status(reply: Sequence[Any]) -> None:
    """Raise what ``put.lua``'s status reply means (nothing for ``{0}``)."""
    status = int(reply[0])
    if status == 1:
        id = unpack_id(reply[1])
        raise DuplicateId(f"a message with id {id!r} exists", id)
    if status == 2:
        id = unpack_id(reply[1])
        raise DuplicateId(f"message {id!r} is in flight: it cannot be replaced", id)


def nack_args(id: str, token: str, delay_ms: int, error: str | None, dead: bool) -> list[Any]:
    """ARGV of ``nack.lua``."""
    has_error = b"0" if error is None else b"1"
    return [pack_id(id), token, delay_ms, has_error, error or "", b"1" if dead else b"0"]


def nack_state(reply: Any) -> State | None:
    """The state ``nack.lua`` reports, None when the lease was lost."""
    return _NACK_STATES.get(int(reply))


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "surrogatepass")


def decode_record(row: Sequence[Any]) -> Record:
    """A record from ``reply()`` of ``lib.lua``."""
    # The common case inline (no headers, no error): no call of load_headers or _text.
    headers = load_headers(row[8]) if row[8] else EMPTY_HEADERS
    error, lease, until = row[9], row[10], row[11]
    return new_record(
        id=unpack_id(row[0]),
        payload=row[1],
        encoding=row[2].decode() if row[2] else _DEFAULT_ENCODING,
        due_at=int(row[3]),
        seq=int(row[4]),
        attempts=int(row[5]),
        max_attempts=int(row[6]),
        state=_STATES[row[7].decode()],
        headers=headers,
        last_error=None if error is None else _text(error),
        lease=None if lease is None else lease.decode("utf-8", "surrogatepass"),
        lease_until=None if until is None else int(until),
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """What one ``reserve.lua`` call did: the claimed records, the server's clock, and
    the next due time or lease expiry (epoch ms; None when nothing is pending) and the
    seq of the message due then (0 when that is a lease expiry)."""

    records: list[Record]
    now_ms: int
    now_us: int
    next_ms: int | None
    next_seq: int = 0
    #: ``time.monotonic()`` when the reply was decoded (on the link's side of any hop
    #: to the caller's task).
    arrived: float = 0.0

    def seconds_until_next(self, ahead_ms: int = 0) -> float | None:
        """Seconds from the server's now to the next event (None: no event), or to
        ``ahead_ms`` before it when it is a due time (``next_seq`` set; a lease expiry
        is waited for itself)."""
        if self.next_ms is None:
            return None
        until = self.next_ms - (ahead_ms if self.next_seq else 0)
        return max(0.0, (until - self.now_ms) / 1000.0 - self.now_us / 1e6)


#: Values per claimed message in a ``reserve.lua`` reply, after its 5 of the claim.
CLAIMED = 9
_ACTIVE = State.ACTIVE


def decode_claim(token: str, lease_ms: int, reply: Sequence[Any]) -> Claim:
    """The :class:`Claim` of a ``reserve.lua`` reply to a call with token base
    ``token`` and lease ``lease_ms``. Each claimed message comes as :data:`CLAIMED`
    values, flat; what the call's arguments say (its state, its lease token, its
    lease's end) is not in the reply. Its integers come as integers (Lua numbers)."""
    records: list[Record] = []
    append, until = records.append, reply[4]
    for position, start in enumerate(range(5, len(reply), CLAIMED), 1):
        id, payload, encoding, due, seq, attempts, max_attempts, headers, error = reply[
            start : start + CLAIMED
        ]
        # Record's fields in order (no keywords to match, once a message).
        append(
            new_record(
                id[1:].hex() if len(id) == 17 and id[0] == 0 else unpack_id(id),
                payload,
                _DEFAULT_ENCODING if encoding is None else encoding.decode(),
                due,
                seq,
                attempts,
                max_attempts,
                _ACTIVE,
                load_headers(headers) if headers else EMPTY_HEADERS,
                None if error is None else _text(error),
                f"{token}{position}",
                due + lease_ms if until is None else until,
            )
        )
    return Claim(
        records=records,
        now_ms=int(reply[0]),
        now_us=int(reply[1]),
        next_ms=None if reply[2] is None else int(reply[2]),
        next_seq=0 if reply[3] is None else int(reply[3]),
        arrived=time.monotonic(),
    )


def decode_stats(reply: Sequence[Any]) -> Stats:
    """The :class:`Stats` of a ``stats.lua`` reply."""
    scheduled, ready, active, dead, now = (int(reply[i]) for i in (0, 1, 2, 3, 5))
    next_due = None if reply[4] is None else int(reply[4])
    return Stats(
        scheduled=scheduled,
        ready=ready,
        active=active,
        dead=dead,
        next_due_at=next_due,
        lag=lag_of(next_due if ready else None, now),
    )


def decode_due_counts(reply: Sequence[Any]) -> tuple[int, list[int]]:
    """``(start_ms, counts)`` of a ``due_counts.lua`` reply."""
    return int(reply[0]), [int(count) for count in reply[1]]
