"""Defaults of the in-process engine: the timing wheel, get_many, the Scheduler."""

from __future__ import annotations

#: Default tick of a :class:`~delayq.WheelStore`: a timer fires at most this late.
DEFAULT_WHEEL_TICK = 0.001

#: Slots per level of the timing wheel (a power of two: levels are bit fields of the tick).
WHEEL_BITS = 6

#: Wheel ticks beyond this go to an ordered overflow list (about 36 million years at 1 ms).
WHEEL_MAX_TICKS = 1 << 60

#: Default number of items ``get_many`` returns at most.
DEFAULT_GET_MANY = 100

#: Default thread-pool size of a :class:`~delayq.Scheduler`.
DEFAULT_SCHEDULER_WORKERS = 4
