"""The operations of the SQLite backend, each one transaction, written once for both faces.

:class:`Core` holds the connection pool and the wake-up of one backend object; every
method but waiting is here, as one transaction of the statements of :mod:`.statements`
(each the mirror of a pure transition of :mod:`delayq.durable.message`). The faces
call these methods through their runner (:mod:`._runner`): directly (sync) or on a
thread pool (async).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...durable.message import (
    LEASE_EXPIRED_ERROR,
    Now,
    Position,
    PutRequest,
    Record,
    State,
    Stats,
    lag_of,
    observe,
    resolve_due,
    row_record,
)
from ...errors import DuplicateId, LeaseLost, QueueClosed
from . import _inspect
from . import statements as sql
from ._connection import Pool
from ._constants import SQLITE_BUSY_HANDLER_TIMEOUT
from ._url import parse_url
from ._wakeup import Wakeup

__all__ = ["Core"]

_STATES = {state.value: state for state in State}
_LEASE_LOST = "the lease expired or the message was reserved, acked or removed since"


# -- rows -------------------------------------------------------------------------------


def _record(row: Sequence[Any]) -> Record:
    return row_record(row, row[1])


def _headers(headers: Mapping[str, str]) -> str | None:
    return json.dumps(dict(headers), separators=(",", ":")) if headers else None


def _next_event(conn: sqlite3.Connection, queue: str, ahead_ms: int) -> int | None:
    """The earliest due time (less ``ahead_ms``: a reserve that fires ahead wakes
    then) or lease expiry; None when there is neither."""
    due, lease = conn.execute(sql.NEXT_EVENT, {"queue": queue}).fetchall()[0]
    events = [t for t in (None if due is None else due - ahead_ms, lease) if t is not None]
    return min(events) if events else None


def _clocks() -> tuple[int, float]:
    """The wall clock in epoch us (the floor) and ``time.monotonic()``, read together."""
    return math.floor(time.time() * 1e6), time.monotonic()


def _settle(conn: sqlite3.Connection, queue: str, now: Now) -> None:
    conn.execute(sql.SETTLE, {"queue": queue, "now": now.floor, "expired": LEASE_EXPIRED_ERROR})


def _next_seq(conn: sqlite3.Connection, count: int) -> int:
    """Reserve ``count`` sequence numbers; return the first."""
    last = conn.execute(sql.NEXT_SEQ, (count,)).fetchall()[0][0]
    return int(last) - count + 1


def _insert_ignore(
    conn: sqlite3.Connection, queue: str, rows: list[tuple[Any, ...]], start: int
) -> list[int]:
    """Insert a run of "ignore" rows (the requests at ``start``...); return the
    positions of those that kept a stored message. A run that inserted every row, the
    common case, costs no query more than the insert."""
    if conn.executemany(sql.INSERT_IGNORE, rows).rowcount == len(rows):
        return []
    ids = json.dumps([row[1] for row in rows])
    stored = {seq for (seq,) in conn.execute(sql.INSERT_IGNORE_KEPT, {"ids": ids, "queue": queue})}
    return [start + i for i, row in enumerate(rows) if row[5] not in stored]


# -- the operations, written once -------------------------------------------------------


class Core:
    """Everything but waiting: each method is one transaction, shared by both faces."""

    def __init__(self, url: str, **options: Any) -> None:
        path, checked = parse_url(url, **options)
        busy = checked["busy_timeout"]
        self.pool = Pool(
            path,
            busy_timeout=min(busy, SQLITE_BUSY_HANDLER_TIMEOUT),
            busy_budget=busy,
            synchronous=checked["synchronous"],
        )
        self.wake = Wakeup(self.pool, checked["poll_interval"], notify=checked["notify"])
        self.closed = False

    def check_open(self) -> None:
        """Raise :class:`QueueClosed` once closed."""
        if self.closed:
            raise QueueClosed("the queue is closed")

    def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> list[int]:
            seq = _next_seq(conn, len(requests))
            ignored: list[tuple[Any, ...]] = []  # a run of "ignore" rows, inserted at once
            start = 0  # the position of the run's first request
            kept: list[int] = []
            for position, request in enumerate(requests):
                row = (
                    queue,
                    request.id,
                    request.payload,
                    request.encoding,
                    resolve_due(request.delay_ms, request.at_ms, now),
                    seq,
                    request.max_attempts,
                    _headers(request.headers),
                )
                seq += 1
                if request.on_conflict == "ignore":
                    if not ignored:
                        start = position
                    ignored.append(row)
                    continue
                if ignored:
                    kept += _insert_ignore(conn, queue, ignored, start)
                    ignored = []
                if request.on_conflict == "error":
                    try:
                        conn.execute(sql.INSERT, row)
                    except sqlite3.IntegrityError:
                        raise DuplicateId(
                            f"a message with id {request.id!r} exists", request.id
                        ) from None
                elif not conn.execute(sql.REPLACE, (*row, now.floor)).fetchall():
                    raise DuplicateId(
                        f"message {request.id!r} is in flight: it cannot be replaced", request.id
                    )
            if ignored:
                kept += _insert_ignore(conn, queue, ignored, start)
            return kept

        kept = self.pool.write(work)
        self.wake.announce(queue)
        return kept

    def claim(
        self, queue: str, limit: int, lease_ms: int, peek: bool, ahead_ms: int = 0
    ) -> tuple[list[Record], int | None, int, float]:
        """Settle expired leases and claim up to ``limit`` due messages, in one
        transaction; with ``ahead_ms``, when none is due, those of the earliest due time
        if it is at most ``ahead_ms`` away (``CLAIM_AHEAD``). Returns what was claimed
        (in order), when nothing was the epoch ms of the next due time (less
        ``ahead_ms``) or lease expiry, and this process's clock read after the
        transaction (epoch us; the store's now for the holder, a bound that is never
        early) with ``time.monotonic()`` read beside it (the answer's arrival, before
        any hop to the caller's thread). With ``peek``, a read-only look comes first
        and the write lock is taken only if something is due."""
        self.check_open()
        if peek:
            next_ms, now = self.pool.read(
                lambda conn, now: (_next_event(conn, queue, ahead_ms), now)
            )
            if next_ms is None or next_ms > now.floor:
                return [], next_ms, *_clocks()

        def work(conn: sqlite3.Connection, now: Now) -> tuple[list[Record], int | None]:
            _settle(conn, queue, now)
            params = {
                "queue": queue,
                "now": now.floor,
                "ceil": now.ceil,
                "lease_ms": lease_ms,
                "limit": limit,
            }
            rows = conn.execute(sql.CLAIM, params).fetchall()
            if not rows and ahead_ms > 0:
                params["horizon"] = now.floor + ahead_ms
                rows = conn.execute(sql.CLAIM_AHEAD, params).fetchall()
            if not rows:
                return [], _next_event(conn, queue, ahead_ms)
            records = [_record(row) for row in rows]
            records.sort(key=lambda record: (record.due_at, record.seq))
            return records, None

        records, next_ms = self.pool.write(work)
        return records, next_ms, *_clocks()

    def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> None:
            params = {"queue": queue, "id": id, "token": token, "now": now.floor}
            if conn.execute(sql.RELEASE, params).rowcount != 1:
                raise LeaseLost(_LEASE_LOST)

        self.pool.write(work)
        self.wake.announce(queue)

    def unclaim(self, queue: str, records: Sequence[Record]) -> None:
        """Give back what a cancelled reserve claimed (nobody received it): the same
        RELEASE as :meth:`release`, for each record whose lease the claim still
        holds, unexpired (an expired one was settled as any expiry is)."""

        def work(conn: sqlite3.Connection, now: Now) -> None:
            conn.executemany(
                sql.RELEASE,
                [{"queue": queue, "id": r.id, "token": r.lease, "now": now.floor} for r in records],
            )

        if not self.pool.closed:
            self.pool.write(work)
            self.wake.announce(queue)

    def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> None:
            if conn.execute(sql.ACK, (queue, id, token, now.floor)).rowcount != 1:
                raise LeaseLost(_LEASE_LOST)

        self.pool.write(work)

    def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`."""
        self.check_open()
        encoded = json.dumps(items, separators=(",", ":"))

        def work(conn: sqlite3.Connection, now: Now) -> list[tuple[str, str]]:
            params = {"queue": queue, "items": encoded, "now": now.floor}
            return [(row[0], row[1]) for row in conn.execute(sql.ACK_MANY, params).fetchall()]

        acked = set(self.pool.write(work))
        lost = []
        for item in items:
            if item in acked:
                acked.discard(item)  # a second (id, token) of the same row is lost
            else:
                lost.append(item[0])
        return lost

    def nack(
        self, queue: str, id: str, token: str, delay_ms: int, error: str | None, *, dead: bool
    ) -> State:
        """See :meth:`Backend.nack <delayq.durable.backend.Backend.nack>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> State:
            params = {
                "queue": queue,
                "id": id,
                "token": token,
                "now": now.floor,
                "due_at": resolve_due(delay_ms, None, now),
                "dead": int(dead),
                "error": error,
                "seq": _next_seq(conn, 1),
            }
            rows = conn.execute(sql.NACK, params).fetchall()
            if not rows:
                raise LeaseLost(_LEASE_LOST)
            return _STATES[rows[0][0]]

        state = self.pool.write(work)
        if state is State.SCHEDULED:
            self.wake.announce(queue)
        return state

    def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> int:
            params = {
                "queue": queue,
                "id": id,
                "token": token,
                "now": now.floor,
                "ceil": now.ceil,
                "lease_ms": lease_ms,
            }
            rows = conn.execute(sql.EXTEND, params).fetchall()
            if not rows:
                raise LeaseLost(_LEASE_LOST)
            return int(rows[0][0])

        return self.pool.write(work)

    def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        self.check_open()
        return self.pool.write(
            lambda conn, now: conn.execute(sql.CANCEL, (queue, id, now.floor)).rowcount == 1
        )

    def reschedule(self, queue: str, id: str, delay_ms: int | None, at_ms: int | None) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> bool:
            _settle(conn, queue, now)
            params = {
                "queue": queue,
                "id": id,
                "now": now.floor,
                "due_at": resolve_due(delay_ms, at_ms, now),
                "seq": _next_seq(conn, 1),
            }
            return conn.execute(sql.RESCHEDULE, params).rowcount == 1

        moved = self.pool.write(work)
        if moved:
            self.wake.announce(queue)
        return moved

    def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> Record | None:
            rows = conn.execute(sql.GET, (queue, id)).fetchall()
            return observe(_record(rows[0]), now.floor, with_lease=False) if rows else None

        return self.pool.read(work)

    def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> Stats:
            row = conn.execute(sql.STATS, {"queue": queue, "now": now.floor}).fetchall()[0]
            scheduled, ready, active, dead, next_due, oldest_ready = row
            return Stats(
                scheduled=scheduled,
                ready=ready,
                active=active,
                dead=dead,
                next_due_at=next_due,
                lag=lag_of(oldest_ready, now.floor),
            )

        return self.pool.read(work)

    def dead(self, queue: str, limit: int, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>`."""
        self.check_open()
        after = -1 if after_seq is None else after_seq

        def work(conn: sqlite3.Connection, now: Now) -> list[Record]:
            params = {"queue": queue, "now": now.floor, "limit": limit, "after": after}
            rows = conn.execute(sql.DEAD, params).fetchall()
            return [observe(_record(row), now.floor, with_lease=False) for row in rows]

        return self.pool.read(work)

    def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        self.check_open()

        def work(conn: sqlite3.Connection, now: Now) -> int:
            _settle(conn, queue, now)
            if ids is None:
                rowids = [row[0] for row in conn.execute(sql.DEAD_ROWIDS_ALL, (queue,))]
            else:
                rowids = [
                    row[0]
                    for id in dict.fromkeys(ids)
                    for row in conn.execute(sql.DEAD_ROWIDS, (queue, id)).fetchall()
                ]
            if rowids:
                seq = _next_seq(conn, len(rowids))
                rows = [(now.floor, seq + i, rowid) for i, rowid in enumerate(rowids)]
                conn.executemany(sql.RETRY_DEAD, rows)
            return len(rowids)

        revived = self.pool.write(work)
        if revived:
            self.wake.announce(queue)
        return revived

    def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        self.check_open()
        statement = sql.PURGE[None if state is None else state.value]

        def work(conn: sqlite3.Connection, now: Now) -> int:
            _settle(conn, queue, now)
            return conn.execute(statement, {"queue": queue, "now": now.floor}).rowcount

        return self.pool.write(work)

    def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        self.check_open()
        return self.pool.read(_inspect.queue_names)

    def peek(
        self, queue: str, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        self.check_open()
        return self.pool.read(_inspect.peek(queue, state, limit, _record, after))

    def due_counts(self, queue: str, horizon_ms: int, buckets: int) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        self.check_open()
        return self.pool.read(_inspect.due_counts(queue, horizon_ms, buckets))
