"""HeapStore: a binary heap with lazy deletion, for any mix of deadlines.

Beside the heap run two *lanes*: deques whose deadlines never decrease. An entry
whose deadline is not before the lane's last one is appended there in O(1)
instead of sifted into the heap, and items due at once (``push_due``: their
deadline is the clock at put) go to a lane of their own, so far-future items never
block it. The earliest entry is the smallest of the three fronts. Timers of one
fixed delay (order timeouts, keep-alives, retries of one policy) and items due now
therefore never touch the heap, which stays small and hot in cache (the idea of
Node.js's per-duration timer lists, without the grouping).

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
from collections import deque
from heapq import heapify, heappop, heappush
from math import inf
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
    """Pending items in a binary heap, plus two FIFO lanes for items that arrive in
    deadline order: O(log n) put, pop and reschedule, O(1) cancel, and O(1) put and
    pop for items due at once or of one fixed delay."""

    __slots__ = (
        "__weakref__",
        "_dead",
        "_due",
        "_far",
        "_heap",
        "_lane",
        "_next_seq",
        "_retired",
    )

    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._lane: deque[_Entry] = deque()  # nondecreasing deadlines
        self._due: deque[_Entry] = deque()  # items due when put, in put order
        self._dead = 0  # entries in the heap and lanes that are no longer live
        # Never above the deadline at the front of _heap or _lane: a due item earlier
        # than this comes out without comparing against either front.
        self._far = inf
        self._next_seq = itertools.count(1.0).__next__
        self._retired = Retired(self)

    def _insert(self, entry: _Entry) -> None:
        deadline = entry[DEADLINE]
        self._far = min(self._far, deadline)
        lane = self._lane
        if not lane or lane[-1][DEADLINE] <= deadline:
            lane.append(entry)
        else:
            heappush(self._heap, entry)

    def _far_front(self) -> float:
        heap = self._heap
        lane = self._lane
        if heap:
            front = heap[0] if not lane or heap[0] < lane[0] else lane[0]
            return front[DEADLINE]  # type: ignore[no-any-return]
        return lane[0][DEADLINE] if lane else inf

    def push(self, value: T, deadline: float) -> Handle[T]:
        """Add ``value`` due at ``deadline``."""
        handle: Handle[T] = Handle((deadline, self._next_seq(), value, self))
        if deadline < self._far:  # noqa: PLR1730 (_insert inlined: this is the hot path)
            self._far = deadline
        lane = self._lane
        if not lane or lane[-1][DEADLINE] <= deadline:
            lane.append(handle)
        else:
            heappush(self._heap, handle)
        return handle

    def push_due(self, value: T, deadline: float) -> Handle[T]:
        """Add ``value`` that is due at once (``deadline`` is the current time)."""
        handle: Handle[T] = Handle((deadline, self._next_seq(), value, self))
        due = self._due
        if not due or due[-1][DEADLINE] <= deadline:
            due.append(handle)
        else:  # another thread read the clock later but pushed first
            self._insert(handle)
        return handle

    def pop_due(self, now: float) -> Handle[T] | None:
        """Remove and return the earliest item due at ``now``."""
        heap = self._heap
        lane = self._lane
        due = self._due
        while True:
            if due and due[0][DEADLINE] < self._far:  # the fast path: no other front is earlier
                top = due[0]
                if top[DEADLINE] > now:
                    return None
                due.popleft()
            else:
                # The smallest of the three fronts (each source is sorted).
                source: Any
                if due:
                    top = due[0]
                    source = due
                    if lane and lane[0] < top:
                        top = lane[0]
                        source = lane
                elif lane:
                    top = lane[0]
                    source = lane
                elif heap:
                    top = heap[0]
                    source = heap
                else:
                    return None
                if heap and heap[0] < top:
                    top = heap[0]
                    source = heap
                if top[DEADLINE] > now:
                    self._far = self._far_front()
                    return None
                if source is heap:
                    heappop(heap)
                else:
                    source.popleft()
                if source is not due:
                    self._far = self._far_front()
            if top[STATE] is self:
                top[STATE] = self._retired
                return top if type(top) is not list else top[_HANDLE]  # type: ignore[return-value]
            self._dead -= 1

    def pop_due_many(self, now: float, limit: int) -> list[Handle[T]]:
        """Remove and return up to ``limit`` due items, earliest first."""
        out: list[Handle[T]] = []
        pop_due = self.pop_due
        while len(out) < limit:
            handle = pop_due(now)
            if handle is None:
                break
            out.append(handle)
        return out

    def _live_entry(self, handle: Handle[T]) -> _Entry | None:
        """The entry that carries ``handle`` while pending; None once it is done."""
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
        """Drop a pending item (lazily: its entry is skipped when it reaches the front)."""
        entry = self._live_entry(handle)
        if entry is None:
            return False
        entry[STATE] = self._retired
        self._dead += 1
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
        self._insert(moved)
        self._dead += 1
        self._compact_if_sparse()
        return True

    def _compact_if_sparse(self) -> None:
        heap = self._heap
        if 2 * self._dead > len(heap) + len(self._lane) + len(self._due) + 16:
            # Rebuild in place; the lanes stay sorted when filtered.
            heap[:] = [entry for entry in heap if entry[STATE] is self]
            heapify(heap)
            for lane in (self._lane, self._due):
                live = [entry for entry in lane if entry[STATE] is self]
                lane.clear()
                lane.extend(live)
            self._dead = 0
            self._far = self._far_front()

    def _clean_top(self) -> _Entry | None:
        """The live entry that comes out first (dropping dead ones in front of it)."""
        heap = self._heap
        while heap and heap[0][STATE] is not self:
            heappop(heap)
            self._dead -= 1
        fronts = [heap[0]] if heap else []
        for lane in (self._lane, self._due):
            while lane and lane[0][STATE] is not self:
                lane.popleft()
                self._dead -= 1
            if lane:
                fronts.append(lane[0])
        return min(fronts) if fronts else None

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
        live = sorted(
            entry
            for entries in (self._heap, self._lane, self._due)
            for entry in entries
            if entry[STATE] is self
        )
        retired = self._retired
        dropped: list[Handle[T]] = []
        for entry in live:
            entry[STATE] = retired
            dropped.append(_handle_of(entry))
        self._heap.clear()
        self._lane.clear()
        self._due.clear()
        self._dead = 0
        self._far = inf
        return dropped

    def __len__(self) -> int:
        return len(self._heap) + len(self._lane) + len(self._due) - self._dead

    def __repr__(self) -> str:
        entries = len(self._heap) + len(self._lane) + len(self._due)
        return f"<HeapStore pending={len(self)} entries={entries}>"
