"""The ``postgresql://`` backend, written once as its asyncio face: the source of the
generated sync face (:mod:`delayq.backends.postgres._sync.backend`).

Every operation is one statement of :mod:`delayq.backends.postgres.statements` on a
connection of the object's pool in autocommit mode (a statement is its own
transaction), or one transaction of a few (a put mixing ``replace``/``error`` with
``ignore``). A waiting ``reserve`` sleeps on the object's
:class:`~delayq.backends.postgres._wakeup.Wakeup`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from ...._log import LOGGER_NAME
from ....durable.inspection import bucket_width, select_peek
from ....durable.message import (
    LEASE_EXPIRED_ERROR,
    Claimed,
    Position,
    PutRequest,
    Record,
    State,
    Stats,
    lag_of,
    observe,
    row_record,
)
from ....durable.reserves import AsyncReserves
from ....errors import DuplicateId, LeaseLost, QueueClosed
from ..._guard import AsyncGuard
from .. import _schema
from .._connect import refused
from .._libpq import checked, exchange
from .._outcome import QUICK_FAILURE, raise_lost
from .._runner import AsyncLock, getconn_async
from .._url import SAFETY_INTERVAL, parse_url
from .._wakeup import Wakeup
from ..statements import Prepared, Statements, put_kind
from .drive import drive_async

__all__ = [
    "POSTGRES_FIRE_AHEAD_MS",
    "AsyncPostgresBackend",
    "open_async_backend",
    "put_on",
    "upgrade",
]

#: How long before its due time a waiting reserve claims a message ("Fire ahead" in
#: delayq.durable.backend): the claim's round trip on the asyncio face measured 0.73 ms
#: at p50, 1.2 ms at p95 and 3.9 ms at p99 (2 vCPUs at load average 4), so that the
#: claim is hidden from the message's lateness; a cancel's own round trip is as long,
#: so the window in which the message is in flight early is within that noise.
POSTGRES_FIRE_AHEAD_MS = 4

_STATES = {state.value: state for state in State}
_LEASE_LOST = "the lease expired or the message was reserved, acked or removed since"
#: How many times a read (or a claim) is tried again on another connection when the one
#: it borrowed turns out broken (a restarted server leaves every pooled one broken).
_RETRIES = 3
#: First and longest pause of a waiting reserve between two tries while the server
#: does not answer, seconds.
_FIRST_PAUSE = 0.05
_MAX_PAUSE = 2.0
#: What a waiting reserve rides out by trying again: a lost, refused or timed-out
#: connection, a pool that found none in time.
_OUTAGE = (psycopg.OperationalError, PoolTimeout)

_IDLE = psycopg.pq.TransactionStatus.IDLE

_log = logging.getLogger(LOGGER_NAME)

Row = tuple[Any, ...]
#: A statement's parameters: by name, or in order (the put of one message).
Params = Mapping[str, Any] | Sequence[Any]


def _record(row: Row) -> Record:
    return row_record(row, bytes(row[1]))


def _headers(headers: Mapping[str, str]) -> str | None:
    return json.dumps(dict(headers), separators=(",", ":")) if headers else None


def _requests(queue: str, requests: Sequence[PutRequest]) -> dict[str, Any]:
    """The parameters of a put statement: one array per column, in request order."""
    return {
        "queue": queue,
        "n": len(requests),
        "ids": [r.id for r in requests],
        "payloads": [r.payload for r in requests],
        "encodings": [r.encoding for r in requests],
        "delays": [r.delay_ms for r in requests],
        "ats": [r.at_ms for r in requests],
        "maxes": [r.max_attempts for r in requests],
        "headers": [_headers(r.headers) for r in requests],
    }


def _earliest(*times: int | None) -> int | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


async def upgrade(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Create ``schema`` or apply the steps it lacks (:mod:`.._schema`), under an
    advisory lock; one query when it is at this code's version."""
    names = {"schema": schema, "name": f"delayq:{schema}"}
    version_of = _schema.VERSION_OF.format(s=f'"{schema}"')

    async def version() -> int:
        cursor = await conn.execute(_schema.HAS_META, names)
        exists = await cursor.fetchone()
        if not (exists and exists[0]):
            return 0
        cursor = await conn.execute(version_of)
        row = await cursor.fetchone()
        return int(row[0]) if row else 0

    if await version() == _schema.VERSION:
        return
    async with conn.transaction():
        await conn.execute(_schema.LOCK, names)
        found = await version()
        if found > _schema.VERSION:
            raise RuntimeError(
                f"the postgres schema {schema!r} is at version {found}, newer than "
                f"this delayq's {_schema.VERSION}: upgrade delayq"
            )
        for statement in _schema.migrations_after(f'"{schema}"', found):
            await conn.execute(statement)


