"""HeapStore: a binary heap with lazy deletion, for any mix of deadlines.

Cancel marks a handle retired and leaves it in the heap; reschedule leaves the old
entry behind and pushes a *moved entry* ``[deadline, seq, handle, state]`` (a plain
list) that the handle points to. Dead entries are skipped when they reach the top,
and the heap is rebuilt once they outnumber the live ones, so memory stays within
twice the live entries and every operation is O(log n) amortized.

An entry ``e`` is live exactly when ``e[STATE] is store``: a handle whose state is
the store sits in the heap itself; a moved entry is live until the handle moves
again (the old entry is retired) or the item comes out or is cancelled.
"""

from __future__ import annotations

import itertools
from heapq import heapify, heappop, heappush
from typing import Any, Generic, TypeVar, cast

from .store import DEADLINE, STATE, Handle, Retired

__all__ = ["HeapStore"]

T = TypeVar("T")
_Entry = list[Any]  # a Handle, or a moved entry [deadline, seq, handle, state]
_HANDLE = 2  # where a moved entry keeps its handle


def _handle_of(entry: _Entry) -> Handle[Any]:
    """The user's handle for a heap entry (itself, or the one a moved entry carries)."""
    return cast(Handle[Any], entry if type(entry) is not list else entry[_HANDLE])


class HeapStore(Generic[T]):
    """Pending items in a binary heap: O(log n) put, pop and reschedule, O(1) cancel."""

    __slots__ = ("__weakref__", "_heap", "_live", "_next_seq", "_retired")

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._live = 0
        self._next_seq = itertools.count(1.0).__next__
        self._retired = Retired(self)

    def push(self, value: T, deadline: float) -> Handle[T]:
        """Add ``value`` due at ``deadline``."""
        handle: Handle[T] = Handle((deadline, self._next_seq(), value, self))
        heappush(self._heap, handle)
        self._live += 1
        return handle

    def pop_due(self, now: float) -> Handle[T] | None:
        """Remove and return the earliest item due at ``now``."""
        heap = self._heap
        while heap:
            top = heap[0]
            if top[DEADLINE] > now:
                return None
            heappop(heap)
            if top[STATE] is self:
                top[STATE] = self._retired
                self._live -= 1
                return top if type(top) is not list else top[_HANDLE]  # type: ignore[return-value]
        return None

    def pop_due_many(self, now: float, limit: int) -> list[Handle[T]]:
        """Remove and return up to ``limit`` due items, earliest first."""
        out: list[Handle[T]] = []
        heap = self._heap
        retired = self._retired
        while heap and len(out) < limit:
            top = heap[0]
            if top[DEADLINE] > now:
                break
            heappop(heap)
            if top[STATE] is self:
                top[STATE] = retired
                out.append(_handle_of(top))
        self._live -= len(out)
        return out

    def _live_entry(self, handle: Handle[T]) -> _Entry | None:
        """The heap entry that carries ``handle`` while pending; None once it is done."""
        state = handle[STATE]
        if state is self:
            return handle
        if type(state) is list:
            if state[STATE] is self:
                return state
            state = state[STATE]
        if state is self._retired:
            return None
        raise ValueError("this handle belongs to another queue")

    def cancel(self, handle: Handle[T]) -> bool:
        """Drop a pending item (lazily: its entry is skipped when it reaches the top)."""
        entry = self._live_entry(handle)
        if entry is None:
            return False
        entry[STATE] = self._retired
        self._live -= 1
        self._compact_if_sparse()
        return True

    def reschedule(self, handle: Handle[T], deadline: float) -> bool:
        """Move a pending item to ``deadline``; it goes behind items already due then."""
        entry = self._live_entry(handle)
        if entry is None:
            return False
        moved: _Entry = [deadline, self._next_seq(), handle, self]
        if entry is not handle:
            entry[STATE] = self._retired
        handle[STATE] = moved
        heappush(self._heap, moved)
        self._compact_if_sparse()
        return True

    def _compact_if_sparse(self) -> None:
        heap = self._heap
        if len(heap) > 2 * self._live + 8:
            # Rebuild in place: callers may hold a reference to the list.
            heap[:] = [entry for entry in heap if entry[STATE] is self]
            heapify(heap)

    def _clean_top(self) -> _Entry | None:
        heap = self._heap
        while heap:
            top = heap[0]
            if top[STATE] is self:
                return top
            heappop(heap)
        return None

    def next_deadline(self) -> float | None:
        """The earliest deadline pending, or None."""
        top = self._clean_top()
        return None if top is None else float(top[DEADLINE])

    def peek(self) -> Handle[T] | None:
        """The handle that comes out first."""
        top = self._clean_top()
        return None if top is None else _handle_of(top)

    def clear(self) -> list[Handle[T]]:
        """Drop every pending item; return their handles, earliest first."""
        live = sorted(entry for entry in self._heap if entry[STATE] is self)
        retired = self._retired
        dropped: list[Handle[T]] = []
        for entry in live:
            entry[STATE] = retired
            dropped.append(_handle_of(entry))
        self._heap.clear()
        self._live = 0
        return dropped

    def __len__(self) -> int:
        return self._live

    def __repr__(self) -> str:
        return f"<HeapStore pending={self._live} entries={len(self._heap)}>"
