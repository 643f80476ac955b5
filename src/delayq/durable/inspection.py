"""The read-only inspection operations, pure: which messages ``peek`` shows and in what
order, and how ``due_counts`` buckets due times. No I/O; ``now_ms`` is the backend's
clock (the floor). The memory backend calls these directly; the SQLite backend merges
its rows with :func:`select_peek`; the Redis scripts ``peek.lua`` and ``due_counts.lua``
mirror them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from .message import Position, Record, State, observe, replace_record

__all__ = [
    "bucket_width",
    "count_due",
    "merge_peek",
    "peek_order",
    "peek_states",
    "select_peek",
]

_WAITING = frozenset((State.SCHEDULED, State.READY))


def peek_states(state: State | None) -> frozenset[State]:
    """The observed states ``peek(state)`` shows: None means the waiting ones (scheduled
    and ready)."""
    return _WAITING if state is None else frozenset((state,))


def peek_order(state: State | None) -> Callable[[Record], tuple[int, ...]]:
    """The sort key of ``peek(state)``: waiting, ready and scheduled messages by
    ``(due_at, seq)`` (delivery order), active ones by ``(lease_until, seq)``, dead ones
    by ``seq`` (as ``dead()``)."""
    if state is State.ACTIVE:
        return lambda record: (record.lease_until or 0, record.seq)
    if state is State.DEAD:
        return lambda record: (record.seq,)
    return lambda record: (record.due_at, record.seq)


def select_peek(
    records: Iterable[Record],
    state: State | None,
    now_ms: int,
    limit: int,
    after: Position | None = None,
) -> list[Record]:
    """The first ``limit`` of ``records`` (stored or settled, any order) in the observed
    ``state``, in :func:`peek_order`, observed at ``now_ms`` and without lease tokens;
    with ``after``, only those whose key is greater."""
    wanted = peek_states(state)
    key = peek_order(state)
    # Observed with the lease first: lease_until is the sort key of active messages.
    observed = (observe(record, now_ms) for record in records)
    chosen = heapq.nsmallest(
        limit,
        (
            record
            for record in observed
            if record.state in wanted and (after is None or key(record) > after)
        ),
        key=key,
    )
    return [observe(record, now_ms, with_lease=False) for record in chosen]


def merge_peek(parts: Iterable[Iterable[Record]], state: State | None, limit: int) -> list[Record]:
    """The first ``limit`` of several already observed peek results (e.g. one per
    shard) in :func:`peek_order`, their lease tokens dropped (active ones keep their
    ``lease_until``, the sort key and what a reader wants to know)."""
    merged = (record for part in parts for record in part)
    chosen = heapq.nsmallest(limit, merged, key=peek_order(state))
    return [
        record if record.lease is None else replace_record(record, lease=None) for record in chosen
    ]


def bucket_width(horizon_ms: int, buckets: int) -> int:
    """The width (ms) of one ``due_counts`` bucket: ``ceil(horizon_ms / buckets)``."""
    return -(-horizon_ms // buckets)


def count_due(due_times: Iterable[int], now_ms: int, horizon_ms: int, buckets: int) -> list[int]:
    """``counts[i]``: how many of ``due_times`` (of scheduled messages) fall in
    ``[now_ms + i*w, now_ms + (i+1)*w)``, ``w`` = :func:`bucket_width`; due times
    ``<= now_ms`` (already due: ready) and beyond the last bucket are not counted."""
    width = bucket_width(horizon_ms, buckets)
    counts = [0] * buckets
    for due_at in due_times:
        if due_at > now_ms:
            index = (due_at - now_ms) // width
            if index < buckets:
                counts[index] += 1
    return counts
