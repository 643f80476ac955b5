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
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

__all__ = ["DEADLINE", "SEQ", "STATE", "VALUE", "Handle", "Retired", "TimerStore"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

DEADLINE, SEQ, VALUE, STATE = 0, 1, 2, 3


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

    def __repr__(self) -> str:
        status = "pending" if self.pending else "done"
        return f"<Handle {status} deadline={self.deadline:.6f} value={self.value!r}>"


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
