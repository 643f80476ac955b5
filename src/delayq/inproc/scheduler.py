"""Scheduler: run callbacks at their time, on a thread pool, over a DelayQueue.

One dispatcher thread takes due timers from a :class:`~delayq.DelayQueue` and
submits them to a :class:`concurrent.futures.ThreadPoolExecutor`. The scheduler's
own lock makes every state change of a :class:`Timer` (pending -> fired, or pending
-> cancelled) happen exactly once, so ``cancel`` returning True means the callback
will not run, even when the dispatcher had already taken the timer out of the queue
and was about to submit it.

Lock order: the scheduler lock may be held while the queue's lock is taken (put,
cancel, reschedule), never the other way round; the dispatcher holds no lock while
it waits, and callbacks run with no lock held, so a callback may call
``call_later``, ``cancel`` or ``reschedule`` on its own scheduler.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from types import TracebackType
from typing import Any

from .._clock import Clock
from .._duration import AtLike, DelayLike, deadline_from
from .._log import LOGGER_NAME
from ..errors import QueueClosed
from ._constants import DEFAULT_GET_MANY, DEFAULT_SCHEDULER_WORKERS
from .queue import DelayQueue
from .store import Handle, TimerStore, describe_due

__all__ = ["Scheduler", "Timer"]

_logger = logging.getLogger(LOGGER_NAME)
_instance_numbers = itertools.count(1)

_PENDING, _FIRED, _CANCELLED = 0, 1, 2
_EMPTY_KWARGS: dict[str, Any] = {}
_Call = tuple[Callable[..., object], tuple[Any, ...], dict[str, Any]]


class Timer:
    """A callback scheduled on a :class:`Scheduler`: what ``call_later``/``call_at`` return.

    ``id`` is the id given at scheduling (None if none was given); ``deadline`` is when
    it is due, in the scheduler clock's monotonic seconds, and ``due_at`` the same as an
    aware UTC datetime; ``pending`` is True until the
    callback starts or the timer is cancelled. A timer replaced by a later
    ``call_later(..., id=same_id)`` counts as cancelled: its handle stays ``pending ==
    False`` and ``cancel(old_handle)`` returns False, while ``cancel(id)`` reaches the
    new timer. Timers hash and compare by identity.
    """

    __slots__ = ("__weakref__", "_args", "_fn", "_handle", "_id", "_kwargs", "_scheduler", "_state")

    def __init__(
        self,
        scheduler: Scheduler,
        timer_id: Hashable | None,
        fn: Callable[..., object],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self._scheduler = scheduler
        self._id = timer_id
        self._fn: Callable[..., object] | None = fn
        self._args = args
        self._kwargs = kwargs
        self._state = _PENDING
        self._handle: Handle[Timer] | None = None

    @property
    def id(self) -> Hashable | None:
        """The id given at scheduling, or None."""
        return self._id

    @property
    def deadline(self) -> float:
        """When the callback is (or was) due, in the scheduler clock's monotonic seconds."""
        assert self._handle is not None  # set before the timer is handed out
        return self._handle.deadline

    @property
    def due_at(self) -> datetime:
        """When the callback is (or was) due, as an aware UTC datetime (see
        :attr:`Handle.due_at <delayq.Handle.due_at>`)."""
        assert self._handle is not None  # set before the timer is handed out
        return self._handle.due_at

    @property
    def pending(self) -> bool:
        """True until the callback is started or the timer is cancelled or replaced."""
        return self._state == _PENDING

    @property
    def cancelled(self) -> bool:
        """True once the timer was cancelled, replaced, or dropped by a shutdown."""
        return self._state == _CANCELLED

    def cancel(self) -> bool:
        """Cancel this timer; same as ``scheduler.cancel(timer)``."""
        return self._scheduler.cancel(self)

    def reschedule(self, delay: DelayLike | None = None, at: AtLike | None = None) -> bool:
        """Move this timer; same as ``scheduler.reschedule(timer, delay=..., at=...)``."""
        return self._scheduler.reschedule(self, delay=delay, at=at)

    def __repr__(self) -> str:
        status = ("pending", "fired", "cancelled")[self._state]
        name = getattr(self._fn, "__qualname__", None) or repr(self._fn)
        fn = f" fn={name}" if self._fn is not None else ""
        due = f" {describe_due(self._handle)}" if self._handle is not None else ""
        return f"<Timer {status} id={self.id!r}{due}{fn}>"


