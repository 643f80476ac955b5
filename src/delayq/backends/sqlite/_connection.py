"""Connections to one SQLite file: a per-process pool, transactions, busy retries.

* **A pool of connections.** Each operation borrows a connection, runs one
  transaction and gives it back, so threads never share a connection mid-transaction
  and a process opens as many connections as it has concurrent callers.
* **Writes are ``BEGIN IMMEDIATE``.** The write lock is taken before anything is
  read, so a transaction never has to upgrade a stale read snapshot (which SQLite
  refuses with ``SQLITE_BUSY`` without waiting). "Now" is read once the lock is held,
  as a :class:`~delayq.durable.message.Now` (the floor and the ceiling in ms of one
  ``time.time()`` reading).
* **Busy is retried inside delayq.** SQLite's own busy handler waits up to
  ``busy_timeout`` for the lock; should it still report busy (or locked), the whole
  transaction is rolled back and retried after a jittered, growing pause, until
  ``busy_budget`` seconds have passed; only then does a :class:`TimeoutError` say so.
* **Never across fork.** SQLite keeps the locks a process holds on a file in one table
  per process, which a forked child inherits without the locks themselves (POSIX locks
  are not inherited): a connection the child opened on a file its parent had open
  would take no lock at all, and once the parent closed, another process could
  checkpoint and delete the WAL under the child, whose later commits were then lost.
  So before a fork, every pool closes its idle connections (and the change watchers
  theirs, :mod:`._wakeup`): with none left open, the child starts from a clean table
  and opens its own. A connection still lent to another thread at the fork cannot be
  closed; the child then refuses to use that file (:class:`RuntimeError`, saying
  why) rather than write without locks. A child drops (without closing) every
  connection it inherited.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from importlib import resources
from typing import TypeVar

from ..._fork import generation
from ...durable.message import Now
from ...errors import QueueClosed
from . import statements as sql
from ._constants import SQLITE_WAL_AUTOCHECKPOINT

__all__ = ["SCHEMA_VERSION", "Pool", "is_busy"]

T = TypeVar("T")

#: The schema version this code writes (``schema.sql``).
SCHEMA_VERSION = 1

_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED (named in sqlite3 from 3.11)
#: First and longest pause between two tries of a busy transaction, in seconds.
_FIRST_PAUSE = 0.0005
_MAX_PAUSE = 0.05

# Connections inherited through fork: kept referenced forever so that the child never
# finalizes (closes) them; closing would release POSIX locks the parent relies on.
_ORPHANS: list[sqlite3.Connection] = []
_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()
#: The files on which a connection stayed open across the last fork (read by the child).
_OPEN_AT_FORK: set[str] = set()


def is_busy(exc: sqlite3.Error) -> bool:
    """True when ``exc`` says the database was busy or locked (worth a retry)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY_CODES
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _now() -> Now:
    return Now.of_seconds(time.time())


