"""The SQLite backend's read-only inspection: queues(), peek() and due_counts(), each
one statement of :mod:`.statements` (its own snapshot) on a borrowed connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from ...durable.inspection import bucket_width, select_peek
from ...durable.message import Now, Record, State
from . import statements as sql

__all__ = ["due_counts", "peek", "queue_names"]


def queue_names(conn: sqlite3.Connection, now: Now) -> list[str]:
    """The sorted names of the queues that hold a message."""
    return sorted(row[0] for row in conn.execute(sql.QUEUES))


def peek(
    queue: str, state: State | None, limit: int, to_record: Callable[[Sequence[Any]], Record]
) -> Callable[[sqlite3.Connection, Now], list[Record]]:
    """The work of ``peek(queue, state, limit)`` for ``Pool.read``."""
    statement = sql.PEEK[None if state is None else state.value]

    def work(conn: sqlite3.Connection, now: Now) -> list[Record]:
        params = {"queue": queue, "now": now.floor, "limit": limit}
        rows = conn.execute(statement, params).fetchall()
        return select_peek([to_record(row) for row in rows], state, now.floor, limit)

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