class Scheduler:
    """Runs callbacks at their time on a pool of ``max_workers`` threads.

    ``store`` is the :class:`~delayq.TimerStore` of the underlying
    :class:`~delayq.DelayQueue` (a new :class:`~delayq.HeapStore` by default; a
    :class:`~delayq.WheelStore` suits many long timers that are reset); ``clock`` is
    a :class:`~delayq.SystemClock` (default) or a :class:`~delayq.FakeClock` for
    tests. A callback that raises is logged on the ``"delayq"`` logger and the
    scheduler goes on. As a context manager it exits with
    ``shutdown(wait=True, cancel_pending=False)``: pending timers still fire.

    The dispatcher is a daemon thread: a scheduler that is never shut down does not
    keep the process alive, and its pending timers are lost at exit.
    """

    def __init__(
        self,
        max_workers: int = DEFAULT_SCHEDULER_WORKERS,
        *,
        store: TimerStore[Timer] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if type(max_workers) is not int:
            raise TypeError(f"max_workers must be an int, not {type(max_workers).__name__}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._queue: DelayQueue[Timer] = DelayQueue(store, clock=clock)
        self._clock = self._queue.clock
        self._max_workers = max_workers
        self._lock = threading.Lock()
        self._by_id: dict[Hashable, Timer] = {}
        self._pending = 0
        self._closed = False
        self._drop_pending = False
        self._in_callback = threading.local()
        number = next(_instance_numbers)
        self._executor = ThreadPoolExecutor(
            max_workers, thread_name_prefix=f"delayq-scheduler-{number}-worker"
        )
        self._dispatcher = threading.Thread(
            target=self._dispatch, name=f"delayq-scheduler-{number}-dispatcher", daemon=True
        )
        self._dispatcher.start()

    # -- scheduling ----------------------------------------------------------------
    def call_later(
        self,
        delay: DelayLike,
        fn: Callable[..., object],
        /,
        *args: Any,
        id: Hashable | None = None,
        **kwargs: Any,
    ) -> Timer:
        """Run ``fn(*args, **kwargs)`` once ``delay`` has passed; return its :class:`Timer`.

        ``delay`` is seconds, a timedelta or a string like ``"250ms"``/``"1h30m"``; a
        negative delay means now. ``id`` (any hashable) lets ``cancel``/``reschedule``
        find the timer by id; scheduling an id that is pending replaces the old timer
        (a keep-alive reset, a debounce). ``delay`` and ``fn`` are
        positional-only, so a callback may take keyword arguments of those names; a
        callback that needs an ``id`` argument takes a :func:`functools.partial`.
        Invalid input raises (``TypeError``/``ValueError``) and schedules nothing;
        after :meth:`shutdown` this raises :class:`~delayq.QueueClosed`.
        """
        if delay is None:
            raise TypeError("call_later needs a delay (use 0 for now)")
        return self._schedule(delay, None, fn, args=args, timer_id=id, kwargs=kwargs)

    def call_at(
        self,
        at: AtLike,
        fn: Callable[..., object],
        /,
        *args: Any,
        id: Hashable | None = None,
        **kwargs: Any,
    ) -> Timer:
        """Run ``fn(*args, **kwargs)`` at ``at``: an aware datetime or epoch seconds.

        The wall-clock deadline is converted to the monotonic clock once, now; a
        deadline in the past means now. Otherwise as :meth:`call_later`.
        """
        if at is None:
            raise TypeError("call_at needs an aware datetime or epoch seconds, not None")
        return self._schedule(None, at, fn, args=args, timer_id=id, kwargs=kwargs)

    def _schedule(
        self,
        delay: object,
        at: object,
        fn: Callable[..., object],
        *,
        args: tuple[Any, ...],
        timer_id: Hashable | None,
        kwargs: dict[str, Any],
    ) -> Timer:
        if not callable(fn):
            raise TypeError(f"fn must be callable, not {type(fn).__name__}")
        if timer_id is not None:
            _check_id(timer_id)
        timer = Timer(self, timer_id, fn, args, kwargs or _EMPTY_KWARGS)
        with self._lock:
            if self._closed:
                raise QueueClosed("the scheduler was shut down")
            # put validates delay/at and raises before anything changes
            timer._handle = self._queue.put(timer, delay, at)
            self._pending += 1
            if timer_id is not None:
                old = self._by_id.get(timer_id)
                if old is not None:
                    self._cancel_locked(old)
                self._by_id[timer_id] = timer
        return timer

    # -- changing ------------------------------------------------------------------
    def cancel(self, id_or_handle: Hashable | Timer) -> bool:
        """Cancel a pending timer, by id or by its :class:`Timer`.

        True if it was pending: its callback will not run. False if it already
        started, was cancelled or replaced, or the id is unknown. A timer of another
        scheduler raises :class:`ValueError`.
        """
        with self._lock:
            timer = self._find(id_or_handle)
            if timer is None or timer._state != _PENDING:
                return False
            self._cancel_locked(timer)
            return True

    def reschedule(
        self,
        id_or_handle: Hashable | Timer,
        delay: DelayLike | None = None,
        at: AtLike | None = None,
    ) -> bool:
        """Move a pending timer (by id or :class:`Timer`) to ``delay=`` or ``at=``
        (neither: now); it keeps its id and handle.

        False if it is no longer pending or the id is unknown. Invalid ``delay``/``at``
        raise before anything changes.
        """
        clock = self._clock
        deadline_from(delay, at, clock.monotonic(), clock.time())  # validate only
        with self._lock:
            timer = self._find(id_or_handle)
            if timer is None or timer._state != _PENDING:
                return False
            handle = timer._handle
            assert handle is not None
            if self._queue.reschedule(handle, delay, at):
                return True
            # The dispatcher took it out of the queue but has not claimed it yet: put it
            # back; the dispatcher sees the new, pending handle and leaves it alone.
            try:
                timer._handle = self._queue.put(timer, delay, at)
            except QueueClosed:
                return False  # shut down meanwhile: it fires as it was
            return True

    def _find(self, id_or_handle: object) -> Timer | None:
        """The timer an id or handle names (lock held)."""
        if isinstance(id_or_handle, Timer):
            if id_or_handle._scheduler is not self:
                raise ValueError("this timer belongs to another scheduler")
            return id_or_handle
        if id_or_handle is None:
            return None
        return self._by_id.get(_check_id(id_or_handle))

    def _cancel_locked(self, timer: Timer) -> None:
        handle = timer._handle
        assert handle is not None
        self._queue.cancel(handle)  # False when the dispatcher holds it: its claim fails
        self._retire(timer, _CANCELLED)

    def _retire(self, timer: Timer, state: int) -> None:
        """Move a pending timer to ``state`` and forget it (lock held)."""
        timer._state = state
        self._pending -= 1
        timer_id = timer.id
        if timer_id is not None and self._by_id.get(timer_id) is timer:
            del self._by_id[timer_id]
        # The timer may outlive its run (the caller holds it): let go of the callback.
        timer._fn = None
        timer._args = ()
        timer._kwargs = _EMPTY_KWARGS

    # -- running -------------------------------------------------------------------
    def _dispatch(self) -> None:
        queue = self._queue
        try:
            while True:
                try:
                    due = queue.get_many(DEFAULT_GET_MANY)
                except QueueClosed:
                    return
                runnable: list[tuple[Timer, _Call]] = []
                with self._lock:
                    for timer in due:
                        call = self._claim(timer)
                        if call is not None:
                            runnable.append((timer, call))
                for timer, call in runnable:
                    self._executor.submit(self._run, timer, *call)
        except Exception:  # a bug, or the interpreter is exiting (submit refuses)
            _logger.exception("delayq scheduler: the dispatcher stopped")
        finally:
            self._executor.shutdown(wait=False)

    def _claim(self, timer: Timer) -> _Call | None:
        """Mark a timer taken from the queue as fired and return its call; None if it
        must not run (lock held)."""
        handle = timer._handle
        if timer._state != _PENDING or (handle is not None and handle.pending):
            return None  # cancelled, or rescheduled after it was taken: a stale copy
        if self._drop_pending:
            self._retire(timer, _CANCELLED)
            return None
        fn = timer._fn
        assert fn is not None  # a pending timer always has its callback
        call = (fn, timer._args, timer._kwargs)
        self._retire(timer, _FIRED)
        return call

    def _run(
        self,
        timer: Timer,
        fn: Callable[..., object],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        local = self._in_callback
        local.active = True
        try:
            fn(*args, **kwargs)
        except Exception:
            name = getattr(fn, "__qualname__", None) or repr(fn)
            _logger.exception("delayq scheduler: callback %s of %r raised", name, timer)
        finally:
            local.active = False

    # -- stopping ------------------------------------------------------------------
    def shutdown(self, wait: bool = True, cancel_pending: bool = False) -> None:
        """Stop accepting timers: later ``call_later``/``call_at`` raise
        :class:`~delayq.QueueClosed`.

        Pending timers still fire at their time unless ``cancel_pending`` drops them
        (a timer the dispatcher is handing to the pool at that instant is dropped as it
        gets there: it never runs, though it reads as pending until then).
        ``wait`` blocks until every pending timer has fired and every callback has
        returned (from inside a callback it never waits: that would deadlock).
        ``cancel`` and ``reschedule`` keep working on timers still pending. Calling
        it again is harmless, and ``cancel_pending=True`` then drops what is left.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.close()
            if cancel_pending:
                self._drop_pending = True
                for timer in self._queue.clear():
                    if timer._state == _PENDING:
                        self._retire(timer, _CANCELLED)
        if wait and not getattr(self._in_callback, "active", False):
            self._dispatcher.join()
            self._executor.shutdown(wait=True)

    def __enter__(self) -> Scheduler:
        """Return the scheduler itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Shut down with ``wait=True, cancel_pending=False``: pending timers still fire."""
        self.shutdown(wait=True, cancel_pending=False)

    # -- inspecting ----------------------------------------------------------------
    @property
    def pending(self) -> int:
        """How many timers are waiting for their time (not started, not cancelled)."""
        return self._pending

    def __len__(self) -> int:
        """Same as :attr:`pending`."""
        return self._pending

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` was called."""
        return self._closed

    @property
    def clock(self) -> Clock:
        """The clock deadlines are measured on."""
        return self._clock

    @property
    def max_workers(self) -> int:
        """The size of the callback thread pool."""
        return self._max_workers

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Scheduler {state} pending={self._pending} max_workers={self._max_workers}>"


def _check_id(timer_id: object) -> Hashable:
    """Return ``timer_id`` if it can be an id: hashable, and not a :class:`Timer`."""
    if isinstance(timer_id, Timer):
        raise TypeError("a Timer is not an id: pass the timer itself as the handle")
    try:
        hash(timer_id)
    except TypeError:
        raise TypeError(f"an id must be hashable, not {type(timer_id).__name__}") from None
    return timer_id