class Pool:
    """Connections to the SQLite file ``path``, with one-transaction operations."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float,
        busy_budget: float,
        synchronous: str,
        now: Callable[[], Now] = _now,
    ) -> None:
        self.path = path
        self.now = now
        self._busy_timeout = busy_timeout
        self._busy_budget = busy_budget
        self._synchronous = synchronous
        self._idle: list[sqlite3.Connection] = []
        #: The connections lent to a thread now (set.add and discard: one step each).
        self._lent: set[sqlite3.Connection] = set()
        #: Why this (forked) process may not use the file; None: it may.
        self._unsafe: str | None = None
        self._fork = generation()
        self._ready = False
        self._ready_lock = threading.Lock()
        self.closed = False
        _POOLS.add(self)

    # -- connections ----------------------------------------------------------------

    def connect(self) -> sqlite3.Connection:
        """A new connection, configured, with the schema in place."""
        if not self._ready:
            self._prepare()
        return self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,  # autocommit: transactions are explicit
                check_same_thread=False,  # the pool hands it to one thread at a time
                cached_statements=64,
            )
        except sqlite3.OperationalError as exc:
            raise sqlite3.OperationalError(f"cannot open {self.path!r}: {exc}") from exc
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        # Each checkpoint syncs the file: bulk puts go faster with fewer of them.
        conn.execute(f"PRAGMA wal_autocheckpoint = {SQLITE_WAL_AUTOCHECKPOINT}")
        return conn

    def _prepare(self) -> None:
        """Switch the file to WAL and create the schema, once per pool."""
        with self._ready_lock:
            if self._ready:
                return
            conn = self._open()
            self._lent.add(conn)  # open across a fork meanwhile: the child must know
            try:
                mode = self._retry(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
                if mode is None or str(mode[0]).lower() != "wal":
                    raise RuntimeError(
                        f"delayq needs SQLite's WAL mode, which {self.path!r} refused "
                        f"(journal_mode={mode[0] if mode else None!r})"
                    )
                script = resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
                self._retry(lambda: self._apply_schema(conn, script))
                version = conn.execute(sql.SCHEMA_VERSION).fetchone()
                if version is None or int(version[0]) > SCHEMA_VERSION:
                    raise RuntimeError(
                        f"{self.path!r} has delayq schema version {version and version[0]}, "
                        f"newer than this delayq understands ({SCHEMA_VERSION})"
                    )
            finally:
                self._lent.discard(conn)
                conn.close()
            self._ready = True

    @staticmethod
    def _apply_schema(conn: sqlite3.Connection, script: str) -> None:
        try:
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nCOMMIT;")
        except BaseException:
            _rollback(conn)
            raise

    def _borrow(self) -> sqlite3.Connection:
        if self.closed:
            raise QueueClosed("the queue is closed")
        if self._fork != generation():
            self.after_fork()
        if self._unsafe is not None:
            raise RuntimeError(self._unsafe)
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self.connect()
        self._lent.add(conn)
        return conn

    def _give_back(self, conn: sqlite3.Connection, healthy: bool = True) -> None:
        self._lent.discard(conn)
        if self.closed or not healthy or conn.in_transaction:
            _close(conn)
        else:
            self._idle.append(conn)

    def before_fork(self) -> bool:
        """Close the idle connections (the module docstring); True when one is still
        lent to a thread."""
        while True:
            try:
                conn = self._idle.pop()  # another thread may take the last one meanwhile
            except IndexError:
                break
            _close(conn)
        return bool(self._lent)

    def after_fork(self) -> None:
        """Forget the connections of the parent process (see the module docstring)."""
        _ORPHANS.extend(self._idle)
        _ORPHANS.extend(self._lent)
        self._idle = []
        self._lent = set()
        self._fork = generation()
        self._ready_lock = threading.Lock()
        if self.path in _OPEN_AT_FORK:
            self._unsafe = (
                f"the SQLite database {self.path!r} had a connection in use by another "
                "thread of the parent process when it forked, so this process cannot use "
                "it safely (SQLite's locks are held per process and a child inherits none): "
                "open the queue in the child, or fork while no other thread is in a call"
            )

    def close(self) -> None:
        """Close idle connections now and busy ones when they come back. Idempotent."""
        self.closed = True
        if self._fork != generation():
            self.after_fork()
        while self._idle:
            _close(self._idle.pop())

    # -- transactions ---------------------------------------------------------------

    def write(self, work: Callable[[sqlite3.Connection, Now], T]) -> T:
        """Run ``work(conn, now)`` in one ``BEGIN IMMEDIATE`` transaction and commit
        it; roll back if it raises. Busy databases are retried (module docstring)."""

        def transaction(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn, self.now())
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            return result

        return self.run(transaction)

    def read(self, work: Callable[[sqlite3.Connection, Now], T]) -> T:
        """Run ``work(conn, now)``, which must be one read-only statement (its own
        consistent snapshot), with busy retries."""
        return self.run(lambda conn: work(conn, self.now()))

    def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work`` on a borrowed connection, retrying while the database is busy."""

        def attempt() -> T:
            conn = self._borrow()
            healthy = True
            try:
                return work(conn)
            except sqlite3.Error as exc:
                healthy = isinstance(exc, sqlite3.OperationalError) and is_busy(exc)
                raise
            finally:
                self._give_back(conn, healthy)

        return self._retry(attempt)

    def _retry(self, attempt: Callable[[], T]) -> T:
        give_up = time.monotonic() + self._busy_budget
        pause = _FIRST_PAUSE
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                if time.monotonic() >= give_up:
                    raise TimeoutError(
                        f"the SQLite database {self.path!r} stayed busy for more than "
                        f"{self._busy_budget:g} s"
                    ) from exc
            if self.closed:
                raise QueueClosed("the queue is closed")
            time.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, _MAX_PAUSE)


def _rollback(conn: sqlite3.Connection) -> None:
    # On failure the connection stays in its transaction, and the pool drops it.
    with contextlib.suppress(sqlite3.Error):
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _close(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.close()


def _before_fork() -> None:
    _OPEN_AT_FORK.clear()
    for pool in list(_POOLS):
        if pool.before_fork():
            _OPEN_AT_FORK.add(pool.path)


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
