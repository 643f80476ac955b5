"""delayq: a delay queue for Python, exact to the millisecond.

In-process: :class:`DelayQueue` (threads), :class:`AsyncDelayQueue` (asyncio) over a
:class:`HeapStore` or a :class:`WheelStore`, and a :class:`Scheduler` that runs
callbacks at their time. Durable: :class:`Queue` / :class:`AsyncQueue` over a backend
chosen by URL (``memory://``, ``sqlite:///file.db``, ``redis://``), at-least-once with
leases. Running it: :class:`App` with ``@app.task`` and cron, and a :class:`Worker`.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._clock import Clock, FakeClock, SystemClock
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
        BackendNotInstalled,
        DelayqError,
        DuplicateId,
        LeaseLost,
        NoScheduler,
        OutcomeUnknown,
        PayloadTooLarge,
        QueueClosed,
        SchedulerNotRunning,
        ServerRefused,
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
    from .runtime import App, Discard, HandlerTimeout, Retry, Task, Worker, current_message

# Each public name and the module that defines it, imported on first use: a program
# that wants a DelayQueue does not import the worker, croniter or a backend.
_HOMES = {
    "Clock": "._clock",
    "FakeClock": "._clock",
    "SystemClock": "._clock",
    "App": ".runtime",
    "Task": ".runtime",
    "AsyncQueue": ".durable",
    "JSONSerializer": ".durable",
    "Message": ".durable",
    "PutResult": ".durable",
    "Queue": ".durable",
    "RetryPolicy": ".durable",
    "Serializer": ".durable",
    "State": ".durable",
    "Stats": ".durable",
    "BackendNotInstalled": ".errors",
    "DelayqError": ".errors",
    "DuplicateId": ".errors",
    "LeaseLost": ".errors",
    "NoScheduler": ".errors",
    "OutcomeUnknown": ".errors",
    "PayloadTooLarge": ".errors",
    "QueueClosed": ".errors",
    "SchedulerNotRunning": ".errors",
    "ServerRefused": ".errors",
    "UnsupportedURL": ".errors",
    "AsyncDelayQueue": ".inproc",
    "DelayQueue": ".inproc",
    "Handle": ".inproc",
    "HeapStore": ".inproc",
    "Scheduler": ".inproc",
    "Timer": ".inproc",
    "TimerStore": ".inproc",
    "WheelStore": ".inproc",
    "Discard": ".runtime",
    "HandlerTimeout": ".runtime",
    "Retry": ".runtime",
    "Worker": ".runtime",
    "current_message": ".runtime",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())


__version__ = "0.1.0"

__all__ = [
    "App",
    "AsyncDelayQueue",
    "AsyncQueue",
    "BackendNotInstalled",
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
    "NoScheduler",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PutResult",
    "Queue",
    "QueueClosed",
    "Retry",
    "RetryPolicy",
    "Scheduler",
    "SchedulerNotRunning",
    "Serializer",
    "ServerRefused",
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
