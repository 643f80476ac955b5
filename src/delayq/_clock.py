"""Clocks: where delayq reads the time, and how a test moves it.

Every queue takes ``clock=``. Delays are measured on the clock's monotonic time;
wall-clock deadlines (``at=``) are converted to monotonic time once, at put, with
the clock's ``time()``. A :class:`FakeClock` only moves when a test calls
:meth:`FakeClock.advance`, which wakes every queue waiting on it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What a queue needs from a clock."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; deadlines live here."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch; used to convert ``at=`` once."""
        ...

    def wait_timeout(self, seconds: float) -> float | None:
        """Real seconds to block in order to let ``seconds`` of this clock pass.

        ``None`` means: block until :meth:`subscribe`'s callback says the clock moved.
        """
        ...

    def subscribe(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` whenever the clock jumps (a no-op for real clocks)."""
        ...

    def unsubscribe(self, callback: Callable[[], object]) -> None:
        """Stop calling ``callback``."""
        ...


class SystemClock:
    """The real clocks: :func:`time.monotonic` and :func:`time.time`."""

    # Plain functions as attributes: reading the clock is on every hot path.
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    @staticmethod
    def wait_timeout(seconds: float) -> float | None:
        """Real time passes by itself: block for exactly ``seconds``."""
        return seconds if seconds > 0.0 else 0.0

    def subscribe(self, callback: Callable[[], object]) -> None:
        """Real time moves smoothly; nothing to announce."""

    def unsubscribe(self, callback: Callable[[], object]) -> None:
        """Nothing was subscribed."""

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()

_Ref = Callable[[], Callable[[], object] | None]


class FakeClock:
    """A clock that moves only when told to, for deterministic timing tests.

    ``advance(seconds)`` moves monotonic and wall time together and wakes every
    queue that waits on this clock, so a blocked ``get`` returns as soon as the fake
    time passes its item's deadline.
    """

    def __init__(self, monotonic: float = 1_000.0, wall: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._monotonic = float(monotonic)
        self._wall = float(wall)
        self._subscribers: list[_Ref] = []

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self._monotonic

    def time(self) -> float:
        """The fake wall time (epoch seconds)."""
        return self._wall

    @staticmethod
    def wait_timeout(seconds: float) -> float | None:
        """Fake time never passes by itself: block until :meth:`advance` wakes us."""
        return None

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake every waiting queue."""
        if not seconds >= 0.0 or seconds == float("inf"):
            raise ValueError(f"FakeClock.advance needs a finite seconds >= 0, got {seconds!r}")
        with self._lock:
            self._monotonic += seconds
            self._wall += seconds
            refs = list(self._subscribers)
        for ref in refs:
            callback = ref()
            if callback is not None:
                callback()

    def subscribe(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` after each :meth:`advance`; bound methods are held weakly."""
        ref: _Ref
        if hasattr(callback, "__self__") and hasattr(callback, "__func__"):
            ref = weakref.WeakMethod(callback)
        else:
            ref = lambda: callback  # noqa: E731
        with self._lock:
            self._subscribers = [r for r in self._subscribers if r() is not None]
            self._subscribers.append(ref)

    def unsubscribe(self, callback: Callable[[], object]) -> None:
        """Forget ``callback`` (and any subscriber that was garbage-collected)."""
        with self._lock:
            self._subscribers = [
                r for r in self._subscribers if (c := r()) is not None and c != callback
            ]

    def __repr__(self) -> str:
        return f"FakeClock(monotonic={self._monotonic!r}, wall={self._wall!r})"
