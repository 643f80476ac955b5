"""How a waiting reserve times its sleep: until the next event the server reported, or
its own deadline, whichever comes first, woken a hair after the due instant."""

from __future__ import annotations

import time

from ._scripts import Claim

__all__ = ["HAIR", "expired", "sleep_for"]

#: A reserve wakes this long after the due instant, so the server's clock has passed it.
HAIR = 0.0001


def sleep_for(claim: Claim, give_up: float | None, ahead_ms: int = 0) -> float | None:
    """How long a reserve that claimed nothing sleeps: until the next event (server
    clock; a due time less ``ahead_ms``, for a reserve that fires ahead) or its own
    deadline (monotonic), whichever comes first; None: no limit."""
    timeout = claim.seconds_until_next(ahead_ms)
    if timeout is not None:
        timeout += HAIR
    if give_up is not None:
        left = max(0.0, give_up - time.monotonic())
        timeout = left if timeout is None else min(timeout, left)
    return timeout


def expired(give_up: float | None) -> bool:
    return give_up is not None and time.monotonic() >= give_up
