"""What the worker needs besides its main loop: a thread pool of daemon threads,
concurrency slots, structured logging, and a heap set aside once set up.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any, ParamSpec, TypeVar

from ._constants import LOGGER_NAME

__all__ = ["DaemonPool", "Slots", "freeze_startup_heap", "log_event", "log_raised", "log_value"]

P = ParamSpec("P")
T = TypeVar("T")

logger = logging.getLogger(LOGGER_NAME)


def log_value(value: object) -> str:
    """``value`` as one field of a log line: as it is when it is plain printable text
    without spaces, quotes or ``=``; else in double quotes with backslash escapes
    (``\\n``, ``\\"``, ``\\x1b``...), so no value can end the line or forge a field."""
    text = str(value)
    if text and text.isprintable() and not any(ch in text for ch in ' "=\\'):
        return text
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


def _log(level: int, event: str, fields: dict[str, object], exc: BaseException | None) -> None:
    if logger.isEnabledFor(level):
        text = " ".join(
            f"{key}={log_value(value)}" for key, value in fields.items() if value is not None
        )
        extra = {"delayq": {"event": event, **fields}}
        logger.log(level, "%s %s", event, text, exc_info=exc, extra=extra)


def log_event(level: int, event: str, **fields: object) -> None:
    """Log ``event`` on the ``delayq`` logger as ``event key=value ...`` (values
    escaped by :func:`log_value`); the fields also go to the record as
    ``record.delayq`` (a dict, unescaped) for structured handlers."""
    _log(level, event, fields, None)


def log_raised(level: int, event: str, exc: BaseException, **fields: object) -> None:
    """:func:`log_event`, followed by the traceback of ``exc`` (its whole chain)."""
    _log(level, event, fields, exc)


def freeze_startup_heap() -> None:
    """Collect, then move every object alive now out of the collector's sight
    (:func:`gc.freeze`), once a long-running process is set up.

    CPython's full collections scan every tracked object. The imports alone leave
    many: redis-py about 26,000, the server's FastAPI and uvicorn about 78,000. A full
    collection then stops the process for tens of milliseconds, often enough to make
    messages and callbacks that fall due during it late by as much. Frozen, those
    objects are never scanned again; what the process makes later is collected as
    before. Only the CLI's long-running commands call this: they own their process.
    """
    gc.collect()
    gc.freeze()


class DaemonPool(Executor):
    """Threads for sync handlers: one per handler running at once, reused when idle.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not keep a stopping process
    alive: a sync handler still running after the grace period cannot be killed, and
    its message has been released already.
    """

    def __init__(self, name: str = "delayq-worker") -> None:
        self._name = name
        self._jobs: SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self._closed = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on an idle thread (or a new one)."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{self._threads}", daemon=True
                )
                thread.start()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, call = job
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del job, future, call
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let idle threads end; running ones end when their handler returns."""
        with self._lock:
            self._closed = True
            count = self._threads
        for _ in range(count):
            self._jobs.put(None)


class Slots:
    """How many more handlers may start (asyncio, one loop)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._changed = asyncio.Event()

    async def take_all(self) -> int:
        """Wait for at least one free slot, then take every free slot."""
        while self.free == 0:
            self._changed.clear()
            await self._changed.wait()
        taken, self.free = self.free, 0
        return taken

    def give(self, count: int = 1) -> None:
        """Return ``count`` slots."""
        if count:
            self.free += count
            self._changed.set()
