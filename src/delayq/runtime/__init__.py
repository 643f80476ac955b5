"""Running tasks: an :class:`App` declares tasks and cron jobs, a :class:`Worker` runs
them (or a handler of one queue's messages) with leases kept alive, retries, and a
backend outage ridden out.
"""

from ._app import App, Task, TaskMessage
from ._worker import Discard, Handler, HandlerTimeout, Retry, Worker, current_message

__all__ = [
    "App",
    "Discard",
    "Handler",
    "HandlerTimeout",
    "Retry",
    "Task",
    "TaskMessage",
    "Worker",
    "current_message",
]
