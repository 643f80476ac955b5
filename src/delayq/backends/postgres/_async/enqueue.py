"""A put inside the caller's own transaction, written once as its asyncio face: the
source of the generated :mod:`delayq.backends.postgres._sync.enqueue`.

Many pick PostgreSQL for this: the job is enqueued in the same transaction as the
data it is about, so it exists exactly when that data does::

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders ...")
        enqueue(conn, "emails", {"order": 42}, delay=60)
    # committed: the message is there (and waiting consumers are notified);
    # rolled back: it never existed
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from ...._names import check_queue_name
from ....durable.facade import build_request
from ....durable.message import OnConflict
from ....durable.retry import RetryPolicy
from ....durable.serializer import Codec
from ....durable.tracing import sending
from .._url import DEFAULT_SCHEMA, check_schema
from ..statements import Statements
from .backend import put_on, upgrade

__all__ = ["enqueue_async"]


async def enqueue_async(
    conn: psycopg.AsyncConnection[Any],
    queue: str,
    payload: Any,
    *,
    delay: Any = None,
    at: Any = None,
    id: str | None = None,
    on_conflict: OnConflict = "ignore",
    max_attempts: int | None = None,
    headers: Mapping[str, str] | None = None,
    schema: str = DEFAULT_SCHEMA,
    serializer: Any = None,
) -> str:
    """Put a message on ``queue`` (of the store in ``schema``) through ``conn``, a
    psycopg connection the caller holds, inside its open transaction: the message
    exists only if that transaction commits (in autocommit mode, at once). Returns its
    id. The arguments are :meth:`Queue.put <delayq.Queue.put>`'s, checked before
    anything is sent; ``serializer`` is the queues' (JSON by default); ``max_attempts``
    defaults to :class:`~delayq.RetryPolicy`'s. The schema is created or upgraded
    first if needed (in the same transaction). Waiting consumers are notified when the
    transaction commits.
    """
    name = check_queue_name(queue)
    checked = check_schema(schema)
    request = build_request(
        Codec(serializer),
        RetryPolicy().max_attempts,
        payload,
        delay,
        at,
        id,
        on_conflict,
        max_attempts,
        headers,
    )
    await upgrade(conn, checked)
    with sending(name, (request,), batch=False):
        await put_on(conn, Statements(checked), name, [request], announce=True)
    return request.id
