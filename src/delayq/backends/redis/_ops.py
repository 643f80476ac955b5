"""The operations of the Redis backend, written once for both faces.

Each method returns a :class:`Call`: which script to run with which KEYS and ARGV, and how
to turn its reply into the result (or the error) of the operation. The faces only run
calls, on ``redis.Redis`` or ``redis.asyncio.Redis``, and wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Generic, TypeVar

from ..._fork import new_id
from ...durable.inspection import bucket_width
from ...durable.message import Now, Position, PutRequest, Record, State, Stats
from ...errors import LeaseLost
from ._scripts import (
    Claim,
    decode_claim,
    decode_due_counts,
    decode_record,
    decode_stats,
    nack_args,
    nack_state,
    pack_id,
    put_args,
    put_one_args,
    queue_keys,
    raise_put_status,
)

__all__ = ["Call", "Operations"]

T = TypeVar("T")

_LEASE_LOST = "the lease expired or the message was reserved, acked or removed since"
_KEY_CACHE = 4096


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One script run: ``decode(reply)`` gives the operation's result."""

    script: str
    keys: list[bytes]
    args: list[Any]
    decode: Callable[[Any], T]


def _lost() -> LeaseLost:
    return LeaseLost(_LEASE_LOST)


def _put_woke(reply: Any) -> tuple[bool, list[int]]:
    """Whether waiting consumers were woken, and the positions of the kept requests."""
    raise_put_status(reply)
    return bool(int(reply[1])), [int(position) for position in reply[2:]]


def _acked(reply: Any) -> None:
    if int(reply) != 1:
        raise _lost()


def _lost_positions(reply: Any) -> list[int]:
    return [int(position) - 1 for position in reply]


def _nacked(reply: Any) -> State:
    state = nack_state(reply)
    if state is None:
        raise _lost()
    return state


def _released(reply: Any) -> None:
    if int(reply) != 1:
        raise _lost()


def _extended(reply: Any) -> int:
    if not int(reply):
        raise _lost()
    return int(reply)


def _flag(reply: Any) -> bool:
    return bool(int(reply))


def _count(reply: Any) -> int:
    return int(reply)


def _record(reply: Any) -> Record | None:
    return None if reply is None else decode_record(reply)


def _records(reply: Any) -> list[Record]:
    return [decode_record(row) for row in reply]


def _nothing(reply: Any) -> None:
    return None


def _seqs_and_now(reply: Any) -> tuple[int, Now]:
    return int(reply[0]), Now(int(reply[1]), int(reply[2]))


def _ms(value: int | None) -> bytes | int:
    return b"" if value is None else value


