"""DelayQueue: a thread-safe delay queue over any TimerStore.

The operations that never wait (put, cancel, reschedule, peek, clear, close) live
in :class:`QueueCore`, shared with :class:`~delayq.AsyncDelayQueue`; the two faces
differ only in how a getter sleeps and is woken.

Wake-ups. Sleeping getters all sleep until ``_wake_at``, the earliest deadline they
know of (or until their own timeout). A change that makes something due earlier
than ``_wake_at`` wakes one of them; a getter that leaves while others still wait
hands the watch on ("baton"), so a wake-up consumed by a getter that then returned
is never lost. With no getter waiting, ``_wake_at`` is -inf and ``put`` skips all
of this: the fast path is one lock round trip and a heap push.
"""

from __future__ import annotations

import queue as _stdlib_queue
import sys
import threading
from collections.abc import Callable, Iterator
from math import inf
from typing import Generic, TypeVar

from .._clock import SYSTEM_CLOCK, Clock
from .._duration import deadline_from
from ..errors import QueueClosed
from ._constants import DEFAULT_GET_MANY
from .heap import HeapStore
from .store import VALUE, Handle, TimerStore, bind_clock, clock_of

__all__ = ["DelayQueue", "QueueCore"]

T = TypeVar("T")

Empty = _stdlib_queue.Empty

# The finite floats: a delay beyond them is not a delay (deadline_from says why).
_FLOAT_MAX = sys.float_info.max
_FLOAT_MIN = -_FLOAT_MAX
_INT_MIN = int(_FLOAT_MIN)


def check_timeout(timeout: float | None) -> float | None:
    """Validate a ``timeout=`` argument (None, or seconds >= 0)."""
    if timeout is None:
        return None
    if type(timeout) is bool or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be seconds or None, not {type(timeout).__name__}")
    if not 0.0 <= timeout < inf:
        raise ValueError(f"timeout must be finite and >= 0, got {timeout!r}")
    return float(timeout)


def check_max(max_items: int) -> int:
    """Validate a ``max=`` argument (an int >= 1)."""
    if type(max_items) is not int:
        raise TypeError(f"max must be an int, not {type(max_items).__name__}")
    if max_items < 1:
        raise ValueError(f"max must be >= 1, got {max_items}")
    return max_items


