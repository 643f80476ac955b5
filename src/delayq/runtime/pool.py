"""What the worker runs its handlers with: a thread pool of daemon threads, the lane
of sync handler threads, concurrency slots, and the gate that lets a reserved
message's handler start.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any, ParamSpec, TypeVar

from .._timer import precise_thread

__all__ = ["DaemonPool", "Gate", "NotStarted", "RunTimedOut", "Slots", "SyncLane"]

P = ParamSpec("P")
T = TypeVar("T")


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
    """How many more messages may be reserved (asyncio, one loop).

    With ``batch`` > 1 and ``low``, a reserve waits until ``batch`` slots are free, or
    ``low()`` says the messages reserved ahead are running out: a claim of many costs
    about as much as a claim of one, so a busy worker claims in fewer, bigger ones.
    """

    def __init__(
        self, total: int, *, batch: int = 1, low: Callable[[], bool] | None = None
    ) -> None:
        self.total = total
        self.free = total
        self._batch = max(1, min(batch, total))
        self._low = low
        self._waiter: asyncio.Future[None] | None = None  # take_all() waiting

    def resize(self, total: int, *, batch: int) -> None:
        """Make it ``total`` slots, reserved in batches of ``batch``: more are free at
        once; fewer are taken back as they are given back (``free`` below 0 meanwhile)."""
        self.free += total - self.total
        self.total = total
        self._batch = max(1, min(batch, total))
        self._wake()

    def _ready(self) -> bool:
        free = self.free
        return free >= self._batch or (free > 0 and (self._low is None or self._low()))

    async def take_all(self) -> int:
        """Wait for free slots (see the class), then take every free slot."""
        while not self._ready():
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        taken, self.free = self.free, 0
        return taken

    def give(self, count: int = 1) -> None:
        """Return ``count`` slots."""
        if count:
            self.free += count
            if self._waiter is not None:  # nobody waits: take_all() looks before it does
                self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and self._ready():
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)


class Gate:
    """At most ``total`` handlers running at once (asyncio, one loop), started in the
    order they asked; :meth:`close` turns away every waiter, and every later one.

    The worker reserves more messages than it runs (the prefetch): each waits here,
    its lease renewed, until a handler ends and lets it in.
    """

    def __init__(self, total: int) -> None:
        self.free = total
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._closed = False

    @property
    def waiting(self) -> int:
        """How many wait for a place (some may have given up meanwhile)."""
        return len(self._waiters)

    def try_enter(self) -> bool:
        """Take a free place if one is free now and nobody waits: whether it did (no
        coroutine to make and await when it need not wait)."""
        if self.free and not self._waiters and not self._closed:
            self.free -= 1
            return True
        return False

    async def enter(self) -> bool:
        """Wait for a free place and take it: True; False once the gate is closed."""
        if self._closed:
            return False
        if self.free and not self._waiters:
            self.free -= 1
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.leave()  # let in as it was cancelled: pass the place on
            raise  # a cancelled waiter stays queued, done: leave() and close() skip it

    def leave(self) -> None:
        """Give a place back: to the first waiter, else to the free ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.free += 1

    def close(self) -> None:
        """Turn away every waiter (their :meth:`enter` returns False), and every later one."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)


#: What :meth:`SyncLane.submit_many` calls on the loop once a call ended: ``done(fn,
#: error, result, started, took)``: the call itself, ``error`` None when it returned,
#: ``started`` its time.monotonic() start (None with :class:`NotStarted`: the lane
#: closed before it started), ``took`` the seconds it ran (0.0 when it did not). One
#: function for the many calls of a claim: no closure per call.
Ran = Callable[[Any, BaseException | None, Any, "float | None", float], None]


#: A call that ran this long (seconds) or longer has its outcome sent to the loop at
#: once, whatever :class:`SyncLane`'s batch: one more wake-up is nothing beside it.
#: A call's time counts its waits for the GIL, which busy threads stretch to about
#: the interpreter's switch interval (5 ms by default): a quick call is not long
#: because it waited that much (at 1 ms, one in eight 0.1 ms Redis calls of a busy
#: lane counted as long, and sent most of the loop's wake-ups).
LONG_CALL = 0.005


class NotStarted(Exception):
    """A call of a :class:`SyncLane` that was dropped before a thread started it."""


class RunTimedOut(Exception):
    """A call of a :class:`SyncLane` ran past its timeout (its thread runs on)."""


@dataclass(eq=False, slots=True)
class _Run:
    """One call waiting in, or run by, a :class:`SyncLane`."""

    fn: Callable[[], Any]
    future: asyncio.Future[Any] | None  # what run() awaits, or None: submit_many's ``done``
    done: Ran | None = None
    started: float | None = None  # time.monotonic() when a thread took it
    not_before: float = 0.0  # time.monotonic() before which it may not start
    finished: bool = False
    dropped: bool = False  # never to start (the lane closed, or its caller gave up)
    abandoned: bool = False  # timed out: its thread ends when it returns


#: A call a lane thread ended: the call, what it raised (or None), what it returned,
#: and how long it ran (seconds; None: it never started, the lane closed while its
#: thread held it until its ``not_before``).
_Ended = tuple[_Run, BaseException | None, Any, float | None]


class SyncLane:
    """``threads`` daemon threads that run sync calls in the order they came, from one
    shared inbox: a thread that ends a call takes the next waiting one itself, with no
    round trip through the event loop in between. Outcomes go back to the loop in
    batches: one wake-up carries every call ended since the last.

    The loop wakes at most one sleeping thread at a time; a woken thread that leaves
    calls behind wakes the next one itself. Waking a thread is a system call that may
    hand the CPU to the woken thread: done by the threads, it does not stall the loop,
    which every message goes through.

    While at least a round of calls (one per thread) waits, short calls' outcomes are
    held until ``batch`` of them have ended: each wake-up of the loop costs it a turn
    that gives the GIL away and must win it back from the busy threads, so a busy lane
    wakes it once per batch. An outcome goes at once when its call ran
    :data:`LONG_CALL` or longer, when fewer than a round of calls wait, and when the
    lane closes; :meth:`deliver` (the worker's renewal beat) sends any still held, so
    none waits longer than the running calls or that beat.

    A call given with a ``not_before`` (a message claimed ahead of its due time) is
    held by the thread that takes it, on that thread's own timer (a timed wait, the
    kernel's timer slack late), and started at or after that instant, never before:
    the loop's wake-up at the due time and its hand-over to a thread are not between
    the due time and the call. A close meanwhile drops it (:class:`NotStarted`).

    Made on the loop it reports to. A call that times out leaves its thread to it
    (a thread cannot be stopped) and a new thread takes its place.
    """

    def __init__(self, threads: int, name: str = "delayq-worker", *, batch: int = 1) -> None:
        self._loop = asyncio.get_running_loop()
        self._name = name
        self._round = threads  # a round of calls: one per thread
        self.batch = batch
        self.mean_call: float | None = None
        """Seconds a call runs, a moving mean of the last few dozen (None before any)."""
        self._lock = threading.Lock()
        self._runs: deque[_Run] = deque()  # under _lock, as are the four below
        self._sleeping = 0  # threads waiting for a ring of the bell
        self._ringing = False  # a ring on its way: the woken thread wakes the next
        self._ended: list[_Ended] = []
        self._waking = False  # a delivery to the loop on its way
        self._bell: SimpleQueue[None] = SimpleQueue()
        self._closed = False
        self._closing = threading.Event()  # set by close(): wakes the holding threads
        self._threads = 0
        for _ in range(threads):
            self._spawn()

    def _spawn(self) -> None:
        self._threads += 1
        thread = threading.Thread(
            target=self._serve, name=f"{self._name}-{self._threads}", daemon=True
        )
        thread.start()

    async def run(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """``fn()`` on a lane thread once one is free: its result, or what it raised.
        :class:`NotStarted` when the lane closed before it started; :class:`RunTimedOut`
        when it ran longer than ``timeout`` seconds (counted from its start)."""
        if self._closed:
            raise NotStarted("the lane is closed")
        future = self._loop.create_future()
        run = _Run(fn, future)
        self._queue(run)
        try:
            while not future.done():
                if timeout is None:
                    await future
                    break
                started = run.started
                left = timeout if started is None else started + timeout - time.monotonic()
                if left <= 0:
                    if self._abandon(run):
                        raise RunTimedOut
                    self.deliver()  # it ended in time: its outcome may be held for a batch
                await asyncio.wait({future}, timeout=max(left, 0.0))
        except asyncio.CancelledError:
            with self._lock:
                run.dropped = run.started is None
            raise
        return future.result()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def waiting(self) -> int:
        """How many calls wait for a thread (a glance, without the lock)."""
        return len(self._runs)

    def submit_many(
        self, calls: Iterable[Callable[[], Any]], done: Ran, not_before: float = 0.0
    ) -> None:
        """Run each of ``calls`` on a lane thread once one is free, in order (queued
        under one take of the lock), not before ``not_before`` (``time.monotonic()``:
        the thread that takes one holds it until then), then ``done(fn, error, result,
        started, took)`` on the loop: no future, no task (the worker's plain sync jobs)."""
        if self._closed:
            for fn in calls:
                done(fn, NotStarted("the lane is closed"), None, None, 0.0)
            return
        self._queue(*[_Run(fn, None, done, None, not_before) for fn in calls])

    def _queue(self, *runs: _Run) -> None:
        with self._lock:
            self._runs.extend(runs)
            ring = self._ring()
        if ring:
            self._bell.put(None)

    def _ring(self) -> bool:
        """Under the lock: whether to wake a sleeping thread for the waiting calls."""
        if self._runs and self._sleeping and not self._ringing:
            self._sleeping -= 1
            self._ringing = True
            return True
        return False

    def _abandon(self, run: _Run) -> bool:
        with self._lock:
            if run.finished:
                return False
            run.abandoned = True
        if not self._closed:
            self._spawn()  # its thread runs on: another one takes its place
        return True

    def _next(self, ended: _Ended | None) -> _Run | None:
        """On a lane thread: hand over the outcome of the call it ``ended`` (if any),
        then the next call to run (marked started); None once closed, or when the call
        it ended was abandoned (its thread ends). One lock section for both: a thread
        that blocks on the lock gives the GIL away."""
        wake = ring = False
        woken = False
        while True:
            with self._lock:
                abandoned = False
                if ended is not None:
                    wake, abandoned = self._ended_locked(ended)
                    ended = None
                if woken:
                    self._ringing = False
                run = None
                if not abandoned:
                    while self._runs and run is None:
                        run = self._runs.popleft()
                        if run.dropped:
                            run = None
                if run is not None:
                    run.started = time.monotonic()
                    ring = self._sleeping > 0 and self._ring()  # none asleep: a busy lane
                elif self._closed or abandoned:
                    pass
                else:
                    self._sleeping += 1
            if wake:
                wake = False
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return None
            if run is not None:
                if ring:
                    self._bell.put(None)
                return run
            if self._closed or abandoned:
                return None
            self._bell.get()
            woken = True

    def _ended_locked(self, ended: _Ended) -> tuple[bool, bool]:
        """Under the lock: note a call's outcome; whether to wake the loop for the
        outcomes held, and whether the call was abandoned (timed out)."""
        run, _, _, took = ended
        if took is not None:
            mean = self.mean_call
            self.mean_call = took if mean is None else mean + (took - mean) / 16
        run.finished = True
        held = self._ended
        held.append(ended)
        wake = not self._waking and (
            len(held) >= self.batch
            or len(self._runs) < self._round
            or took is None
            or took >= LONG_CALL
            or self._closed
        )
        if wake:
            self._waking = True
        return wake, run.abandoned

    def _serve(self) -> None:
        precise_thread()  # its hold of a call until its due time ends on time
        ended: _Ended | None = None
        while True:
            run = self._next(ended)
            del ended
            if run is None:
                return
            if run.not_before and not self._hold(run):
                run.started = None
                ended = (run, NotStarted("the lane closed while it held the call"), None, None)
                del run
                continue
            error: BaseException | None = None
            result: Any = None
            try:
                result = run.fn()
            except BaseException as exc:
                error = exc
            assert run.started is not None
            ended = (run, error, result, time.monotonic() - run.started)
            del run, error, result

    def _hold(self, run: _Run) -> bool:
        """On the thread that took ``run``: wait until its ``not_before`` (a wait on the
        close's event, which the kernel ends within its timer slack of the instant),
        then mark it started: True; False when the lane closed meanwhile."""
        closing, monotonic = self._closing, time.monotonic
        while (left := run.not_before - monotonic()) > 0.0:
            if closing.wait(left):
                return False
        run.started = monotonic()
        return True

    def deliver(self) -> None:
        """On the loop: hand over now the outcomes held back for a batch, if any."""
        with self._lock:
            if not self._ended or self._waking:
                return
            self._waking = True
        self._deliver()

    def _deliver(self) -> None:
        with self._lock:
            ended, self._ended, self._waking = self._ended, [], False
        for run, error, result, took in ended:
            future = run.future
            if future is None:
                assert run.done is not None
                try:
                    run.done(run.fn, error, result, run.started, took or 0.0)
                except Exception as exc:  # a bug of done(): the others still get theirs
                    self._loop.call_exception_handler(
                        {"message": "SyncLane done", "exception": exc}
                    )
            elif future.done():
                continue
            elif error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def close(self) -> None:
        """Drop every call not started yet (their :meth:`run` raises :class:`NotStarted`,
        as does every later one); threads end once their running call returns. The
        outcomes held for a batch are handed over first."""
        self.deliver()
        self._closing.set()
        with self._lock:
            self._closed = True
            dropped = list(self._runs)
            self._runs.clear()
            for run in dropped:
                run.dropped = True
            sleeping, self._sleeping = self._sleeping, 0
        for run in dropped:
            error = NotStarted("the lane closed before it started")
            if run.future is None:
                assert run.done is not None
                run.done(run.fn, error, None, None, 0.0)
            elif not run.future.done():
                run.future.set_exception(error)
        for _ in range(sleeping):
            self._bell.put(None)
