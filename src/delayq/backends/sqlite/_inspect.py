"""The SQLite backend's read-only inspection: queues(), peek() and due_counts(), each
one statement of :mod:`.statements` (its own snapshot) on a borrowed connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from ...durable.inspection import bucket_width, select_peek
from ...durable.message import Now, Position, Record, State
from . import statements as sql

__all__ = ["due_counts", "peek", "queue_names"]


def queue_names(conn: sqlite3.Connection, now: Now) -> list[str]:
    """The sorted names of the queues that hold a message."""
    return sorted(row[0] for row in conn.execute(sql.QUEUES))


def peek(
    queue: str,
    state: State | None,
    limit: int,
    to_record: Callable[[Sequence[Any]], Record],
    after: Position | None = None,
) -> Callable[[sqlite3.Connection, Now], list[Record]]:
    """The work of ``peek(queue, state, limit, after)`` for ``Pool.read``."""
    statement = sql.PEEK[None if state is None else state.value]
    # Before every key: -1 (times and seqs are >= 0). A dead one's key is (seq,).
    key, seq = (-1, -1) if after is None else (after[0], after[-1])

    def work(conn: sqlite3.Connection, now: Now) -> list[Record]:
        params = {
            "queue": queue,
            "now": now.floor,
            "limit": limit,
            "after": seq,
            "after_key": key,
            "after_seq": seq,
        }
        rows = conn.execute(statement, params).fetchall()
        return select_peek([to_record(row) for row in rows], state, now.floor, limit, after)

    return work


def due_counts(
    queue: str, horizon_ms: int, buckets: int
) -> Callable[[sqlite3.Connection, Now], tuple[int, list[int]]]:
    """The work of ``due_counts(queue, horizon_ms, buckets)`` for ``Pool.read``."""
    width = bucket_width(horizon_ms, buckets)

    def work(conn: sqlite3.Connection, now: Now) -> tuple[int, list[int]]:
        params = {
            "queue": queue,
            "now": now.floor,
            "width": width,
            "end": now.floor + width * buckets,
        }
        counts = [0] * buckets
        for index, count in conn.execute(sql.DUE_COUNTS, params):
            counts[index] = count
        return now.floor, counts

    return work