class QueueCore(Generic[T]):
    """The non-waiting half of a delay queue; subclasses supply the sleeping getters."""

    def __init__(self, store: TimerStore[T] | None = None, *, clock: Clock | None = None) -> None:
        if store is None:
            store = HeapStore()
        elif len(store) or clock_of(store) is not None:
            raise ValueError("a store belongs to one queue: pass a new, empty store")
        if clock is None:
            clock = SYSTEM_CLOCK
        elif not isinstance(clock, Clock):
            raise TypeError(f"clock must implement delayq.Clock, not {type(clock).__name__}")
        bind_clock(store, clock)  # what Handle.due_at converts with
        self._store = store
        self._clock = clock
        self._monotonic = clock.monotonic
        self._push = store.push
        self._push_due = store.push_due
        self._pop_due = store.pop_due
        self._lock = threading.Lock()
        self._waiters = 0
        self._wake_at = -inf
        self._closed = False
        clock.subscribe(self._on_clock_jump)

    # -- hooks for the two faces ---------------------------------------------------
    def _notify_one(self) -> None:
        raise NotImplementedError

    def _notify_all(self) -> None:
        raise NotImplementedError

    def _on_clock_jump(self) -> None:
        with self._lock:
            if self._waiters:
                self._notify_all()

    # -- producing -----------------------------------------------------------------
    def put(self, item: T, delay: object = None, at: object = None) -> Handle[T]:
        """Add ``item``, due after ``delay`` or at ``at`` (neither: due now).

        ``delay`` is seconds, a timedelta or a string like ``"250ms"``/``"1h30m"``;
        ``at`` is an aware datetime or epoch seconds. Returns the item's handle.
        Raises :class:`QueueClosed` after :meth:`close`.
        """
        # self._deadline(delay, at), inlined: this is the hot path. Seconds as an int or
        # a float come first (a delay queue's puts nearly always carry a delay); only
        # what is surely valid is decided here, anything else goes to deadline_from,
        # so every input gets the plain path's answer (tests/inproc/test_put_fast_path.py).
        push: Callable[[T, float], Handle[T]]
        if at is None:
            kind = type(delay)
            # One branch per type: each comparison then meets one type only, which
            # CPython's specializing interpreter makes a plain float or int compare.
            if kind is float:
                deadline = self._monotonic()
                if delay > 0.0:  # type: ignore[operator]
                    push = self._push
                    deadline += delay  # type: ignore[operator]
                    if deadline > _FLOAT_MAX:  # inf: deadline_from says why
                        deadline, push = self._deadline_and_push(delay, at)
                elif delay >= _FLOAT_MIN:  # type: ignore[operator]
                    push = self._push_due
                else:  # NaN or -inf: deadline_from raises
                    deadline, push = self._deadline_and_push(delay, at)
            elif kind is int:
                deadline = self._monotonic()
                if delay > 0:  # type: ignore[operator]
                    push = self._push
                    try:
                        deadline += delay  # type: ignore[operator]
                    except OverflowError:  # an int beyond any float
                        deadline = inf
                    if deadline > _FLOAT_MAX:
                        deadline, push = self._deadline_and_push(delay, at)
                elif delay >= _INT_MIN:  # type: ignore[operator]
                    push = self._push_due
                else:  # below any float: deadline_from raises
                    deadline, push = self._deadline_and_push(delay, at)
            elif delay is None:
                deadline = self._monotonic()
                push = self._push_due
            else:
                deadline, push = self._deadline_and_push(delay, at)
        else:
            deadline, push = self._deadline_and_push(delay, at)
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise QueueClosed("put() on a closed queue")
            handle = push(item, deadline)
            if deadline < self._wake_at:
                self._wake_at = deadline
                self._notify_one()
        finally:
            lock.release()
        return handle

    def _plain_deadline(self, delay: object, at: object) -> float:
        """:func:`~delayq._duration.deadline_from` on this queue's clock: the answer
        for every input (the fast paths decide only what is surely valid)."""
        return deadline_from(delay, at, self._monotonic(), self._clock.time())

    def _deadline_and_push(
        self, delay: object, at: object
    ) -> tuple[float, Callable[[T, float], Handle[T]]]:
        now = self._monotonic()
        deadline = deadline_from(delay, at, now, self._clock.time())
        return deadline, self._push if deadline > now else self._push_due

    def _deadline(self, delay: object, at: object) -> float:
        """The monotonic deadline for ``delay=`` / ``at=`` (neither: now); seconds as
        an int or a float without a call, as in :meth:`put`."""
        if at is None and (type(delay) is float or type(delay) is int):
            if delay > 0:
                try:
                    deadline: float = self._monotonic() + delay
                except OverflowError:  # an int beyond any float
                    deadline = inf
                if deadline <= _FLOAT_MAX:
                    return deadline
            elif delay >= _FLOAT_MIN:
                return self._monotonic()
        return self._plain_deadline(delay, at)

    @staticmethod
    def _check_handle(handle: object) -> None:
        if not isinstance(handle, Handle):
            raise TypeError(f"expected a Handle returned by put(), not {type(handle).__name__}")

    def cancel(self, handle: Handle[T]) -> bool:
        """Drop a pending item: True if it was pending, False if it already came out
        or was cancelled. A handle of another queue raises :class:`ValueError`."""
        if type(handle) is not Handle:
            self._check_handle(handle)
        lock = self._lock
        lock.acquire()
        try:
            # Only sleeping getters care whether this was the head they wait for.
            old_deadline = handle.deadline if self._waiters else inf
            if not self._store.cancel(handle):
                return False
            if self._waiters and (old_deadline <= self._wake_at or self._closed):
                self._notify_after_change()
            return True
        finally:
            lock.release()

    def reschedule(self, handle: Handle[T], delay: object = None, at: object = None) -> bool:
        """Move a pending item to a new due time (``delay=`` or ``at=``, neither: now).

        It goes behind items already due at that time. False if it is no longer pending.
        """
        if type(handle) is not Handle:
            self._check_handle(handle)
        deadline = self._deadline(delay, at)
        lock = self._lock
        lock.acquire()
        try:
            old_deadline = handle.deadline if self._waiters else inf
            if not self._store.reschedule(handle, deadline):
                return False
            if self._waiters and (old_deadline <= self._wake_at or deadline < self._wake_at):
                self._notify_after_change()
            return True
        finally:
            lock.release()

    def _notify_after_change(self) -> None:
        # The head moved or vanished: let one sleeper re-read it (others still sleep
        # until the old head, which is never later than needed).
        self._wake_at = inf
        if self._closed:
            self._notify_all()
        else:
            self._notify_one()

    # -- inspecting ----------------------------------------------------------------
    def peek(self) -> Handle[T] | None:
        """The handle of the item that comes out first, due or not; None if empty."""
        with self._lock:
            return self._store.peek()

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def clock(self) -> Clock:
        """The clock this queue measures delays on."""
        return self._clock

    def clear(self) -> list[T]:
        """Drop every pending item and return their values, earliest first."""
        with self._lock:
            dropped = self._store.clear()
            if self._waiters:
                self._wake_at = inf
                self._notify_all()
        return [handle[VALUE] for handle in dropped]

    def close(self) -> None:
        """Refuse further puts. Getters still receive pending items as they fall due;
        once none is pending, every get raises :class:`QueueClosed`."""
        with self._lock:
            self._closed = True
            if self._waiters:
                self._notify_all()

    def get_nowait(self) -> T:
        """Return a due item, or raise :class:`queue.Empty` (or :class:`QueueClosed`
        once the queue is closed and empty)."""
        lock = self._lock
        lock.acquire()
        try:
            handle = self._pop_due(self._monotonic())
            if handle is None:
                self._raise_if_drained()
                raise Empty
            return handle[VALUE]  # type: ignore[no-any-return]
        finally:
            lock.release()

    # -- shared by the getters (called with the lock held) ---------------------------
    def _raise_if_drained(self) -> None:
        if self._closed and not len(self._store):
            raise QueueClosed("the queue is closed and empty")

    def _leave_wait(self) -> None:
        """Bookkeeping when a getter stops waiting (lock held)."""
        self._waiters -= 1
        if not self._waiters:
            self._wake_at = -inf
        else:
            # Hand the watch on: the next sleeper re-reads the head (and _wake_at).
            self._wake_at = inf
            if len(self._store) or self._closed:
                self._notify_one()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {state} pending={len(self._store)}>"


