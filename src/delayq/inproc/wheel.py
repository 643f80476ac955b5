"""WheelStore: a hierarchical timing wheel with O(1) put, cancel and reschedule.

Time is cut into ticks (``tick`` seconds, 1 ms by default); an item due at ``d``
belongs to tick ``T = floor(d / tick)``. A *cursor* ``N`` says that every tick up
to ``N`` has been opened: its items sit in ``_ready``, a small heap ordered by
``(deadline, seq)``, from which ``pop_due`` returns an item only once its exact
deadline has passed. So the wheel is never early and, unlike classic wheels, not
even a tick late when the consumer polls.

Items of later ticks sit in slots of levels: level ``l`` is the ``l``-th group of
6 bits of ``T``. An item goes to the level of the highest bit where ``T`` and
``N`` differ, at slot ``(T >> 6l) & 63``, which is always ahead of the cursor's
own slot at that level. The next slot to open is therefore the first occupied
slot of the lowest non-empty level (a 64-bit occupancy mask per level finds it
without scanning), so a cursor jumps straight over idle time: no ticking. Opening
a slot moves its items down a level (or into ``_ready``); each item moves at most
once per level, and levels are added on demand, so any finite delay works.

A reschedule to a *later* time leaves the item where it is (its slot opens no
later than the new time asks) and only rewrites its deadline; the item is placed
again when its slot opens. This makes keep-alive resets almost free.
"""

from __future__ import annotations

import itertools
import math
from heapq import heapify, heappop, heappush
from math import inf
from typing import Any, Generic, TypeVar

from ._constants import DEFAULT_WHEEL_TICK, WHEEL_BITS, WHEEL_MAX_TICKS
from .store import DEADLINE, SEQ, STATE, Handle, Retired

__all__ = ["WheelStore"]

T = TypeVar("T")

_SLOTS = 1 << WHEEL_BITS
_MASK = _SLOTS - 1
_WHERE = 4  # a wheel handle's 5th item: its _Slot, or its entry in _ready
_OVERFLOW_LEVEL = -1
# [deadline, seq, handle]; a cancelled or moved entry drops its handle (None) at once,
# so the heap never keeps a cancelled item alive.
_ReadyEntry = list[Any]
_ENTRY_HANDLE = 2


class _Slot(dict[Handle[Any], None]):
    """The handles of one wheel slot (insertion-ordered), and where the slot is."""

    __slots__ = ("index", "level")

    def __init__(self, level: int, index: int) -> None:
        super().__init__()
        self.level = level
        self.index = index


