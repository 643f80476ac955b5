"""``sqlite:///``: the embedded durable backend, one SQLite file shared by processes.

URLs: ``sqlite:///relative/path.db`` (relative to the current directory when the
queue is opened) or ``sqlite:////absolute/path.db``. The file and its schema are
created on first use. ``sqlite:///:memory:`` is refused: an in-memory database
exists per connection, so the connections of one queue (one per thread), its change
watcher and other processes would each see a different, empty database; use
``memory://`` for an in-process queue, or a file in a temporary directory.

Options (keyword arguments of ``Queue``/``AsyncQueue``, or URL query parameters):

* ``busy_timeout`` (seconds, default 30): how long a busy database is waited for,
  retried inside delayq, before :class:`TimeoutError`; "database is locked" never
  reaches the caller before that.
* ``synchronous`` (``"normal"`` by default, or ``"full"``/``"extra"``/``"off"``):
  SQLite's ``PRAGMA synchronous``. In WAL mode ``normal`` loses nothing when a
  process crashes or is killed; only an OS crash or power loss may drop the last
  commits. ``full`` makes every commit survive those too, at a cost in throughput.
* ``poll_interval`` (seconds, default 0.02): how often a waiting consumer checks
  whether another process committed.

How it works: WAL mode; every operation is one transaction (``BEGIN IMMEDIATE`` when
it writes) of the statements in :mod:`.statements`, each the mirror of a pure
transition of :mod:`delayq.durable.message`; a claim is one ``UPDATE ... RETURNING``
over the partial index ``(queue, due_at, seq)``, right after the lease expiries of
that queue are settled in the same transaction. "Now" is this machine's wall clock
in epoch ms, read once per transaction as its floor and ceiling (the processes
sharing a file share that clock); ``seq`` comes from a
counter row bumped in the writing transaction, so it increases across processes.
The operations: :mod:`._core`; connections: :mod:`._connection`; waiting:
:mod:`._wakeup`; URLs: :mod:`._url`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..._constants import SQLITE_ASYNC_THREADS
from ...durable.message import Position, PutRequest, Record, State, Stats
from ._core import Core
from ._url import parse_url

__all__ = [
    "AsyncSQLiteBackend",
    "SQLiteBackend",
    "open_async_backend",
    "open_backend",
    "parse_url",
]

T = TypeVar("T")


# -- waiting ---------------------------------------------------------------------------


def _seconds_until(next_ms: int | None, give_up: float | None) -> float | None:
    """How long to sleep: until ``next_ms`` (epoch ms) or ``give_up`` (monotonic)."""
    timeout: float | None = None
    if next_ms is not None:
        timeout = max(0.0, next_ms / 1000.0 - time.time())
    if give_up is not None:
        left = max(0.0, give_up - time.monotonic())
        timeout = left if timeout is None else min(timeout, left)
    return timeout


# -- the sync face --------------------------------------------------------------------------


class SQLiteBackend:
    """The sync face of ``sqlite:///`` (see :class:`~delayq.durable.backend.Backend`).

    Safe to share between threads: each call borrows a connection of the object's
    pool for one transaction. Opening creates the file and schema if needed.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self._core = Core(url, **options)
        self._core.pool.run(lambda conn: None)  # open (and create) the file now

    @property
    def path(self) -> str:
        """The absolute path of the database file."""
        return self._core.pool.path

    def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        return self._core.put(queue, requests)

    def reserve(self, queue: str, *, limit: int, lease_ms: int, wait: float | None) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        core = self._core
        give_up = None if wait is None else time.monotonic() + wait
        peek = False
        while True:
            generation = core.wake.generation
            records, next_ms = core.claim(queue, limit, lease_ms, peek)
            if records or (give_up is not None and time.monotonic() >= give_up):
                return records
            timeout = _seconds_until(next_ms, give_up)
            if timeout is None or timeout > 0.0:
                core.wake.wait(generation, timeout)
            peek = True

    def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        self._core.ack(queue, id, token)

    def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`."""
        return self._core.ack_many(queue, items)

    def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`Backend.nack <delayq.durable.backend.Backend.nack>`."""
        return self._core.nack(queue, id, token, delay_ms, error, dead=dead)

    def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        self._core.release(queue, id, token)

    def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return self._core.extend(queue, id, token, lease_ms)

    def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return self._core.cancel(queue, id)

    def reschedule(self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        return self._core.reschedule(queue, id, delay_ms, at_ms)

    def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return self._core.get(queue, id)

    def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return self._core.stats(queue)

    def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>`."""
        return self._core.dead(queue, limit, after_seq)

    def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        return self._core.retry_dead(queue, ids)

    def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return self._core.purge(queue, state)

    def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        return self._core.queues()

    def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        return self._core.peek(queue, state, limit, after)

    def due_counts(self, queue: str, *, horizon_ms: int, buckets: int) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        return self._core.due_counts(queue, horizon_ms, buckets)

    def close(self) -> None:
        """See :meth:`Backend.close <delayq.durable.backend.Backend.close>`; the file
        and its messages stay."""
        self._core.close()


# -- the async face -------------------------------------------------------------------------


class AsyncSQLiteBackend:
    """The asyncio face of ``sqlite:///`` (see :class:`~delayq.durable.backend.AsyncBackend`).

    Every operation runs on a small thread pool of its own, so the event loop never
    waits for SQLite; a waiting ``reserve`` sleeps on the loop itself. Creating it does
    no I/O: the file is opened on first use. A cancelled ``reserve`` claims nothing;
    a cancelled call of another operation may still take effect.
    """

    def __init__(self, url: str, **options: Any) -> None:
        self._core = Core(url, **options)
        self._executor = ThreadPoolExecutor(
            max_workers=SQLITE_ASYNC_THREADS, thread_name_prefix="delayq-sqlite"
        )

    @property
    def path(self) -> str:
        """The absolute path of the database file."""
        return self._core.pool.path

    async def _call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        self._core.check_open()
        return await asyncio.wrap_future(self._executor.submit(function, *args, **kwargs))

    async def _claim(
        self, queue: str, limit: int, lease_ms: int, peek: bool
    ) -> tuple[list[Record], int | None]:
        future = self._executor.submit(self._core.claim, queue, limit, lease_ms, peek)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.add_done_callback(lambda done: self._unclaim(queue, done))
            raise

    def _unclaim(self, queue: str, done: Future[tuple[list[Record], int | None]]) -> None:
        """After a cancelled claim finished anyway: give back what it claimed."""
        if done.cancelled() or done.exception() is not None:
            return
        records = done.result()[0]
        if records:
            try:
                self._executor.submit(self._core.unclaim, queue, records)
            except RuntimeError:  # the executor is shut down: give them back here
                self._core.unclaim(queue, records)

    async def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put <delayq.durable.backend.Backend.put>`."""
        return await self._call(self._core.put, queue, requests)

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`Backend.reserve <delayq.durable.backend.Backend.reserve>`."""
        core = self._core
        give_up = None if wait is None else time.monotonic() + wait
        peek = False
        while True:
            core.check_open()
            generation = core.wake.generation
            records, next_ms = await self._claim(queue, limit, lease_ms, peek)
            if records or (give_up is not None and time.monotonic() >= give_up):
                return records
            timeout = _seconds_until(next_ms, give_up)
            if timeout is None or timeout > 0.0:
                await core.wake.wait_async(generation, timeout)
            peek = True

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack <delayq.durable.backend.Backend.ack>`."""
        await self._call(self._core.ack, queue, id, token)

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many <delayq.durable.backend.Backend.ack_many>`."""
        return await self._call(self._core.ack_many, queue, items)

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
        """See :meth:`Backend.nack <delayq.durable.backend.Backend.nack>`."""
        return await self._call(self._core.nack, queue, id, token, delay_ms, error, dead=dead)

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release <delayq.durable.backend.Backend.release>`."""
        await self._call(self._core.release, queue, id, token)

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend <delayq.durable.backend.Backend.extend>`."""
        return await self._call(self._core.extend, queue, id, token, lease_ms)

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel <delayq.durable.backend.Backend.cancel>`."""
        return await self._call(self._core.cancel, queue, id)

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`Backend.reschedule <delayq.durable.backend.Backend.reschedule>`."""
        return await self._call(self._core.reschedule, queue, id, delay_ms, at_ms)

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get <delayq.durable.backend.Backend.get>`."""
        return await self._call(self._core.get, queue, id)

    async def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats <delayq.durable.backend.Backend.stats>`."""
        return await self._call(self._core.stats, queue)

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead <delayq.durable.backend.Backend.dead>`."""
        return await self._call(self._core.dead, queue, limit, after_seq)

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead <delayq.durable.backend.Backend.retry_dead>`."""
        return await self._call(self._core.retry_dead, queue, ids)

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge <delayq.durable.backend.Backend.purge>`."""
        return await self._call(self._core.purge, queue, state)

    async def queues(self) -> list[str]:
        """See :meth:`Backend.queues <delayq.durable.backend.Backend.queues>`."""
        return await self._call(self._core.queues)

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek <delayq.durable.backend.Backend.peek>`."""
        return await self._call(self._core.peek, queue, state, limit, after)

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts <delayq.durable.backend.Backend.due_counts>`."""
        return await self._call(self._core.due_counts, queue, horizon_ms, buckets)

    async def close(self) -> None:
        """See :meth:`Backend.close <delayq.durable.backend.Backend.close>`; the file
        and its messages stay."""
        if self._core.closed:
            return
        self._core.closed = True
        self._core.wake.close()
        # Closing the last connection checkpoints the WAL: not on the event loop.
        await asyncio.wrap_future(self._executor.submit(self._core.pool.close))
        self._executor.shutdown(wait=False)


def open_backend(url: str, **options: Any) -> SQLiteBackend:
    """Open the sync face of ``sqlite:///path`` (options: see the module docstring)."""
    return SQLiteBackend(url, **options)


def open_async_backend(url: str, **options: Any) -> AsyncSQLiteBackend:
    """Open the async face of ``sqlite:///path`` (options: see the module docstring)."""
    return AsyncSQLiteBackend(url, **options)
