"""delayq: a delay queue for Python, exact to the millisecond.

In-process: :class:`DelayQueue` (threads), :class:`AsyncDelayQueue` (asyncio) over a
:class:`HeapStore` or a :class:`WheelStore`, and a :class:`Scheduler` that runs
callbacks at their time. Durable: :class:`Queue` / :class:`AsyncQueue` over a backend
chosen by URL (``memory://``, ``sqlite:///file.db``, ``redis://``), at-least-once with
leases. Running it: :class:`App` with ``@app.task`` and cron, and a :class:`Worker`.
"""

from ._clock import Clock, FakeClock, SystemClock
from .app import App, Task
from .durable import (
    AsyncQueue,
    JSONSerializer,
    Message,
    PutResult,
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
from .worker import Discard, HandlerTimeout, Retry, Worker, current_message

__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncDelayQueue",
    "AsyncQueue",
    "Clock",
    "DelayQueue",
    "DelayqError",
    "Discard",
    "DuplicateId",
    "FakeClock",
    "Handle",
    "HandlerTimeout",
    "HeapStore",
    "JSONSerializer",
    "LeaseLost",
    "Message",
    "PayloadTooLarge",
    "PutResult",
    "Queue",
    "QueueClosed",
    "Retry",
    "RetryPolicy",
    "Scheduler",
    "Serializer",
    "State",
    "Stats",
    "SystemClock",
    "Task",
    "Timer",
    "TimerStore",
    "UnsupportedURL",
    "WheelStore",
    "Worker",
    "__version__",
    "current_message",
]