async def put_on(
    conn: psycopg.AsyncConnection[Any],
    sql: Statements,
    queue: str,
    requests: Sequence[PutRequest],
    *,
    announce: bool = False,
) -> tuple[list[int], int | None]:
    """apply_put() of a batch in one transaction of ``conn`` (a savepoint inside one
    the caller has open): a run of "ignore" requests is one statement, each
    "error"/"replace" request one; one wake-up at the end (``announce``: a
    notification in any case, without the queue's lock, for a transaction the caller
    holds open). Returns the kept positions and the earliest due time written."""
    kept: list[int] = []
    earliest: int | None = None
    async with conn.transaction():
        start = 0
        while start < len(requests):
            request = requests[start]
            if request.on_conflict == "ignore":
                end = start
                while end < len(requests) and requests[end].on_conflict == "ignore":
                    end += 1
                params = _requests(queue, requests[start:end])
                cursor = await conn.execute(sql.PUT_IGNORE_QUIET, params)
                row = await cursor.fetchone()
                assert row is not None
                kept += _kept(row[0], start, end - start)
                earliest = _earliest(earliest, row[1])
                start = end
                continue
            params = _requests(queue, [request])
            if request.on_conflict == "error":
                try:
                    async with conn.transaction():
                        cursor = await conn.execute(sql.PUT_ERROR, params)
                except psycopg.errors.UniqueViolation:
                    raise DuplicateId(
                        f"a message with id {request.id!r} exists", request.id
                    ) from None
            else:
                cursor = await conn.execute(sql.PUT_REPLACE, params)
            row = await cursor.fetchone()
            if row is None:
                raise DuplicateId(
                    f"message {request.id!r} is in flight: it cannot be replaced", request.id
                )
            earliest = _earliest(earliest, row[0])
            start += 1
        wake = sql.ANNOUNCE if announce else sql.WAKE
        await conn.execute(wake, {"queue": queue, "due": earliest})
    return kept, earliest


def _kept(inserted: list[int] | None, start: int, count: int) -> list[int]:
    """The positions (from ``start``) of a run's requests that kept a stored message,
    from the 1-based positions of those it inserted (None: all)."""
    if inserted is None:
        return []
    stored = set(inserted)
    return [start + i for i in range(count) if i + 1 not in stored]


