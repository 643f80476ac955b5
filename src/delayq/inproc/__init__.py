"""The in-process engine: timer stores and the delay queues over them (no I/O)."""

from .async_queue import AsyncDelayQueue
from .heap import HeapStore
from .queue import DelayQueue
from .store import Handle, TimerStore
from .wheel import WheelStore

__all__ = ["AsyncDelayQueue", "DelayQueue", "Handle", "HeapStore", "TimerStore", "WheelStore"]
