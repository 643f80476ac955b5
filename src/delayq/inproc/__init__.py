"""The in-process engine: timer stores and the delay queues over them (no I/O)."""

from .async_queue import AsyncDelayQueue
from .heap import HeapStore
from .queue import DelayQueue
from .scheduler import Scheduler, Timer
from .store import Handle, TimerStore
from .wheel import WheelStore

__all__ = [
    "AsyncDelayQueue",
    "DelayQueue",
    "Handle",
    "HeapStore",
    "Scheduler",
    "Timer",
    "TimerStore",
    "WheelStore",
]