class Operations:
    """The calls of every backend operation for queues under one key prefix, on one
    shard of each queue (0 for an unsharded queue).

    The optional ``seq``/``seqs``/``seq_base`` arguments carry sequence numbers taken
    from a queue-wide counter (sharded queues); without them a script counts with its
    own shard's counter, as an unsharded queue does."""

    def __init__(self, prefix: str, shard: int = 0) -> None:
        self.prefix = prefix
        self.shard = shard
        self.keys = lru_cache(maxsize=_KEY_CACHE)(self._keys)

    def _keys(self, queue: str) -> list[bytes]:
        return queue_keys(self.prefix, queue, self.shard)

    def seq_key(self, queue: str) -> bytes:
        """The shard's sequence counter (shard 0's is a sharded queue's own)."""
        return self.keys(queue)[4]

    def dead_key(self, queue: str) -> bytes:
        """The shard's set of dead messages."""
        return self.keys(queue)[3]

    def wake_key(self, queue: str) -> bytes:
        """The queue's wake-up marker list."""
        return self.keys(queue)[5]

    def put(
        self,
        queue: str,
        requests: Sequence[PutRequest],
        seqs: Sequence[int] | None = None,
        dues: Sequence[int] | None = None,
    ) -> Call[tuple[bool, list[int]]]:
        """``put.lua`` (``put_one.lua`` for one request with ``on_conflict="ignore"``
        on a queue that is not sharded); the result says whether waiting consumers were
        woken, and the positions in ``requests`` of those that kept an existing message
        (:meth:`Backend.put <delayq.durable.backend.Backend.put>`). ``dues`` (with
        ``seqs`` only): exact due times, resolved against one now for a batch spread
        over shards, instead of the script's own resolution."""
        one = len(requests) == 1 and requests[0].on_conflict == "ignore"
        if one and seqs is None and dues is None:
            return Call("put_one", self.keys(queue), put_one_args(requests[0]), _put_woke)
        args = put_args(requests, dues)
        if seqs is not None:
            args += (b"s", *seqs)
            if dues is not None:
                args.append(b"x")
        elif dues is not None:
            raise ValueError("exact due times go with queue-wide seqs")
        return Call("put", self.keys(queue), args, _put_woke)

    def take_seqs(self, queue: str, count: int) -> Call[tuple[int, Now]]:
        """``take_seqs.lua`` (on shard 0): ``count`` queue-wide seqs (the one before the
        first is returned) and the server's now, in one step."""
        return Call("take_seqs", self.keys(queue), [count], _seqs_and_now)

    def check_put(self, queue: str, requests: Sequence[PutRequest]) -> Call[tuple[bool, list[int]]]:
        """``put.lua`` in check mode: raises what the put would raise, writes nothing."""
        return Call("put", self.keys(queue), [*put_args(requests), b"c"], _put_woke)

    def claim(
        self,
        queue: str,
        limit: int,
        lease_ms: int,
        bound: tuple[int, int] | None = None,
        ahead_ms: int = 0,
    ) -> Call[Claim]:
        """``reserve.lua``: one claim (``limit`` 0: only look), with a fresh random token
        base (a generated id but its leading 8 digits, which hold the same value for
        days: unique, and no system call per claim, which on the event loop's thread
        gives the GIL away and waits to get it back behind busy handler threads);
        ``bound`` (due ms, seq): claim nothing after it in (due, seq) order; ``ahead_ms``:
        fire ahead by that much when nothing is due."""
        token = new_id()[8:] + "."
        args: list[Any] = [limit, lease_ms, token]
        if bound is not None:
            args += bound
        if ahead_ms > 0:
            args += ([] if bound is not None else ["", ""]) + [ahead_ms]
        return Call("reserve", self.keys(queue), args, partial(decode_claim, token, lease_ms))

    def release(self, queue: str, id: str, token: str) -> Call[None]:
        """``release.lua`` for one held message; :class:`LeaseLost` unless released."""
        return Call("release", self.keys(queue), [pack_id(id), token], _released)

    def unclaim(self, queue: str, records: Sequence[Record]) -> Call[int]:
        """``release.lua`` for what a cancelled reserve claimed (nobody received it):
        how many were still held, and given back."""
        args: list[Any] = []
        for record in records:
            args += (pack_id(record.id), record.lease or "")
        return Call("release", self.keys(queue), args, _count)

    def ack(self, queue: str, id: str, token: str) -> Call[None]:
        """``ack.lua``."""
        return Call("ack", self.keys(queue), [pack_id(id), token], _acked)

    def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> Call[list[int]]:
        """``ack_many.lua``: the indexes into ``items`` (0-based, in order) of the pairs
        whose lease was lost."""
        args: list[Any] = []
        for id, token in items:
            args += (pack_id(id), token)
        return Call("ack_many", self.keys(queue), args, _lost_positions)

    def nack(
        self,
        queue: str,
        id: str,
        token: str,
        delay_ms: int,
        error: str | None,
        *,
        dead: bool,
        seq: int | None = None,
    ) -> Call[State]:
        """``nack.lua``."""
        args = nack_args(id, token, delay_ms, error, dead)
        if seq is not None:
            args.append(seq)
        return Call("nack", self.keys(queue), args, _nacked)

    def extend(self, queue: str, id: str, token: str, lease_ms: int) -> Call[int]:
        """``extend.lua``."""
        return Call("extend", self.keys(queue), [pack_id(id), token, lease_ms], _extended)

    def cancel(self, queue: str, id: str) -> Call[bool]:
        """``cancel.lua``."""
        return Call("cancel", self.keys(queue), [pack_id(id)], _flag)

    def reschedule(
        self, queue: str, id: str, delay_ms: int | None, at_ms: int | None, seq: int | None = None
    ) -> Call[bool]:
        """``reschedule.lua``."""
        args = [pack_id(id), _ms(delay_ms), _ms(at_ms)]
        if seq is not None:
            args.append(seq)
        return Call("reschedule", self.keys(queue), args, _flag)

    def get(self, queue: str, id: str) -> Call[Record | None]:
        """``get.lua``."""
        return Call("get", self.keys(queue), [pack_id(id)], _record)

    def stats(self, queue: str) -> Call[Stats]:
        """``stats.lua``."""
        return Call("stats", self.keys(queue), [], decode_stats)

    def dead(self, queue: str, limit: int, after_seq: int | None = None) -> Call[list[Record]]:
        """``dead.lua``."""
        after = b"" if after_seq is None else after_seq
        return Call("dead", self.keys(queue), [limit, after], _records)

    def retry_dead(
        self, queue: str, ids: Sequence[str] | None, seq_base: int | None = None
    ) -> Call[int]:
        """``retry_dead.lua``."""
        mode = b"1" if ids is None else b"0"
        if seq_base is not None:
            mode += b":%d" % seq_base
        args: list[Any] = [mode] if ids is None else [mode, *(pack_id(id) for id in ids)]
        return Call("retry_dead", self.keys(queue), args, _count)

    def purge(self, queue: str, state: State | None) -> Call[int]:
        """``purge.lua``."""
        return Call("purge", self.keys(queue), [b"" if state is None else state.value], _count)

    def peek(
        self, queue: str, state: State | None, limit: int, after: Position | None = None
    ) -> Call[list[Record]]:
        """``peek.lua`` (read only)."""
        mode = b"" if state is None else state.value
        position: list[Any] = [b"", b""] if after is None else [after[0], after[-1]]
        return Call("peek", self.keys(queue), [mode, limit, *position], _records)

    def due_counts(
        self, queue: str, horizon_ms: int, buckets: int, now_ms: int | None = None
    ) -> Call[tuple[int, list[int]]]:
        """``due_counts.lua`` (read only), from the server's now or from ``now_ms`` (a
        sharded queue counts every shard from one now)."""
        width = bucket_width(horizon_ms, buckets)
        args: list[Any] = [width, buckets] if now_ms is None else [width, buckets, now_ms]
        return Call("due_counts", self.keys(queue), args, decode_due_counts)

    def wake(self, queue: str) -> Call[None]:
        """``wake.lua``: put the wake-up marker (back)."""
        return Call("wake", self.keys(queue), [], _nothing)