class AsyncPostgresBackend(AsyncReserves):
    """A face of ``postgresql://`` (see :class:`~delayq.durable.backend.AsyncBackend`).

    Creating it does no I/O: the pool connects, and the schema is created or upgraded,
    on first use. Each call borrows a pooled connection for one statement (or one
    transaction). A waiting ``reserve`` is woken by LISTEN/NOTIFY
    (:mod:`delayq.backends.postgres._wakeup`). A cancelled ``reserve`` claims nothing;
    a cancelled call of another operation may still take effect.
    """

    def __init__(self, url: str, **options: Any) -> None:
        settings = parse_url(url, **options)
        self._url = url
        self._settings = settings
        self.sql = Statements(settings.schema)
        # min_size=0: connections open only as calls need them. With 1, the first
        # call, finding the pool's first connection still on its way, would open a
        # second; the pool hands out its idle connections in turn, so a producer
        # putting one by one would then alternate between two server processes, each
        # cold for every other put (~15% more server CPU a put). The connection a
        # lone caller keeps (see _fetch) stays open while the object lives.
        self._pool = AsyncConnectionPool(
            settings.conninfo,
            min_size=0,
            max_size=settings.pool_size,
            timeout=settings.pool_timeout,
            kwargs={"autocommit": True},
            open=False,
            name=f"delayq-{settings.schema}",
        )
        self._wake = Wakeup(
            settings.conninfo,
            self.sql.channel,
            listen=settings.notify,
            interval=SAFETY_INTERVAL if settings.notify else settings.poll_interval,
        )
        #: See delayq.durable.backend.AsyncFiresAhead.
        self.fire_ahead_ms = POSTGRES_FIRE_AHEAD_MS
        self._ready_lock = AsyncLock()
        self._ready = False
        self._closed = False
        self._guard = AsyncGuard()  # the claims of cancelled reserves, until given back
        # The connection kept for a caller alone (see _fetch), and who has it: a
        # thread's lock on both faces, only ever tried (a task never waits for it).
        self._kept: psycopg.AsyncConnection[Any] | None = None
        self._kept_lock = threading.Lock()
        # Per connection: its client encoding and the Prepared names it has.
        self._prepared: weakref.WeakKeyDictionary[
            psycopg.AsyncConnection[Any], tuple[str, set[bytes]]
        ] = weakref.WeakKeyDictionary()
        self._last_prepared: tuple[object, str, set[bytes]] = (None, "", set())

    @property
    def schema(self) -> str:
        """The schema that holds this store's tables."""
        return self._settings.schema

    # -- connections ----------------------------------------------------------------

    async def _open(self) -> None:
        """Open the pool and bring the schema to this code's version, once."""
        if self._closed:
            raise QueueClosed("the queue is closed")
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            # The first connection is made here, not by the pool: a server that refuses
            # it (down, an unknown role or database, no SSL) is then one error that
            # says why, within libpq's connect_timeout, where the pool would log a
            # warning per retry and raise PoolTimeout, with no cause, after pool_timeout.
            settings = self._settings
            try:
                conn = await psycopg.AsyncConnection.connect(settings.conninfo, autocommit=True)
            except psycopg.OperationalError as exc:
                if self._closed:  # close() ran while it was connecting
                    raise QueueClosed("the queue is closed") from exc
                raise refused(self._url, settings.conninfo, exc) from exc
            async with conn:
                await upgrade(conn, settings.schema)
            try:
                await self._pool.open(wait=False)
            except PoolClosed as exc:
                self._pool_closed(exc)
            self._ready = True

    def _pool_closed(self, exc: PoolClosed) -> NoReturn:
        """Raise what a call meets when the pool closed under it: QueueClosed when this
        object's close() closed it (a call still waiting for a connection), else the
        pool's own error."""
        if self._closed:
            raise QueueClosed("the queue is closed") from exc
        raise exc

    async def _fetch(
        self, statement: str | Prepared, params: Params, change: str | None = None
    ) -> list[Row]:
        """Run one statement that returns rows (its own transaction) and return them;
        for a ``change`` (the operation's name), a connection that broke once it was
        sent raises :class:`~delayq.errors.OutcomeUnknown`."""
        return (await self._execute(statement, params, change, rows=True))[0]

    async def _count(self, statement: str, params: Mapping[str, Any], change: str) -> int:
        """Run one change without rows and return how many rows it changed (see
        :meth:`_fetch`)."""
        return (await self._execute(statement, params, change, rows=False))[1]

    async def _execute(
        self, statement: str | Prepared, params: Params, change: str | None, *, rows: bool
    ) -> tuple[list[Row], int]:
        """:meth:`_fetch` (``rows``) and :meth:`_count`: the rows and the row count (a
        :class:`~..statements.Prepared` statement: its rows, see :meth:`_run_prepared`)."""
        if self._closed or not self._ready:
            await self._open()
        # A caller alone (no other call of this object in flight) runs on the
        # connection the last one left, without the pool's checkout and return (a
        # tenth of a put's client work); a caller beside it takes one from the pool.
        # Every single-statement call goes this way, so the first call after an
        # outage finds a kept connection the outage broke, as it would a pooled one.
        # getconn/putconn rather than connection(): in autocommit the latter's
        # commit-or-rollback on exit has nothing to do; putconn replaces a broken one.
        alone = self._kept_lock.acquire(blocking=False)
        conn = self._kept if alone else None
        if conn is None:
            try:
                conn = await getconn_async(self._pool)
            except BaseException as exc:
                if alone:  # none to keep: the next caller alone takes one from the pool
                    self._kept_lock.release()
                if isinstance(exc, PoolClosed):
                    self._pool_closed(exc)
                raise
        broken = False
        try:
            if isinstance(statement, Prepared):
                found = await self._run_prepared(conn, statement, params)
                return found, len(found)
            cursor = await conn.execute(statement, params)
            return (await cursor.fetchall() if rows else []), cursor.rowcount
        except psycopg.OperationalError as exc:
            broken = True
            raise_lost(conn, exc, change)
        finally:
            if not alone:
                await self._pool.putconn(conn)
            else:
                # Kept only idle (not cut off mid-call by a cancellation) and open
                # (libpq's status as an int: ``conn.info`` builds an object and an enum).
                idle = conn.pgconn.transaction_status == _IDLE
                keep = idle and not broken and not self._closed
                self._kept = conn if keep else None
                self._kept_lock.release()
                if not keep:
                    await self._pool.putconn(conn)

    async def _run_prepared(
        self, conn: psycopg.AsyncConnection[Any], statement: Prepared, params: Params
    ) -> list[Row]:
        """Run ``statement`` on ``conn`` through libpq, preparing it there first if it
        is not yet: parameters in order (a str as text in the connection's encoding,
        bytes as the statement's formats say, None as NULL), rows of one column read as
        integers (or None)."""
        pgconn = conn.pgconn
        known = self._last_prepared
        if known[0] is not conn:
            # Per connection, in a weak mapping (a lookup there makes a weak reference):
            # the last one's is kept at hand, a lone caller's every time.
            state = self._prepared.get(conn)
            if state is None:
                state = self._prepared[conn] = (conn.info.encoding, set())
            known = self._last_prepared = (conn, *state)
        _, codec, names = known
        values: list[bytes | None] = [v.encode(codec) if isinstance(v, str) else v for v in params]
        formats = statement.formats
        for attempt in range(2):
            if statement.name not in names:
                pgconn.send_prepare(statement.name, statement.sql)
                # Already there: prepared by a call cut short before it saw the reply.
                with contextlib.suppress(psycopg.errors.DuplicatePreparedStatement):
                    checked(await drive_async(exchange(pgconn)), codec)
                names.add(statement.name)
            pgconn.send_query_prepared(statement.name, values, formats)
            try:
                result = checked(await drive_async(exchange(pgconn)), codec)
            except psycopg.errors.InvalidSqlStatementName:
                # Deallocated behind our back (DISCARD ALL): prepare it again, once.
                names.discard(statement.name)
                if attempt:
                    raise
                continue
            rows: list[Row] = []
            for i in range(result.ntuples):
                value = result.get_value(i, 0)
                rows.append((None if value is None else int(value),))
            return rows
        raise AssertionError("unreachable")

    async def _read(
        self, statement: str, params: Mapping[str, Any], change: str | None = None
    ) -> list[Row]:
        """:meth:`_fetch` for a statement safe to run twice (a read, a claim): tried
        again on another connection when the borrowed one was found broken at once
        (not after a timeout: see :data:`~.._outcome.QUICK_FAILURE`)."""
        for attempt in range(_RETRIES):
            started = time.monotonic()
            try:
                return await self._fetch(statement, params, change)
            except psycopg.OperationalError:
                slow = time.monotonic() - started > QUICK_FAILURE
                if attempt == _RETRIES - 1 or self._closed or slow:
                    raise
        raise AssertionError("unreachable")

    # -- the operations ---------------------------------------------------------------

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.put` (``outcome`` is a hint this
        backend does not need: it always decides before it returns)."""
        if len(requests) == 1 and requests[0].on_conflict == "ignore":
            request = requests[0]
            kind = put_kind(request.delay_ms, request.at_ms)
            # In the statement's order, as libpq takes them (see _run_prepared).
            params: list[str | bytes | None] = [
                queue,
                request.id,
                request.payload,
                request.encoding,
                str(request.max_attempts),
                _headers(request.headers) if request.headers else None,
            ]
            if kind != "now":
                params.append(str(request.at_ms if kind == "at" else request.delay_ms))
            if request.generated_id:
                try:
                    found = await self._execute(self.sql.PUT_NEW[kind], params, "put", rows=True)
                except psycopg.errors.UniqueViolation:
                    return [0]  # drawn before (never seen): the stored message stays
            else:
                found = await self._execute(self.sql.PUT_ONE[kind], params, "put", rows=True)
            rows = found[0]
            if not rows:
                return [0]
            self._wake.notify(queue, rows[0][0])
            return []
        if all(r.on_conflict == "ignore" for r in requests):
            batch = _requests(queue, requests)
            if all(r.generated_id for r in requests):
                try:
                    rows = await self._fetch(self.sql.PUT_NEW_MANY, batch, "put")
                except psycopg.errors.UniqueViolation:
                    pass  # an id drawn before (never seen): the put checks every id
                else:
                    self._wake.notify(queue, rows[0][0])
                    return []
            rows = await self._fetch(self.sql.PUT_IGNORE, batch, "put")
            self._wake.notify(queue, rows[0][1])
            return _kept(rows[0][0], 0, len(requests))
        await self._open()
        try:
            conn = await getconn_async(self._pool)
        except PoolClosed as exc:
            self._pool_closed(exc)
        try:
            kept, earliest = await put_on(conn, self.sql, queue, requests)
        except psycopg.OperationalError as exc:
            raise_lost(conn, exc, "put")
        finally:
            await self._pool.putconn(conn)
        self._wake.notify(queue, earliest)
        return kept

    async def _reserve(
        self, queue: str, limit: int, lease_ms: int, wait: float | None, ahead_ms: int
    ) -> Claimed:
        """Both reserves (:class:`~delayq.durable._async.hold.AsyncReserves`); a waiting
        one rides out a server that does not answer, trying again after a doubling
        pause (or once the listener is back) until its wait ends."""
        wake = self._wake
        give_up = None if wait is None else time.monotonic() + wait
        waiter = wake.enter(queue)
        params: dict[str, Any] = {
            "queue": queue,
            "limit": limit,
            "lease_ms": lease_ms,
            "expired": LEASE_EXPIRED_ERROR,
            "waiter": None,
            "sleep_ms": 0,
            "ahead_ms": ahead_ms,
        }
        pause = _FIRST_PAUSE
        try:
            while True:
                wake.look(waiter)
                # Register with the claim how long it may sleep, if it will (only a
                # listener hears the notification a registration asks for).
                sleep = wake.interval if give_up is None else give_up - time.monotonic()
                registers = wake.listens and sleep > 0.0
                params["waiter"] = waiter.token if registers or waiter.registered else None
                params["sleep_ms"] = math.ceil(min(sleep, wake.interval) * 1000) if registers else 0
                # Before the claim: a claim cut short may still have registered.
                waiter.registered = waiter.registered or registers
                try:
                    await self._open()
                    sent = time.monotonic()
                    rows = await self._guard.run(
                        lambda: self._read(self.sql.CLAIM, params, "reserve"),
                        lambda rows: self._give_back(queue, rows),
                    )
                except _OUTAGE as exc:
                    if self._closed:
                        raise QueueClosed("the queue is closed") from exc
                    left = None if give_up is None else give_up - time.monotonic()
                    if left is not None and left <= 0.0:
                        raise
                    if pause == _FIRST_PAUSE:
                        _log.warning("delayq: a waiting reserve lost PostgreSQL: %s", exc)
                    if wake.arm(waiter, None):
                        await wake.wait_async(waiter, pause if left is None else min(pause, left))
                    pause = min(pause * 2, _MAX_PAUSE)
                    continue
                pause = _FIRST_PAUSE
                if rows and rows[0][0] is not None:
                    waiter.registered = False  # the claim marked the registration awake
                    records = [_record(row) for row in rows]
                    records.sort(key=lambda record: (record.due_at, record.seq))
                    return Claimed(records, max(row[13] for row in rows))
                if self._closed:
                    raise QueueClosed("the queue is closed")
                next_ms, now_ms = (rows[0][11], rows[0][12]) if rows else (None, None)
                # Counted from when the claim left: the server read now_ms after that,
                # so the sleep ends by the time it registered (no put notifies about
                # what falls due later) and the next claim reaches it about when
                # next_ms comes, not a round trip later (one that comes too early finds
                # nothing and sleeps the rest).
                elapsed = time.monotonic() - sent
                timeout = max(0.0, wake.interval - elapsed)
                if next_ms is not None and now_ms is not None:
                    timeout = min(timeout, max(0.0, (next_ms - now_ms) / 1000.0 - elapsed))
                if give_up is not None:
                    left = give_up - time.monotonic()
                    if left <= 0.0:
                        return Claimed([], rows[0][13] if rows else 0)
                    timeout = min(timeout, left)
                if timeout > 0.0 and wake.arm(waiter, next_ms):
                    await wake.wait_async(waiter, timeout)
        finally:
            wake.leave(waiter)

    async def _give_back(self, queue: str, rows: list[Row]) -> None:
        """Release what a cancelled reserve claimed (nobody received it)."""
        claimed = [row for row in rows if row[0] is not None]
        if not claimed or self._closed:
            return
        params = {
            "queue": queue,
            "ids": [row[0] for row in claimed],
            "tokens": [row[10] for row in claimed],
        }
        await self._fetch(self.sql.RELEASE, params, "release")

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack`."""
        params = {"queue": queue, "id": id, "token": token}
        if await self._count(self.sql.ACK, params, "ack") != 1:
            raise LeaseLost(_LEASE_LOST)

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack_many`."""
        params = {
            "queue": queue,
            "ids": [id for id, _ in items],
            "tokens": [token for _, token in items],
        }
        acked = {(row[0], row[1]) for row in await self._fetch(self.sql.ACK_MANY, params, "ack")}
        lost = []
        for item in items:
            if item in acked:
                acked.discard(item)  # a second (id, token) of the same row is lost
            else:
                lost.append(item[0])
        return lost

    async def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`~delayq.durable.backend.AsyncBackend.nack`."""
        params = {
            "queue": queue,
            "id": id,
            "token": token,
            "delay_ms": delay_ms,
            "error": error,
            "dead": dead,
        }
        rows = await self._fetch(self.sql.NACK, params, "nack")
        if not rows:
            raise LeaseLost(_LEASE_LOST)
        state = _STATES[rows[0][0]]
        if state is State.SCHEDULED:
            self._wake.notify(queue, rows[0][1])
        return state

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.release`."""
        params = {"queue": queue, "ids": [id], "tokens": [token]}
        rows = await self._fetch(self.sql.RELEASE, params, "release")
        if rows[0][0] != 1:
            raise LeaseLost(_LEASE_LOST)
        self._wake.notify(queue, rows[0][1])

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.extend`."""
        params = {"queue": queue, "id": id, "token": token, "lease_ms": lease_ms}
        rows = await self._fetch(self.sql.EXTEND, params, "extend")
        if not rows:
            raise LeaseLost(_LEASE_LOST)
        return int(rows[0][0])

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.cancel`."""
        return await self._count(self.sql.CANCEL, {"queue": queue, "id": id}, "cancel") == 1

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reschedule`."""
        params = {
            "queue": queue,
            "id": id,
            "delay_ms": delay_ms,
            "at_ms": at_ms,
            "expired": LEASE_EXPIRED_ERROR,
        }
        rows = await self._fetch(self.sql.RESCHEDULE, params, "reschedule")
        if not rows:
            return False
        self._wake.notify(queue, rows[0][0])
        return True

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.get`."""
        row = (await self._read(self.sql.GET, {"queue": queue, "id": id}))[0]
        if row[0] is None:
            return None
        return observe(_record(row), row[12], with_lease=False)

    async def stats(self, queue: str) -> Stats:
        """See :meth:`~delayq.durable.backend.AsyncBackend.stats`."""
        row = (await self._read(self.sql.STATS, {"queue": queue}))[0]
        scheduled, ready, active, dead, next_due, oldest_ready, now = row
        return Stats(
            scheduled=scheduled,
            ready=ready,
            active=active,
            dead=dead,
            next_due_at=next_due,
            lag=lag_of(oldest_ready, now),
        )

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.dead`."""
        params = {"queue": queue, "limit": limit, "after": -1 if after_seq is None else after_seq}
        rows = await self._read(self.sql.DEAD, params)
        return [observe(_record(row), row[12], with_lease=False) for row in rows]

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.retry_dead`."""
        params = {
            "queue": queue,
            "all": ids is None,
            "ids": None if ids is None else list(ids),
            "expired": LEASE_EXPIRED_ERROR,
        }
        count, due = (await self._fetch(self.sql.RETRY_DEAD, params, "retry_dead"))[0]
        if count:
            self._wake.notify(queue, due)
        return int(count)

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.purge`."""
        statement = self.sql.PURGE[None if state is None else state.value]
        return await self._count(statement, {"queue": queue}, "purge")

    async def queues(self) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.queues`."""
        return sorted(row[0] for row in await self._read(self.sql.QUEUES, {}))

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.peek`."""
        # Before every key: -1 (times and seqs are >= 0). A dead one's key is (seq,).
        key, seq = (-1, -1) if after is None else (after[0], after[-1])
        params = {
            "queue": queue,
            "limit": limit,
            "after": seq,
            "after_key": key,
            "after_seq": seq,
        }
        rows = await self._read(self.sql.PEEK[None if state is None else state.value], params)
        now = rows[0][12] if rows else 0
        return select_peek([_record(row) for row in rows], state, now, limit, after)

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.due_counts`."""
        width = bucket_width(horizon_ms, buckets)
        params = {"queue": queue, "width": width, "buckets": buckets}
        rows = await self._read(self.sql.DUE_COUNTS, params)
        counts = [0] * buckets
        for _, index, count in rows:
            if index is not None:
                counts[index] = count
        return rows[0][0], counts

    async def close(self) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.close`; the messages stay."""
        if self._closed:
            return
        # A reserve cancelled just before may still be claiming: what it took goes
        # back before the pool closes, not when its lease runs out.
        await self._guard.settle()
        if self._closed:
            return
        self._closed = True
        drawn = self._wake.close()
        if self._kept_lock.acquire(blocking=False):  # else its caller gives it back
            kept, self._kept = self._kept, None
            self._kept_lock.release()
            if kept is not None:
                await self._pool.putconn(kept)
        if drawn and self._ready and self._wake.listens:
            await self._forget_waiters(drawn)
        await self._pool.close()

    async def _forget_waiters(self, drawn: list[tuple[str, str]]) -> None:
        """Delete this object's rows of ``waiters`` (else each stays until a claim of
        its queue drops it, ``WAITER_STALE_MS`` after its sleep ended), best effort: a
        server that does not answer within a moment leaves them to that. A reserve
        still on its way out when the object closes may register once more."""
        params = {"queues": [q for q, _ in drawn], "tokens": [t for _, t in drawn]}
        try:
            async with self._pool.connection(timeout=min(self._settings.pool_timeout, 2.0)) as conn:
                await conn.execute(self.sql.FORGET_WAITERS, params)
        except (psycopg.Error, PoolTimeout) as exc:
            _log.info("delayq: closing, the postgres waiters were left: %s", exc)


def open_async_backend(url: str, **options: Any) -> AsyncPostgresBackend:
    """Open this face of ``postgresql://`` (options: see :mod:`delayq.backends.postgres`)."""
    return AsyncPostgresBackend(url, **options)
