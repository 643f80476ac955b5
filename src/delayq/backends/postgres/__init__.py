"""``postgresql://``: durable queues in a PostgreSQL database (13 or later).

URLs: ``postgresql://user:password@host:port/database`` (or ``postgres://``), as libpq
reads them: every query parameter that is not one of delayq's options below goes to
libpq as is (``sslmode``, ``sslrootcert``, ``application_name`` (``delayq`` unless
given), ``connect_timeout``, ``options``, ``target_session_attrs``...); any other
is :class:`~delayq.errors.UnsupportedURL`, which names it, when the queue is opened.

Options (keyword arguments of ``Queue``/``AsyncQueue``, or URL query parameters):

* ``schema`` (default ``delayq``): the schema that holds the queues' tables, created
  and upgraded on first use (:mod:`._schema`); stores in two schemas are separate.
* ``notify`` (``on`` by default): waiting consumers are woken by LISTEN/NOTIFY, one
  listening connection per backend object while a consumer waits. ``off`` (for a
  PgBouncer in transaction mode, where LISTEN does not work): they look again every
  ``poll_interval`` instead. The put of one message is a prepared statement, as
  psycopg makes of any statement run five times on a connection: behind a PgBouncer
  in transaction mode, use 1.21 or later with ``max_prepared_statements`` set.
* ``poll_interval`` (seconds, default 0.5): how often a waiting consumer looks with
  ``notify=off``.
* ``pool_size`` (default 16): the most connections of a backend object's pool, opened
  as concurrent calls need them (concurrent puts commit together only on connections
  of their own).
* ``pool_timeout`` (seconds, default 10): how long a call waits for a connection of
  the pool (all busy, or none can be made) before ``psycopg_pool.PoolTimeout``.

Timeouts: unless the URL sets them, connections get ``connect_timeout=5``,
``tcp_user_timeout=10000`` (ms) and keepalives (5 s idle, 2 s apart, 3 probes), so a
call to a server that stops answering fails in about 10 s (docs/durability.md,
"Network and disk faults"). A change whose connection broke after it was sent raises
:class:`~delayq.errors.OutcomeUnknown` (also a ``psycopg.OperationalError``) and is
not sent again; a waiting ``reserve`` rides an outage out.

A first use whose connection fails raises :class:`ServerRefused` (a
:class:`~delayq.errors.DelayqError`, also a ``psycopg.OperationalError``) within
``connect_timeout``, with one line that names the URL (its password hidden) and the
cause: the server is not answering at host:port, role "x" does not exist, database "x"
does not exist, the server does not support SSL.

How it works: one row per message in ``<schema>.messages``; every operation is one
statement of :mod:`.statements` (each the mirror of a pure transition of
:mod:`delayq.durable.message`), run in autocommit, or one transaction of a few. "Now"
is the server's ``clock_timestamp()``, read once per statement. A claim is one call of
the schema's ``claim()`` function: it settles the queue's expired leases, then takes
the earliest due messages by ``(due_at, seq)`` with ``FOR UPDATE SKIP LOCKED`` over a
partial index. Waiting: :mod:`._wakeup`. :func:`enqueue` (:func:`enqueue_async` on an
``AsyncConnection``) puts a message inside a transaction of the caller's own psycopg
connection, so it exists only if that transaction commits.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_names
from ...durable.descriptor import BackendDescriptor, BackendDriver

if TYPE_CHECKING:
    from ._async.backend import AsyncPostgresBackend, open_async_backend
    from ._async.enqueue import enqueue_async
    from ._connect import ServerRefused
    from ._driver import OUTAGE_ERRORS
    from ._sync.backend import PostgresBackend, open_backend
    from ._sync.enqueue import enqueue

__all__ = [
    "DESCRIPTOR",
    "OUTAGE_ERRORS",
    "AsyncPostgresBackend",
    "PostgresBackend",
    "ServerRefused",
    "enqueue",
    "enqueue_async",
    "open_async_backend",
    "open_backend",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "AsyncPostgresBackend": "._async.backend",
        "open_async_backend": "._async.backend",
        "enqueue_async": "._async.enqueue",
        "PostgresBackend": "._sync.backend",
        "open_backend": "._sync.backend",
        "enqueue": "._sync.enqueue",
        "OUTAGE_ERRORS": "._driver",
        "ServerRefused": "._connect",
    },
    globals(),
)


def _load() -> BackendDriver:
    from ._driver import DRIVER  # noqa: PLC0415

    return DRIVER


#: postgresql:// as delayq's faces see it (see delayq.durable.descriptor).
DESCRIPTOR = BackendDescriptor(
    name="postgres",
    schemes=("postgresql", "postgres"),
    load=_load,
    client=("psycopg", "psycopg_pool"),
    extra="postgres",
)
