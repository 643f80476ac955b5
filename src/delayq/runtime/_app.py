"""App and tasks: declare what runs, send it with a delay, run it with a Worker.

::

    app = App("sqlite:///shop.db")

    @app.task(max_attempts=3, backoff=RetryPolicy(base=2.0))
    def cancel_order(order_id: int) -> None: ...

    cancel_order.send(42, delay="30m", id="cancel:42")   # -> the message id
    cancel_order.cancel("cancel:42")                      # paid in time

    @app.cron("0 1 * * *", tz="Europe/Berlin")
    def nightly() -> None: ...

A message is the JSON envelope ``{"task": name, "args": [...], "kwargs": {...}}`` in
the task's queue. ``send``/``cancel``/``reschedule``/``get`` block (they suit scripts,
web handlers in threads and sync tasks); ``send_async``/``cancel_async``/
``reschedule_async``/``get_async`` are their awaitable twins for coroutines, which must
not block their event loop on a database write.

One naming rule holds on every public class with both faces (:class:`App`,
:class:`Task`, :class:`delayq.testing.Harness`): the asyncio twin of ``x`` is
``x_async``, with the same parameters (``App.queue``/``App.queue_async``,
``App.close``/``App.close_async``). The older names (``aclose``, ``async_queue``,
``open_async_queue``) still work and warn (``DeprecationWarning``).
Cron schedules: see :mod:`delayq.runtime._cron`.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, overload

from .._names import check_queue_name
from ..durable.build import builder
from ..durable.constants import DEFAULT_QUEUE_NAME
from ..durable.facade import check_identifier
from ..durable.message import Message, OnConflict
from ..durable.queue import AsyncQueue, Queue
from ..durable.registry import default_url, redact_url
from ..durable.retry import RetryPolicy
from ..durable.serializer import DictTemplate, Filled
from ._cron import CronSchedule, EverySchedule, Schedule, tick_id
from .constants import CRON_TICK_HEADER

__all__ = [
    "App",
    "BadArguments",
    "CronJob",
    "Task",
    "TaskMessage",
    "UnknownTask",
    "decode_envelope",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

#: Keywords of ``send`` that are options of the message, not arguments of the task.
SEND_OPTIONS = frozenset(("delay", "at", "id", "on_conflict", "headers"))


class UnknownTask(LookupError):
    """A message names a task this app does not have, or is not a task envelope."""


class BadArguments(TypeError):
    """The arguments of a task call do not fit its function's signature: the send is
    refused, and a worker sends such a message (put by an older version, or before the
    task changed) to dead at once."""


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """One call of a task to send, built by :meth:`Task.message`, for
    :meth:`App.send_many`."""

    task: Task[..., Any]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    delay: Any = None
    at: Any = None
    id: str | None = None
    on_conflict: OnConflict = "ignore"
    headers: Mapping[str, str] | None = None

    def put_item(self) -> dict[str, Any]:
        """The ``put``/``put_many`` arguments of this message: those left at their
        default (no delay, at or id; ``on_conflict="ignore"``; no headers) are left
        out, which ``put`` reads the same and ``send_many`` spends less on."""
        item: dict[str, Any] = {
            "payload": {
                "task": self.task.name,
                "args": list(self.args),
                "kwargs": dict(self.kwargs),
            },
            "max_attempts": self.task.max_attempts,
        }
        if self.delay is not None:
            item["delay"] = self.delay
        if self.at is not None:
            item["at"] = self.at
        if self.id is not None:
            item["id"] = self.id
        if self.on_conflict != "ignore":
            item["on_conflict"] = self.on_conflict
        if self.headers:
            item["headers"] = self.headers
        return item


#: ``TaskMessage(...)`` without the frozen ``__init__`` (:mod:`delayq.durable.build`): a
#: send_many builds one per call, and the ``__init__`` was a fifth of its client work.
new_task_message: Callable[..., TaskMessage] = builder(TaskMessage)


class Task(Generic[P, R]):
    """A function registered with :meth:`App.task`; calling it still calls the
    function, :meth:`send` runs it later on a worker."""

    def __init__(
        self,
        app: App,
        fn: Callable[P, R],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        backoff: RetryPolicy,
        timeout: float | None,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.timeout = timeout
        self.is_async = inspect.iscoroutinefunction(fn)
        self._signature = _signature(fn)
        self._positional = _positional_range(self._signature)
        functools.update_wrapper(self, fn)
        #: The task's envelope, its fixed part (the name) written once: a send's and a
        #: send_many's payload is it filled in (the codec stores the same dict).
        self.envelope = DictTemplate({"task": name}, ("args", "kwargs"))

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the function now, in this process."""
        return self.fn(*args, **kwargs)

    def check_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Raise :class:`BadArguments` unless ``fn(*args, **kwargs)`` binds to the
        function's signature (a function without one takes anything)."""
        if self._signature is None:
            return
        # A worker checks every message: the common call (positional arguments only)
        # is a comparison, a tenth of Signature.bind's cost.
        if not kwargs and self._positional is not None:
            low, high = self._positional
            if low <= len(args) <= high:
                return
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise BadArguments(f"task {self.name!r}: {exc}") from None

    def message(
        self,
        *args: Any,
        delay: Any = None,
        at: Any = None,
        id: str | None = None,
        on_conflict: OnConflict = "ignore",
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> TaskMessage:
        """A call of this task to send later (see :meth:`App.send_many`). The
        arguments are checked against the function's signature now."""
        bounds = self._positional  # check_arguments' common case, without its call
        if kwargs or bounds is None or not bounds[0] <= len(args) <= bounds[1]:
            self.check_arguments(args, kwargs)
        return new_task_message(self, args, kwargs, delay, at, id, on_conflict, headers)

    def send(
        self,
        *args: Any,
        delay: Any = None,
        at: Any = None,
        id: str | None = None,
        on_conflict: OnConflict = "ignore",
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Run ``fn(*args, **kwargs)`` on a worker after ``delay`` or at ``at``
        (neither: now); return the message id. ``id``/``on_conflict`` as in
        :meth:`~delayq.Queue.put`: sending the same id twice runs the task once."""
        payload = self._payload(args, kwargs)  # refused before the queue is opened
        put = self.app.queue(self.queue).put
        return self._put(put, payload, delay, at, id, on_conflict, headers)

    async def send_async(
        self,
        *args: Any,
        delay: Any = None,
        at: Any = None,
        id: str | None = None,
        on_conflict: OnConflict = "ignore",
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """:meth:`send`, awaited (for coroutines)."""
        payload = self._payload(args, kwargs)
        put = self.app.queue_async(self.queue).put
        return await self._put(put, payload, delay, at, id, on_conflict, headers)

    def _payload(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Filled:
        """The envelope of the call ``fn(*args, **kwargs)``, checked against the
        function's signature: put_item()'s payload (the codec stores the same dict)."""
        bounds = self._positional  # check_arguments' common case, without its call
        if kwargs or bounds is None or not bounds[0] <= len(args) <= bounds[1]:
            self.check_arguments(args, kwargs)
        return Filled((self.envelope, args, kwargs))

    def _put(  # noqa: PLR0917 (send's options, passed on)
        self,
        put: Callable[..., T],
        payload: Filled,
        delay: Any,
        at: Any,
        id: str | None,
        on_conflict: OnConflict,
        headers: Mapping[str, str] | None,
    ) -> T:
        """``put(payload, ...)`` (a queue's) with send's options: what
        ``put(**message(...).put_item())`` does."""
        return put(
            payload,
            delay=delay,
            at=at,
            id=id,
            on_conflict=on_conflict,
            max_attempts=self.max_attempts,
            headers=headers or None,
        )

    def cancel(self, id: str) -> bool:
        """Remove the message ``id`` unless it is running: True if it was removed."""
        return self.app.queue(self.queue).cancel(id)

    async def cancel_async(self, id: str) -> bool:
        """:meth:`cancel`, awaited."""
        return await self.app.queue_async(self.queue).cancel(id)

    def reschedule(self, id: str, *, delay: Any = None, at: Any = None) -> bool:
        """Move the message ``id`` to a new time, ``delay`` or ``at`` (one of them):
        True if it was waiting."""
        return self.app.queue(self.queue).reschedule(id, delay=delay, at=at)

    async def reschedule_async(self, id: str, *, delay: Any = None, at: Any = None) -> bool:
        """:meth:`reschedule`, awaited."""
        return await self.app.queue_async(self.queue).reschedule(id, delay=delay, at=at)

    def get(self, id: str) -> Message | None:
        """The message ``id`` (state, due time, attempts, last error), or None."""
        return self.app.queue(self.queue).get(id)

    async def get_async(self, id: str) -> Message | None:
        """:meth:`get`, awaited."""
        return await self.app.queue_async(self.queue).get(id)

    def __repr__(self) -> str:
        return f"<Task {self.name!r} queue={self.queue!r}>"


@dataclass(frozen=True, slots=True)
class CronJob:
    """A task run on a schedule (:meth:`App.cron`, :meth:`App.every`)."""

    task: Task[[], Any]
    schedule: Schedule
    catch_up: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)

    def tick_item(self, tick_ms: int) -> dict[str, Any]:
        """The ``put`` arguments of tick ``tick_ms``."""
        return {
            "payload": {"task": self.task.name, "args": [], "kwargs": {}},
            "at": tick_ms / 1000.0,
            "id": tick_id(self.task.name, tick_ms),
            "on_conflict": "ignore",
            "max_attempts": self.task.max_attempts,
            "headers": {CRON_TICK_HEADER: str(tick_ms)},
        }


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _positional_range(signature: inspect.Signature | None) -> tuple[int, float] | None:
    """How many positional arguments, without keywords, bind to ``signature``: the
    least and the most; None when a keyword-only parameter must be given."""
    if signature is None:
        return None
    low, high = 0, 0.0
    for parameter in signature.parameters.values():
        kind, required = parameter.kind, parameter.default is inspect.Parameter.empty
        if kind is inspect.Parameter.VAR_POSITIONAL:
            high = float("inf")
        elif kind is inspect.Parameter.KEYWORD_ONLY:
            if required:
                return None
        elif kind is not inspect.Parameter.VAR_KEYWORD:
            low += required
            high += 1
    return low, high


def decode_envelope(payload: object) -> tuple[str, list[Any], dict[str, Any]]:
    """``(task name, args, kwargs)`` of a task message; :class:`UnknownTask` when
    ``payload`` is not an envelope."""
    if isinstance(payload, dict):
        name, args, kwargs = payload.get("task"), payload.get("args", []), payload.get("kwargs", {})
        if isinstance(name, str) and isinstance(args, list) and isinstance(kwargs, dict):
            return name, args, kwargs
    raise UnknownTask(
        f"not a task message: expected {{'task': name, 'args': [...], 'kwargs': {{...}}}}, "
        f"got {payload!r:.200}"
    )


class App:
    """Tasks and schedules over one backend URL (default: ``$DELAYQ_URL``, else
    ``sqlite:///delayq.db``).

    ``retry`` is the default policy of tasks without ``backoff=``; further keyword
    arguments go to every queue (``memory://`` takes ``clock=``). The app opens one
    :class:`~delayq.Queue` and one :class:`~delayq.AsyncQueue` per queue name, on
    first use (:meth:`queue` / :meth:`queue_async`); :meth:`close` /
    :meth:`close_async` close them.
    """

    def __init__(
        self, url: str | None = None, *, retry: RetryPolicy | None = None, **options: Any
    ) -> None:
        self.url = default_url() if url is None else url
        self.retry = RetryPolicy() if retry is None else retry
        self.options = options
        self.tasks: dict[str, Task[..., Any]] = {}
        self.crons: dict[str, CronJob] = {}
        self._queues: dict[str, Queue] = {}
        self._async_queues: dict[str, AsyncQueue] = {}
        self._lock = threading.Lock()

    def configure(self, url: str | None = None, **options: Any) -> None:
        """Point the app at another backend: ``url`` (None: ``$DELAYQ_URL``, else
        ``sqlite:///delayq.db``) and the queues' ``options`` replace the app's; the
        next queue opened uses them. The sync queues it opened are closed; while an
        asyncio one is open, a ``RuntimeError`` (``await app.close_async()`` first).

        For an app declared at import time whose backend is known later (settings, a
        test: :class:`delayq.testing.Harness` runs it on ``memory://`` this way).
        """
        if url is not None and not isinstance(url, str):
            raise TypeError(f"url must be a str or None, not {type(url).__name__}")
        with self._lock:
            if self._async_queues:
                raise RuntimeError(
                    "the app has asyncio queues open: await app.close_async() before configure()"
                )
            queues, self._queues = list(self._queues.values()), {}
            self.url = default_url() if url is None else url
            self.options = options
        for queue in queues:
            queue.close()

    @property
    def queue_names(self) -> list[str]:
        """The queues of every task, sorted."""
        return sorted({task.queue for task in self.tasks.values()})

    # -- declaring --------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE_NAME,
        max_attempts: int | None = None,
        backoff: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(  # type: ignore[misc]  # mypy cannot match a ParamSpec-generic decorator
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE_NAME,
        max_attempts: int | None = None,
        backoff: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Register a task (``@app.task`` or ``@app.task(...)``).

        ``name`` defaults to the function's name and must be unique in the app;
        ``max_attempts`` defaults to ``backoff``'s, else the app's retry policy's;
        ``backoff`` sets the delays between attempts; ``timeout`` (seconds) makes a
        longer run a failure. Sync functions run on a worker's threads, async ones on
        its event loop.
        """

        def register(function: Callable[..., Any]) -> Task[..., Any]:
            return self._register(
                function,
                name=name,
                queue=queue,
                max_attempts=max_attempts,
                backoff=backoff,
                timeout=timeout,
            )

        return register if fn is None else register(fn)

    def cron(
        self,
        expression: str,
        *,
        tz: str = "UTC",
        name: str | None = None,
        queue: str = DEFAULT_QUEUE_NAME,
        catch_up: bool = True,
        max_attempts: int | None = None,
        backoff: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Callable[[Callable[[], R]], Task[[], R]]:
        """Run the decorated function (no arguments) at each tick of the cron
        ``expression`` in time zone ``tz``, once per tick across every worker.

        A worker started after missed ticks runs one catch-up run (``catch_up=False``:
        none). The function is also a task: ``nightly.send()`` runs it once more.
        """
        schedule = CronSchedule(expression, tz)
        return self._scheduled(
            schedule,
            name=name,
            queue=queue,
            catch_up=catch_up,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
        )

    def every(
        self,
        interval: Any,
        *,
        name: str | None = None,
        queue: str = DEFAULT_QUEUE_NAME,
        catch_up: bool = True,
        max_attempts: int | None = None,
        backoff: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Callable[[Callable[[], R]], Task[[], R]]:
        """Run the decorated function every ``interval`` (``"5m"``, seconds, a
        timedelta), at multiples of it since the Unix epoch; otherwise as :meth:`cron`."""
        schedule = EverySchedule(interval)
        return self._scheduled(
            schedule,
            name=name,
            queue=queue,
            catch_up=catch_up,
            max_attempts=max_attempts,
            backoff=backoff,
            timeout=timeout,
        )

    def _scheduled(
        self,
        schedule: Schedule,
        *,
        name: str | None,
        queue: str,
        catch_up: bool,
        max_attempts: int | None,
        backoff: RetryPolicy | None,
        timeout: float | None,
    ) -> Callable[[Callable[[], R]], Task[[], R]]:
        def register(function: Callable[[], R]) -> Task[[], R]:
            signature = _signature(function)
            if signature is not None:
                try:
                    signature.bind()
                except TypeError:
                    raise TypeError(
                        f"a scheduled function is called without arguments: {signature}"
                    ) from None
            task = self._register(
                function,
                name=name,
                queue=queue,
                max_attempts=max_attempts,
                backoff=backoff,
                timeout=timeout,
            )
            self.crons[task.name] = CronJob(task, schedule, bool(catch_up))
            return task

        return register

    def _register(
        self,
        fn: Callable[P, R],
        *,
        name: str | None,
        queue: str,
        max_attempts: int | None,
        backoff: RetryPolicy | None,
        timeout: float | None,
    ) -> Task[P, R]:
        if not callable(fn):
            raise TypeError(f"a task is a function, not {type(fn).__name__}")
        task_name = check_identifier("task name", name or getattr(fn, "__name__", ""))
        check_queue_name(queue)
        if task_name in self.tasks:
            raise ValueError(f"a task named {task_name!r} is registered already")
        if backoff is not None and not isinstance(backoff, RetryPolicy):
            raise TypeError(f"backoff must be a RetryPolicy, not {type(backoff).__name__}")
        policy = backoff or self.retry
        attempts = policy.max_attempts if max_attempts is None else max_attempts
        if type(attempts) is not int or attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {attempts!r}")
        if timeout is not None and (
            type(timeout) not in (int, float) or not 0 < timeout < float("inf")
        ):
            raise ValueError(f"timeout must be seconds > 0 or None, got {timeout!r}")
        task = Task(
            self,
            fn,
            name=task_name,
            queue=queue,
            max_attempts=attempts,
            backoff=policy,
            timeout=None if timeout is None else float(timeout),
        )
        self.tasks[task_name] = task
        return task

    # -- sending ----------------------------------------------------------------------
    def send_many(self, messages: Iterable[TaskMessage]) -> list[str]:
        """Send many task calls (from :meth:`Task.message`); return their ids in order.
        The messages of one queue are stored in one atomic step (all or none)."""
        batches, queues = self._batches(messages)
        if len(batches) == 1:  # one queue: its ids are in order
            [(queue, items)] = batches.items()
            return self.queue(queue).put_many(items)
        stored = {
            queue: iter(self.queue(queue).put_many(items)) for queue, items in batches.items()
        }
        return [next(stored[queue]) for queue in queues]

    async def send_many_async(self, messages: Iterable[TaskMessage]) -> list[str]:
        """:meth:`send_many`, awaited."""
        batches, queues = self._batches(messages)
        stored: dict[str, Iterator[str]] = {}
        for queue, items in batches.items():
            stored[queue] = iter(await self.queue_async(queue).put_many(items))
        return [next(stored[queue]) for queue in queues]

    def _batches(
        self, messages: Iterable[TaskMessage]
    ) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """The ``put_many`` items of each queue, in order, and each message's queue."""
        batches: dict[str, list[dict[str, Any]]] = {}
        queues: list[str] = []
        for msg in messages:
            if type(msg) is not TaskMessage and not isinstance(msg, TaskMessage):
                raise TypeError(
                    f"send_many takes task.message(...) items, not {type(msg).__name__}"
                )
            task = msg.task
            queue = task.queue
            queues.append(queue)
            items = batches.get(queue)
            if items is None:
                items = batches[queue] = []
            if (
                msg.delay is None
                and msg.at is None
                and msg.id is None
                and msg.on_conflict == "ignore"
                and not msg.headers
            ):
                # put_item()'s dict, inline: the payload read once (put_many encodes it
                # before it returns), so the arguments need no copy (JSON writes a
                # tuple as a list). It is the task's envelope filled in: the queue's
                # codec stores the same dict.
                args: Any = msg.args  # a tuple, or what a TaskMessage was made with
                kwargs = msg.kwargs
                payload = Filled(
                    (
                        task.envelope,
                        args if type(args) is tuple or type(args) is list else list(args),
                        kwargs if type(kwargs) is dict else dict(kwargs),
                    )
                )
                items.append({"payload": payload, "max_attempts": task.max_attempts})
            else:
                items.append(msg.put_item())
        return batches, queues

    # -- queues -----------------------------------------------------------------------
    def queue(self, name: str = DEFAULT_QUEUE_NAME) -> Queue:
        """The app's sync queue ``name`` (opened on first use)."""
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = self._queues[name] = self.open_queue(name)
            return queue

    def queue_async(self, name: str = DEFAULT_QUEUE_NAME) -> AsyncQueue:
        """The app's asyncio queue ``name`` (opened on first use)."""
        with self._lock:
            queue = self._async_queues.get(name)
            if queue is None:
                queue = self._async_queues[name] = self.open_queue_async(name)
            return queue

    def open_queue(self, name: str = DEFAULT_QUEUE_NAME) -> Queue:
        """A new sync queue ``name`` on the app's URL, owned by the caller."""
        return Queue(self.url, name=name, retry=self.retry, **self.options)

    def open_queue_async(self, name: str = DEFAULT_QUEUE_NAME) -> AsyncQueue:
        """A new asyncio queue ``name`` on the app's URL, owned by the caller."""
        return AsyncQueue(self.url, name=name, retry=self.retry, **self.options)

    def close(self) -> None:
        """Close the sync queues the app opened (async ones: :meth:`close_async`)."""
        with self._lock:
            queues, self._queues = list(self._queues.values()), {}
        for queue in queues:
            queue.close()

    async def close_async(self) -> None:
        """Close every queue the app opened."""
        self.close()
        with self._lock:
            queues, self._async_queues = list(self._async_queues.values()), {}
        for queue in queues:
            await queue.close()

    # -- the names before the naming rule (see the module's docstring) -----------------
    def async_queue(self, name: str = DEFAULT_QUEUE_NAME) -> AsyncQueue:
        """Deprecated: :meth:`queue_async`."""
        _renamed("App.async_queue", "App.queue_async")
        return self.queue_async(name)

    def open_async_queue(self, name: str) -> AsyncQueue:
        """Deprecated: :meth:`open_queue_async`."""
        _renamed("App.open_async_queue", "App.open_queue_async")
        return self.open_queue_async(name)

    async def aclose(self) -> None:
        """Deprecated: :meth:`close_async`."""
        _renamed("App.aclose", "App.close_async")
        await self.close_async()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<App {redact_url(self.url)!r} tasks={sorted(self.tasks)}>"


def _renamed(old: str, new: str) -> None:
    """Warn the caller of ``old`` (a name before the naming rule) that it is ``new`` now."""
    warnings.warn(
        f"{old} is deprecated: use {new} (the asyncio twin of x is x_async)",
        DeprecationWarning,
        stacklevel=3,
    )
