"""delayq: a delay queue for Python, exact to the millisecond.

In-process: :class:`DelayQueue` (threads), :class:`AsyncDelayQueue` (asyncio) over a
:class:`HeapStore` or a :class:`WheelStore`, and a :class:`Scheduler` that runs
callbacks at their time. Durable: :class:`Queue` / :class:`AsyncQueue` over a backend
chosen by URL (``memory://``, ``sqlite:///file.db``, ...), at-least-once with leases.
"""

from ._clock import Clock, FakeClock, SystemClock
from .durable import (
    AsyncQueue,
    JSONSerializer,
    Message,
    Queue,
    RetryPolicy,
    Serializer,
    State,
    Stats,
)
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
    "AsyncQueue",
    "Clock",
    "DelayQueue",
    "DelayqError",
    "DuplicateId",
    "FakeClock",
    "Handle",
    "HeapStore",
    "JSONSerializer",
    "LeaseLost",
    "Message",
    "PayloadTooLarge",
    "Queue",
    "QueueClosed",
    "RetryPolicy",
    "Scheduler",
    "Serializer",
    "State",
    "Stats",
    "SystemClock",
    "Timer",
    "TimerStore",
    "UnsupportedURL",
    "WheelStore",
    "__version__",
]