class DelayQueue(QueueCore[T]):
    """A thread-safe delay queue: items come out once due, earliest deadline first,
    equal deadlines in put order.

    ``store`` is a :class:`~delayq.HeapStore` (the default) or a
    :class:`~delayq.WheelStore`; ``clock`` a :class:`~delayq.SystemClock` (default)
    or a :class:`~delayq.FakeClock` for tests.
    """

    def __init__(self, store: TimerStore[T] | None = None, *, clock: Clock | None = None) -> None:
        super().__init__(store, clock=clock)
        self._cond = threading.Condition(self._lock)

    def _notify_one(self) -> None:
        self._cond.notify()

    def _notify_all(self) -> None:
        self._cond.notify_all()

    def get(self, timeout: float | None = None) -> T:
        """Block until an item is due and return it.

        ``timeout`` (seconds on the queue's clock) raises :class:`queue.Empty` when it
        passes; a closed, empty queue raises :class:`QueueClosed`.
        """
        if timeout is not None:
            timeout = check_timeout(timeout)
        lock = self._lock
        lock.acquire()
        try:
            handle = self._pop_due(self._monotonic())
            if handle is None:
                handle = self._wait(timeout, 1)[0]
            return handle[VALUE]  # type: ignore[no-any-return]
        finally:
            lock.release()

    def get_many(self, max: int = DEFAULT_GET_MANY, timeout: float | None = None) -> list[T]:
        """Block until at least one item is due; return every due item, up to ``max``."""
        limit = check_max(max)
        wait = check_timeout(timeout)
        with self._lock:
            handles = self._store.pop_due_many(self._monotonic(), limit)
            if not handles:
                handles = self._wait(wait, limit)
        return [handle[VALUE] for handle in handles]

    def _wait(self, timeout: float | None, limit: int) -> list[Handle[T]]:
        """Sleep until something is due (lock held); return up to ``limit`` due items."""
        clock = self._clock
        now = self._monotonic()
        give_up = inf if timeout is None else now + timeout
        self._waiters += 1
        try:
            while True:
                handles = self._store.pop_due_many(now, limit)
                if handles:
                    return handles
                self._raise_if_drained()
                if now >= give_up:
                    raise Empty
                head = self._store.next_deadline()
                self._wake_at = inf if head is None else head
                until = min(self._wake_at, give_up)
                self._cond.wait(None if until == inf else clock.wait_timeout(until - now))
                now = self._monotonic()
        finally:
            self._leave_wait()

    def __iter__(self) -> Iterator[T]:
        """Yield items as they fall due; stop once the queue is closed and empty."""
        while True:
            try:
                yield self.get()
            except QueueClosed:
                return
