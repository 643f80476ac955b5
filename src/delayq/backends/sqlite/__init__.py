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
* ``notify`` (``on`` by default): a commit that makes a message due wakes the
  consumers waiting in other processes at once, through a datagram socket per
  waiting backend object in the directory ``<file>-wake`` beside the database
  (where Unix sockets exist and the socket's path fits in one). ``off``: this
  object neither sends nor listens, and its consumers see other processes' commits
  at the next poll.
* ``poll_interval`` (seconds, default 0.02): how often a waiting consumer checks
  whether another process committed, notified or not (a lost notification, or a
  writer with ``notify=off``, costs at most this).

How it works: WAL mode; every operation is one transaction (``BEGIN IMMEDIATE`` when
it writes) of the statements in :mod:`.statements`, each the mirror of a pure
transition of :mod:`delayq.durable.message`; a claim is one ``UPDATE ... RETURNING``
over the partial index ``(queue, due_at, seq)``, right after the lease expiries of
that queue are settled in the same transaction. "Now" is this machine's wall clock
in epoch ms, read once per transaction as its floor and ceiling (the processes
sharing a file share that clock); ``seq`` comes from a
counter row bumped in the writing transaction, so it increases across processes.
The operations: :mod:`._core`; connections: :mod:`._connection`; waiting:
:mod:`._wakeup` and :mod:`._notify`; URLs: :mod:`._url`. The asyncio face is written by hand in
:mod:`._async.backend`; the sync face is generated from it by ``scripts/unasync.py``
into :mod:`._sync.backend`; they differ only in their runner (:mod:`._runner`: a thread
pool, or the calling thread) and in how a waiting ``reserve`` sleeps.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_names
from ...durable.descriptor import BackendDescriptor, BackendDriver
from ._url import parse_url

if TYPE_CHECKING:
    from ._async.backend import AsyncSQLiteBackend, open_async_backend
    from ._driver import OUTAGE_ERRORS
    from ._sync.backend import SQLiteBackend, open_backend

__all__ = [
    "DESCRIPTOR",
    "OUTAGE_ERRORS",
    "AsyncSQLiteBackend",
    "SQLiteBackend",
    "database_file",
    "open_async_backend",
    "open_backend",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "AsyncSQLiteBackend": "._async.backend",
        "open_async_backend": "._async.backend",
        "SQLiteBackend": "._sync.backend",
        "open_backend": "._sync.backend",
        "OUTAGE_ERRORS": "._driver",
    },
    globals(),
)


def database_file(url: str) -> str:
    """The absolute path of the database file of a ``sqlite:///`` URL (the queue's
    file, which the CLI names in its messages); :class:`~delayq.errors.UnsupportedURL`
    for a malformed one."""
    return parse_url(url)[0]


def _load() -> BackendDriver:
    from ._driver import DRIVER  # noqa: PLC0415

    return DRIVER


#: sqlite:/// as delayq's faces see it (see delayq.durable.descriptor).
DESCRIPTOR = BackendDescriptor(
    name="sqlite",
    schemes=("sqlite",),
    load=_load,
    client=("sqlite3",),
    database_file=database_file,
)
