"""Bounds on an await that never lose their caller's cancellation.

Before Python 3.12, :func:`asyncio.wait_for` runs what it awaits in a task of its own,
and a cancellation of the caller that comes as that task ends is dropped: wait_for
returns the result, and the caller runs on as if it had never been cancelled
(CPython gh-86296). A Worker's cron producer, cancelled by a stop while the broker's
acknowledgement of its put came in, went on putting ticks, and the stop waited for it
for ever (1 stop in 20 on kafka://). :func:`timeout` bounds the caller's own task
instead: at the deadline it cancels that task, and tells its own cancellation from
any other, which goes on up. It is :func:`asyncio.timeout` from Python 3.11.3
(earlier 3.11 releases miscounted nested cancellations), else the ``async-timeout``
package's, as redis-py does. Every bounded await in delayq goes through here."""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from typing import TypeVar

if sys.version_info >= (3, 11) and sys.version_info >= (3, 11, 3):  # mypy reads the first
    from asyncio import timeout, timeout_at
else:  # pragma: no cover (the suite runs on 3.11.3 and later)
    from async_timeout import timeout, timeout_at

__all__ = ["timeout", "timeout_at", "within"]

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """``await awaitable`` for up to ``seconds`` (None: no limit), else
    :class:`asyncio.TimeoutError`, what it awaited cancelled (a task too, as
    :func:`asyncio.wait_for` does). Its caller's own cancellation always reaches it."""
    async with timeout(seconds):
        return await awaitable
