"""Harness: an App on ``memory://`` and a FakeClock, its Worker driven step by step."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import warnings
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from .._clock import FakeClock
from .._duration import delay_to_seconds
from ..durable.constants import MAX_PEEK_LIMIT
from ..durable.message import Message
from ..runtime import App, Discard, JobRun, Retry, Task, Worker

__all__ = ["Harness"]

T = TypeVar("T")

_namespaces = itertools.count(1)


class Harness:
    """Runs ``app`` on a ``memory://`` namespace of its own with ``clock`` (default: a
    new :class:`~delayq.FakeClock`) while started, and drives a real
    :class:`~delayq.Worker` of it (``worker_options``: its ``concurrency``, default 1
    so that runs happen one at a time in due order, ``timeout``, ``lease``...).
    With ``raise_errors``, a step (:meth:`run_due`, :meth:`advance`) whose task
    raised anything but :class:`~delayq.Retry` or :class:`~delayq.Discard` raises
    that exception once the step ended (the message retried or dead as usual): a test
    fails on the task's traceback, not on an assertion about its effect.

    ``with Harness(app) as harness:`` (``async with`` in a coroutine) points the app
    at the harness (:meth:`~delayq.App.configure`) and, at the end, back at its own
    backend; the messages of the test are gone with it. In between, the app's code
    sends, cancels and reschedules as it does in production, and the test moves time
    with :meth:`advance` and runs what is due with :meth:`run_due`. Nothing sleeps:
    a 30-minute timeout takes milliseconds.
    """

    def __init__(
        self,
        app: App,
        *,
        clock: FakeClock | None = None,
        concurrency: int = 1,
        raise_errors: bool = False,
        **worker_options: Any,
    ) -> None:
        if not isinstance(app, App):
            raise TypeError(f"a Harness runs a delayq App, not {type(app).__name__}")
        if clock is not None and not isinstance(clock, FakeClock):
            raise TypeError(f"clock must be a delayq.FakeClock, not {type(clock).__name__}")
        self.app = app
        self.clock = FakeClock() if clock is None else clock
        self.url = f"memory://delayq-testing-{os.getpid()}-{next(_namespaces)}"
        """The backend the app uses while the harness is started."""
        self.runs: list[JobRun] = []
        """Every run so far, in order: its message, task, arguments, ``outcome``
        (``"succeeded"``, ``"retried"``, ``"dead"``...), ``error`` and ``time``."""
        if type(raise_errors) is not bool:
            raise TypeError(f"raise_errors must be a bool, not {type(raise_errors).__name__}")
        self.raise_errors = raise_errors
        self._options = {"concurrency": concurrency, **worker_options}
        self._worker: Worker | None = None
        self._saved: tuple[str, dict[str, Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- starting and stopping ----------------------------------------------------------
    def start(self) -> Harness:
        """Point the app at the harness (its sync queues opened so far are closed)."""
        if self._saved is not None:
            raise RuntimeError("the harness is started already")
        worker = Worker(self.app, clock=self.clock, **self._options)  # checks the options
        saved = (self.app.url, dict(self.app.options))
        self.app.configure(self.url, clock=self.clock)
        self._saved, self._worker = saved, worker
        return self

    def close(self) -> None:
        """Purge the harness's messages, close the app's queues and point the app back
        at its own backend. Idempotent."""
        if self._saved is not None:
            self._sync(self.close_async())
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    async def close_async(self) -> None:
        """:meth:`close`, awaited (after ``async`` use)."""
        saved, self._saved = self._saved, None
        if saved is None:
            return
        try:
            for name in self.app.queue_names:
                self.app.queue(name).purge()
            await self.app.close_async()
        finally:
            self.app.configure(saved[0], **saved[1])

    async def aclose(self) -> None:
        """Deprecated: :meth:`close_async` (the asyncio twin of ``x`` is ``x_async``)."""
        warnings.warn(
            "Harness.aclose is deprecated: use Harness.close_async "
            "(the asyncio twin of x is x_async)",
            DeprecationWarning,
            stacklevel=2,
        )
        await self.close_async()

    def __enter__(self) -> Harness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Harness:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()

    @property
    def worker(self) -> Worker:
        """The worker the harness drives (its ``counts``: how runs ended)."""
        if self._worker is None or self._saved is None:
            raise RuntimeError("the harness is not started: use `with Harness(app)` or start()")
        return self._worker

    # -- running ------------------------------------------------------------------------
    def run_due(self) -> list[JobRun]:
        """Run every message due now, and those these runs make due now; return the
        runs. In a coroutine: ``await harness.run_due_async()``."""
        return self._sync(self.run_due_async())

    async def run_due_async(self) -> list[JobRun]:
        """:meth:`run_due`, awaited."""
        runs = await self.worker.burst()
        self.runs.extend(runs)
        if self.raise_errors:
            for run in runs:
                if run.error is not None and not isinstance(run.error, (Retry, Discard)):
                    raise run.error
        return runs

    def advance(self, delay: Any) -> list[JobRun]:
        """Move the clock ``delay`` ahead (seconds, a timedelta or ``"30m"``), running
        each message at its due time on the way (and what is due now first), as a
        worker would have; return the runs. A retry, a tick of ``@app.every`` or a task
        sent by a task falls due and runs within the same call when its time comes
        before the end. In a coroutine: ``await harness.advance_async(delay)``."""
        return self._sync(self.advance_async(delay))

    async def advance_async(self, delay: Any) -> list[JobRun]:
        """:meth:`advance`, awaited."""
        seconds = delay_to_seconds(delay)
        if not 0.0 <= seconds < math.inf:
            raise ValueError(f"delay must be seconds >= 0 and finite, got {delay!r}")
        end = self.clock.time() + seconds
        runs = await self.run_due_async()
        while (due := self._next_due_ms()) is not None and due <= end * 1000.0:
            self._move_to(_reaching(due))
            runs += await self.run_due_async()
        self._move_to(end)
        runs += await self.run_due_async()
        return runs

    def _move_to(self, when: float) -> None:
        """Advance the clock to epoch seconds ``when`` (exactly: the two are close
        enough for the difference, and the sum, to have no rounding)."""
        now = self.clock.time()
        if when > now:
            self.clock.advance(when - now)

    def _next_due_ms(self) -> int | None:
        """The earliest due time (epoch ms) of a waiting message of the app."""
        dues = [self.app.queue(name).stats().next_due_at for name in self._queues_of(None)]
        return min((due for due in dues if due is not None), default=None)

    def _queues_of(self, task: Task[..., Any] | str | None) -> list[str]:
        """The queues of ``task``, or of every task (the harness started)."""
        if self._saved is None:
            raise RuntimeError("the harness is not started: use `with Harness(app)` or start()")
        return self.app.queue_names if task is None else [self._task(task).queue]

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                "a sync Harness method called in a coroutine: await its _async twin "
                "(run_due_async, advance_async, close_async)"
            )
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    # -- looking ------------------------------------------------------------------------
    def runs_of(self, task: Task[..., Any] | str) -> list[JobRun]:
        """The runs of ``task`` (a task of the app or its name) so far, in order."""
        name = self._task(task).name
        return [run for run in self.runs if run.task == name]

    def scheduled(self, task: Task[..., Any] | str | None = None) -> list[Message]:
        """The waiting messages (ready or scheduled; of ``task`` only when given), in
        the order a worker takes them in each queue."""
        found = [
            msg
            for name in self._queues_of(task)
            for msg in self.app.queue(name).peek(limit=MAX_PEEK_LIMIT)
        ]
        return found if task is None else _of_task(found, self._task(task).name)

    def dead(self, task: Task[..., Any] | str | None = None) -> list[Message]:
        """The dead messages (of ``task`` only when given), oldest first; each one's
        ``last_error`` says why (the exception itself: its run in :attr:`runs`)."""
        found = [
            msg
            for name in self._queues_of(task)
            for msg in self.app.queue(name).dead(limit=MAX_PEEK_LIMIT)
        ]
        return found if task is None else _of_task(found, self._task(task).name)

    def due_in(self, message: Message) -> float:
        """Seconds of the clock from now until ``message`` is due (<= 0: due)."""
        if not isinstance(message, Message):
            raise TypeError(f"due_in takes a Message, not {type(message).__name__}")
        return (message.due_at - self.clock.time() * 1000.0) / 1000.0

    def assert_sent(self, task: Task[..., Any] | str, *args: Any, **kwargs: Any) -> Message:
        """The waiting message of ``task(*args, **kwargs)``, else the message of its
        latest run; ``AssertionError`` naming the calls of ``task`` found when there is
        neither."""
        name = self._task(task).name
        call = _normal([list(args), dict(kwargs)])
        waiting = self.scheduled(name)
        for msg in waiting:
            if _normal([msg.payload.get("args", []), msg.payload.get("kwargs", {})]) == call:
                return msg
        for run in reversed(self.runs_of(name)):
            if _normal([list(run.args), dict(run.kwargs)]) == call:
                return run.message
        seen = [f"{_call(name, m.payload['args'], m.payload['kwargs'])} (waiting)" for m in waiting]
        seen += [f"{_call(name, r.args, r.kwargs)} (ran)" for r in self.runs_of(name)]
        raise AssertionError(
            f"{_call(name, args, kwargs)} was not sent; {name} was sent as: "
            + ("; ".join(seen) or "nothing")
        )

    def _task(self, task: Task[..., Any] | str) -> Task[..., Any]:
        if isinstance(task, Task):
            if self.app.tasks.get(task.name) is not task:
                raise ValueError(f"{task!r} is not a task of {self.app!r}")
            return task
        if not isinstance(task, str):
            raise TypeError(f"a task or its name, not {type(task).__name__}")
        found = self.app.tasks.get(task)
        if found is None:
            known = ", ".join(sorted(self.app.tasks)) or "none"
            raise ValueError(f"the app has no task named {task!r} (known: {known})")
        return found

    def __repr__(self) -> str:
        state = "started" if self._saved is not None else "stopped"
        return f"<Harness {self.app!r} {state} runs={len(self.runs)}>"


def _reaching(ms: int) -> float:
    """The first epoch seconds at which a backend's now (floored ms) reaches ``ms``."""
    seconds = ms / 1000.0
    while math.floor(seconds * 1000.0) < ms:
        seconds = math.nextafter(seconds, math.inf)
    return seconds


def _of_task(messages: list[Message], name: str) -> list[Message]:
    return [m for m in messages if isinstance(m.payload, dict) and m.payload.get("task") == name]


def _normal(value: Any) -> Any:
    """``value`` as the JSON of a message gives it back (tuples as lists...)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


def _call(name: str, args: Any, kwargs: Mapping[str, Any]) -> str:
    parts = [repr(arg) for arg in args] + [f"{key}={value!r}" for key, value in kwargs.items()]
    return f"{name}({', '.join(parts)})"
