"""A put made while a wake-up path is held at a named point (a listener connecting, a
watcher before its first reading): the shared part of the tests that open such a
window."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["woken_after_the_window"]


def woken_after_the_window(
    reserve: Callable[[float], list[Any]],
    wait: float,
    held: Callable[[], None],
    put: Callable[[], str],
    release: Callable[[], None],
    what: str,
) -> None:
    """Run ``reserve(wait)`` on a thread; once ``held()`` returns (the path is held and
    the consumer asleep), ``put()`` a message (its id), then ``release()`` the path.
    The reserve must return that message within a quarter of its wait from the
    release, not at the end of its wait (``what``: the path, for the message)."""
    got: list[Any] = []
    ended: list[float] = []

    def consume() -> None:
        got.extend(reserve(wait))
        ended.append(time.monotonic())

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        held()
        put_id = put()
        released = time.monotonic()
    finally:
        release()
    thread.join(wait + 10)
    assert [m.id for m in got] == [put_id]
    took = ended[0] - released
    assert took < wait / 4, f"woken {took:.2f} s after {what}"
