"""delayq: a delay queue for Python, exact to the millisecond.

In-process: :class:`DelayQueue` (threads), :class:`AsyncDelayQueue` (asyncio) over a
:class:`HeapStore` or a :class:`WheelStore`, and a :class:`Scheduler` that runs
callbacks at their time.
"""

from ._clock import Clock, FakeClock, SystemClock
from .errors import (
    DelayqError,
    DuplicateId,
    LeaseLost,
    PayloadTooLarge,
    QueueClosed,
    UnsupportedURL,
)
from .inproc import (
    AsyncDelayQueue,
    DelayQueue,
    Handle,
    HeapStore,
    Scheduler,
    Timer,
    TimerStore,
    WheelStore,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncDelayQueue",
    "Clock",
    "DelayQueue",
    "DelayqError",
    "DuplicateId",
    "FakeClock",
    "Handle",
    "HeapStore",
    "LeaseLost",
    "PayloadTooLarge",
    "QueueClosed",
    "Scheduler",
    "SystemClock",
    "Timer",
    "TimerStore",
    "UnsupportedURL",
    "WheelStore",
    "__version__",
]