class WheelStore(Generic[T]):
    """Pending items in a hierarchical timing wheel of ``tick`` seconds.

    O(1) put, cancel and reschedule whatever the number of timers, which suits many
    long timers that are reset or cancelled (keep-alives, timeouts, expiry).
    """

    __slots__ = (
        "__weakref__",
        "_bitmaps",
        "_count",
        "_cursor",
        "_levels",
        "_next_seq",
        "_overflow",
        "_ready",
        "_ready_live",
        "_retired",
        "_tick",
    )

    def __init__(self, tick: float = DEFAULT_WHEEL_TICK) -> None:
        if type(tick) is bool or not isinstance(tick, (int, float)):
            raise TypeError(f"tick must be seconds, not {type(tick).__name__}")
        if not 0.0 < tick < inf:
            raise ValueError(f"tick must be finite and > 0, got {tick!r}")
        self._tick = float(tick)
        self._cursor = 0  # every tick <= _cursor has been opened into _ready
        self._levels: list[list[_Slot | None]] = []
        self._bitmaps: list[int] = []
        self._ready: list[_ReadyEntry] = []
        self._ready_live = 0
        self._overflow = _Slot(_OVERFLOW_LEVEL, 0)
        self._count = 0
        self._next_seq = itertools.count(1.0).__next__
        self._retired = Retired(self)

    @property
    def tick(self) -> float:
        """The wheel's resolution in seconds."""
        return self._tick

    # -- placing ---------------------------------------------------------------------
    def _tick_of(self, deadline: float) -> int:
        ticks = deadline / self._tick
        if ticks >= WHEEL_MAX_TICKS:
            return WHEEL_MAX_TICKS
        return int(ticks) if ticks >= 0.0 else math.floor(ticks)

    def _place(self, handle: Handle[T]) -> None:
        deadline = handle[DEADLINE]
        tick = self._tick_of(deadline)
        cursor = self._cursor
        if tick <= cursor or cursor >= WHEEL_MAX_TICKS - 1:  # opened (the overflow too)
            entry = [deadline, handle[SEQ], handle]
            handle[_WHERE] = entry
            heappush(self._ready, entry)
            self._ready_live += 1
            return
        if tick >= WHEEL_MAX_TICKS:
            self._overflow[handle] = None
            handle[_WHERE] = self._overflow
            return
        level = ((tick ^ cursor).bit_length() - 1) // WHEEL_BITS
        index = (tick >> (level * WHEEL_BITS)) & _MASK
        levels = self._levels
        while level >= len(levels):
            levels.append([None] * _SLOTS)
            self._bitmaps.append(0)
        slot = levels[level][index]
        if slot is None:
            slot = levels[level][index] = _Slot(level, index)
            self._bitmaps[level] |= 1 << index
        slot[handle] = None
        handle[_WHERE] = slot

    def _start_of(self, tick: int) -> float:
        """The earliest time that falls in ``tick`` or later. (``tick * self._tick``
        may round a float ulp above a deadline of that tick, or below the tick.)"""
        start = tick * self._tick
        while self._tick_of(start) < tick:
            start = math.nextafter(start, inf)
        while self._tick_of(before := math.nextafter(start, -inf)) >= tick:
            start = before
        return start

    def _unplace(self, handle: Handle[T]) -> None:
        where = handle[_WHERE]
        handle[_WHERE] = None
        if type(where) is list:  # in _ready: its entry goes stale
            where[_ENTRY_HANDLE] = None
            self._ready_live -= 1
            if len(self._ready) > 2 * self._ready_live + 8:
                self._ready = [e for e in self._ready if e[_ENTRY_HANDLE] is not None]
                heapify(self._ready)
            return
        del where[handle]
        if not where and where.level != _OVERFLOW_LEVEL:
            self._levels[where.level][where.index] = None
            self._bitmaps[where.level] &= ~(1 << where.index)

    # -- the store contract ------------------------------------------------------------
    def push(self, value: T, deadline: float) -> Handle[T]:
        """Add ``value`` due at ``deadline``."""
        handle: Handle[T] = Handle((deadline, self._next_seq(), value, self, None))
        self._place(handle)
        self._count += 1
        return handle

    push_due = push  # due items go straight to the opened heap: nothing to gain apart

    def _next_event(self) -> tuple[int, int, int] | None:
        """(level, slot index, tick at which it opens) of the next slot to open."""
        for level, bitmap in enumerate(self._bitmaps):
            if bitmap:
                shift = level * WHEEL_BITS
                # Every occupied slot of a level is ahead of the cursor's own slot there.
                index = ((bitmap & -bitmap).bit_length()) - 1
                block = (self._cursor >> (shift + WHEEL_BITS)) << (shift + WHEEL_BITS)
                return level, index, block | (index << shift)
        return None

    def _advance(self, target: int) -> None:
        """Open every slot up to tick ``target``."""
        while True:
            event = self._next_event()
            if event is None or event[2] > target:
                break
            level, index, opens_at = event
            self._cursor = opens_at
            slot = self._levels[level][index]
            self._levels[level][index] = None
            self._bitmaps[level] &= ~(1 << index)
            for handle in slot:  # type: ignore[union-attr]
                self._place(handle)
        self._cursor = max(self._cursor, target)
        if self._overflow and target >= WHEEL_MAX_TICKS - 1:
            for handle in list(self._overflow):
                del self._overflow[handle]
                entry = [handle[DEADLINE], handle[SEQ], handle]
                handle[_WHERE] = entry
                heappush(self._ready, entry)
                self._ready_live += 1

    def pop_due(self, now: float) -> Handle[T] | None:
        """Remove and return the earliest item due at ``now`` (``now`` never decreases)."""
        target = self._tick_of(now)
        if target > self._cursor:
            self._advance(min(target, WHEEL_MAX_TICKS - 1))
        ready = self._ready
        while ready:
            entry = ready[0]
            if entry[0] > now:
                return None
            heappop(ready)
            handle: Handle[T] | None = entry[_ENTRY_HANDLE]
            if handle is not None:
                handle[_WHERE] = None
                handle[STATE] = self._retired
                self._ready_live -= 1
                self._count -= 1
                return handle
        return None

    def pop_due_many(self, now: float, limit: int) -> list[Handle[T]]:
        """Remove and return up to ``limit`` due items, earliest first."""
        out: list[Handle[T]] = []
        while len(out) < limit:
            handle = self.pop_due(now)
            if handle is None:
                break
            out.append(handle)
        return out

    def _check_pending(self, handle: Handle[T]) -> bool:
        state = handle[STATE]
        if state is self:
            return True
        if state is self._retired:
            return False
        raise ValueError("this handle belongs to another queue")

    def cancel(self, handle: Handle[T]) -> bool:
        """Drop a pending item at once (its memory is released now)."""
        if not self._check_pending(handle):
            return False
        self._unplace(handle)
        handle[STATE] = self._retired
        self._count -= 1
        return True

    def reschedule(self, handle: Handle[T], deadline: float) -> bool:
        """Move a pending item to ``deadline``; it goes behind items already due then."""
        if handle[STATE] is not self:
            return self._check_pending(handle)  # False, or ValueError for a foreign handle
        where = handle[_WHERE]
        later = deadline >= handle[DEADLINE]
        handle[DEADLINE] = deadline
        handle[SEQ] = self._next_seq()
        if later and type(where) is _Slot and where.level != _OVERFLOW_LEVEL:
            return True  # its slot opens no later than the new deadline asks: re-placed then
        self._unplace(handle)
        self._place(handle)
        return True

    def _clean_ready(self) -> _ReadyEntry | None:
        ready = self._ready
        while ready:
            entry = ready[0]
            if entry[_ENTRY_HANDLE] is not None:
                return entry
            heappop(ready)
        return None

    def next_deadline(self) -> float | None:
        """When ``pop_due`` may next return an item: the exact deadline of the first
        opened item, else the time the next slot opens."""
        entry = self._clean_ready()
        if entry is not None:
            return float(entry[0])
        event = self._next_event()
        if event is not None:
            return self._start_of(event[2])
        if self._overflow:
            return min(float(handle[DEADLINE]) for handle in self._overflow)
        return None

    def peek(self) -> Handle[T] | None:
        """The pending item that comes out first (scans the first occupied slots)."""
        entry = self._clean_ready()
        if entry is not None:
            return entry[_ENTRY_HANDLE]  # type: ignore[no-any-return]
        best: Handle[T] | None = None
        for level, slots in enumerate(self._levels):
            shift = level * WHEEL_BITS
            block = (self._cursor >> (shift + WHEEL_BITS)) << (shift + WHEEL_BITS)
            for index, slot in enumerate(slots):
                if slot is None:
                    continue
                if best is not None and (block | (index << shift)) > self._tick_of(best[0]):
                    return best  # every later slot holds later ticks only
                candidate = min(slot)
                if best is None or candidate < best:
                    best = candidate
        if self._overflow:  # a slot may hold an item rescheduled into the overflow range
            candidate = min(self._overflow)
            if best is None or candidate < best:
                best = candidate
        return best

    def clear(self) -> list[Handle[T]]:
        """Drop every pending item; return their handles, earliest first."""
        live: list[Handle[T]] = [
            entry[_ENTRY_HANDLE] for entry in self._ready if entry[_ENTRY_HANDLE] is not None
        ]
        for slots in self._levels:
            for slot in slots:
                if slot:
                    live.extend(slot)
        live.extend(self._overflow)
        live.sort()
        for handle in live:
            handle[STATE] = self._retired
            handle[_WHERE] = None
        self._levels.clear()
        self._bitmaps.clear()
        self._ready.clear()
        self._overflow.clear()
        self._ready_live = 0
        self._count = 0
        return live

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"<WheelStore tick={self._tick} pending={self._count} levels={len(self._levels)}>"
