"""Running tasks: an :class:`App` declares tasks and cron jobs, a :class:`Worker` runs
them (or a handler of one queue's messages) with leases kept alive, retries, and a
backend outage ridden out; a :class:`Supervisor` runs several worker processes.

Each name is imported from its module on first use, so the server's callback
dispatcher, which shares the consumer loop, does not import the worker or croniter.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._app import App, BadArguments, Task, TaskMessage
    from ._supervisor import Supervisor
    from ._worker import (
        Discard,
        Handler,
        HandlerTimeout,
        JobRun,
        Retry,
        Worker,
        current_message,
    )

_HOMES = {
    "App": "._app",
    "BadArguments": "._app",
    "Task": "._app",
    "TaskMessage": "._app",
    "Discard": "._worker",
    "Handler": "._worker",
    "HandlerTimeout": "._worker",
    "JobRun": "._worker",
    "Retry": "._worker",
    "Worker": "._worker",
    "Supervisor": "._supervisor",
    "current_message": "._worker",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())


__all__ = [
    "App",
    "BadArguments",
    "Discard",
    "Handler",
    "HandlerTimeout",
    "JobRun",
    "Retry",
    "Supervisor",
    "Task",
    "TaskMessage",
    "Worker",
    "current_message",
]
