"""The TimerStore contract and the Handle every store hands out.

A store keeps pending items ordered by ``(deadline, sequence)``; it does no I/O
and no locking (the queue that owns it does both) and takes ``now`` as an
argument, so it is tested with plain numbers.

A :class:`Handle` is a small ``list`` subclass, ``[deadline, seq, value, state]``:
being a list lets :mod:`heapq` compare handles in C (no Python ``__lt__``) and keeps
a pending heap timer under 150 bytes. ``seq`` is a float counter (exact up to
2**53, and 8 bytes smaller than an int). ``state`` is the owning store while the
item is pending, the store's :class:`Retired` marker once it came out or was
cancelled, or (HeapStore only) the heap entry that replaced it on reschedule.
Treat a handle as opaque: use its properties, never its items.

A handle holds no clock: :attr:`Handle.due_at` reaches the clock through its store,
which the queue that owns the store registered with :func:`bind_clock`.
"""

from __future__ import annotations

import weakref
from datetime import datetime, timezone
from typing import Any, Generic, Protocol, TypeVar

from .._clock import SYSTEM_CLOCK, Clock

__all__ = [
    "DEADLINE",
    "SEQ",
    "STATE",
    "VALUE",
    "Handle",
    "Retired",
    "TimerStore",
    "bind_clock",
    "clock_of",
    "describe_due",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

DEADLINE, SEQ, VALUE, STATE = 0, 1, 2, 3

_UTC = timezone.utc
_LATEST = datetime.max.replace(tzinfo=_UTC)
_EARLIEST = datetime.min.replace(tzinfo=_UTC)

# The clock of each store's queue. Read only to show a due time to people, never on the
# hot path: handles stay plain lists, and a store stays free of any clock.
_clocks: weakref.WeakKeyDictionary[object, Clock] = weakref.WeakKeyDictionary()


def bind_clock(store: object, clock: Clock) -> None:
    """Record that ``store`` holds deadlines on ``clock`` (its queue's monotonic time).

    Raises :class:`ValueError` if ``store`` already belongs to a queue.
    """
    if store in _clocks:
        raise ValueError("a store belongs to one queue: pass a new, empty store")
    _clocks[store] = clock


def clock_of(store: object) -> Clock | None:
    """The clock registered for ``store`` by its queue, or None for a store of no queue."""
    return _clocks.get(store)


def _format_span(seconds: float) -> str:
    """A non-negative span written as a delay string, to the millisecond:
    ``"250ms"``, ``"42s"``, ``"29m59.877s"``, ``"1d2h"``."""
    ms = round(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if ms:
        parts.append(f"{ms / 1000:g}s")
    return "".join(parts)


class Retired:
    """The state of a handle that is no longer pending; names the store it came from."""

    __slots__ = ("store",)

    def __init__(self, store: object) -> None:
        self.store = store

    def __repr__(self) -> str:
        return "<retired>"


class Handle(list[Any], Generic[T_co]):
    """An item put into a delay queue: its ``value``, ``deadline`` and ``pending`` flag.

    ``put`` returns it; ``cancel`` and ``reschedule`` take it; ``peek`` returns the
    very same object. Handles hash by identity; two handles of one store are never
    equal (their sequence numbers differ).
    """

    __slots__ = ()
    # list makes instances unhashable; identity hashing lets handles key dicts and sets.
    # (No __eq__ here: overriding any comparison would route heapq's ``<`` through Python.)
    __hash__ = object.__hash__  # type: ignore[assignment]

    @property
    def value(self) -> T_co:
        """The item that was put."""
        return self[VALUE]  # type: ignore[no-any-return]

    @property
    def deadline(self) -> float:
        """When the item is (or was) due, in the queue clock's monotonic seconds."""
        state = self[STATE]
        if type(state) is list:  # moved by a reschedule: the live entry holds the deadline
            return state[DEADLINE]  # type: ignore[no-any-return]
        return self[DEADLINE]  # type: ignore[no-any-return]

    @property
    def pending(self) -> bool:
        """True until the item comes out of the queue or is cancelled."""
        state = self[STATE]
        if type(state) is list:
            state = state[STATE]
        return type(state) is not Retired

    @property
    def due_at(self) -> datetime:
        """When the item is (or was) due, as an aware datetime in UTC.

        :attr:`deadline` carried over to wall-clock time with the queue's clock, as
        of now: after a wall-clock jump this moves with the wall clock, while the item
        still comes out at its monotonic deadline. Beyond what a datetime can hold,
        ``datetime.max`` (in UTC).
        """
        return _as_datetime(_wall_and_left(self)[0])

    def __repr__(self) -> str:
        status = "pending" if self.pending else "done"
        return f"<Handle {status} {describe_due(self)} value={self.value!r}>"


def _wall_and_left(handle: Handle[Any]) -> tuple[float, float]:
    """The due time in epoch seconds, and the seconds left until then (< 0: past)."""
    state = handle[STATE]
    if type(state) is list:
        state = state[STATE]
    if type(state) is Retired:
        state = state.store
    clock = _clocks.get(state, SYSTEM_CLOCK)
    left: float = handle.deadline - clock.monotonic()
    return clock.time() + left, left


def _as_datetime(epoch: float) -> datetime:
    try:
        return datetime.fromtimestamp(epoch, _UTC)
    except (OverflowError, ValueError, OSError):
        return _LATEST if epoch > 0 else _EARLIEST


def describe_due(handle: Handle[Any]) -> str:
    """``due=<UTC time> (in <span>) deadline=<monotonic>``: how reprs show a due time."""
    wall, left = _wall_and_left(handle)
    moment = _as_datetime(wall)
    if moment is _LATEST or moment is _EARLIEST:
        when = "beyond year 9999" if moment is _LATEST else "before year 1"
    else:
        when = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    span = f"in {_format_span(left)}" if left > 0 else f"{_format_span(-left)} ago"
    return f"due={when} ({span}) deadline={handle.deadline:.6f}"


class TimerStore(Protocol[T]):
    """Pending items ordered by deadline, then put order. Not thread-safe by itself.

    A store belongs to one queue; ``cancel`` and ``reschedule`` raise
    :class:`ValueError` for a handle of another store.
    """

    def push(self, value: T, deadline: float) -> Handle[T]:
        """Add ``value`` due at ``deadline``; return its handle."""
        ...

    def push_due(self, value: T, deadline: float) -> Handle[T]:
        """Add ``value`` that is due at once: ``deadline`` is the current time.

        The same as :meth:`push`, as a hint: such items arrive in deadline order.
        """
        ...

    def pop_due(self, now: float) -> Handle[T] | None:
        """Remove and return the earliest item due at ``now``, or None."""
        ...

    def pop_due_many(self, now: float, limit: int) -> list[Handle[T]]:
        """Remove and return up to ``limit`` due items, earliest first."""
        ...

    def cancel(self, handle: Handle[T]) -> bool:
        """Drop a pending item; False if it already came out or was cancelled."""
        ...

    def reschedule(self, handle: Handle[T], deadline: float) -> bool:
        """Move a pending item to ``deadline`` (behind items already due then)."""
        ...

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`pop_due` can return an item, or None if empty."""
        ...

    def peek(self) -> Handle[T] | None:
        """The pending item that comes out first, due or not."""
        ...

    def clear(self) -> list[Handle[T]]:
        """Drop every pending item; return their handles, earliest first."""
        ...

    def __len__(self) -> int:
        """How many items are pending."""
        ...
