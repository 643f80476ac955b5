"""The one retry loop of the Redis backend, written once for asyncio: its sync twin,
``_sync/retry.py``, is generated from this file by ``scripts/unasync.py``. What is
retried, how many times, and when a call that was written may be sent again is
:func:`..._resend.again`'s to say; this loop only runs the attempts."""

from __future__ import annotations

from typing import TypeVar

from ....._timer import sleep_async
from ..._resend import ATTEMPT, BACKOFF, RETRIABLE, AsyncSend, Attempt, again

__all__ = ["call_async"]

T = TypeVar("T")


async def call_async(send: AsyncSend[T], safe: bool, operation: str = "a script") -> T:
    """``send(attempt)``, one try of a call, tried again after a failure as
    :func:`..._resend.again` says; ``safe``: the call may run twice; ``operation``: what
    it is, for the error when its fate is unknown."""
    failures = 0
    while True:
        attempt = Attempt()
        token = ATTEMPT.set(attempt)
        try:
            return await send(attempt)
        except RETRIABLE as exc:
            failures += 1
            if not again(exc, attempt, safe, failures, operation):
                raise
        finally:
            ATTEMPT.reset(token)
        await sleep_async(BACKOFF.compute(failures))
