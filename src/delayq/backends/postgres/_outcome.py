"""What a change whose reply was lost raises on ``postgresql://``, and when a failed
call is tried again."""

from __future__ import annotations

from typing import Any, NoReturn

import psycopg

from ...errors import OutcomeUnknown

__all__ = ["QUICK_FAILURE", "ReplyLost", "raise_lost"]

#: A call that failed within this many seconds found its connection broken at once
#: (a restarted server leaves every pooled one so): a read or a claim is tried again
#: on another. One that failed later waited for its reply until a timeout: it is not
#: tried again, as the next would wait as long.
QUICK_FAILURE = 1.0


class ReplyLost(OutcomeUnknown, psycopg.OperationalError):
    """A change was sent and its connection broke before the reply (a timeout, a
    server gone): it may have run. A ``psycopg.OperationalError`` too, so code that
    catches those catches it as before."""


def raise_lost(
    conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any],
    exc: Exception,
    operation: str | None,
) -> NoReturn:
    """Raise :class:`ReplyLost` (from ``exc``) when ``exc`` broke ``conn`` during the
    change ``operation``; else ``exc`` itself (an error the server answered with, or a
    read: not a change, nothing to be unsure of)."""
    if operation is not None and conn.broken:
        raise ReplyLost(
            f"{operation} was sent to PostgreSQL but its reply was lost ({exc}): it may or"
            " may not have taken effect, and it was not sent again",
            operation,
        ) from exc
    raise exc
