"""Worker: runs handlers for reserved messages, keeps their leases, shuts down gently.

One asyncio loop per worker. Per queue a reserver claims up to as many messages as
there are free slots (``concurrency + prefetch``) and starts a job for each; at most
``concurrency`` of them run their handler at once (:class:`~delayq.runtime.pool.Gate`),
the rest wait their turn (the prefetch: the next handler starts without waiting for a
reserve round trip). Async handlers run on the loop, sync ones on a daemon thread
each. A handler's place goes to the next message as soon as it returns, before its
ack. From its reservation until its handler ends, a message's lease is renewed every
third of the lease, so a waiting or long job is never handed to someone else while
its worker is alive. Outcomes:

* returned: ``ack`` (the acks of jobs finishing close together go out as one
  ``ack_many``, see :mod:`delayq.runtime.ack_batch`);
* raised :class:`Retry`: ``nack`` after the asked delay (the attempt counts);
* raised :class:`Discard`, an unknown task, or arguments its task's function cannot
  take: dead at once (``nack(dead=True)``);
* raised anything else, or ran past its timeout: ``nack`` with the task's backoff,
  dead once its attempts are used up.

``stop()`` (or SIGTERM/SIGINT under :meth:`Worker.run`) stops reserving, gives the
prefetched messages back at once, lets running handlers finish for ``grace`` seconds,
then gives the rest back (``release``: due
where they were, the attempt not charged) and returns; a second
signal skips the grace period. Every change is logged on the ``delayq`` logger. A
backend that stops answering is tried again with a doubling pause, one log line per
step and one when it is back (:mod:`delayq.runtime.outage`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import signal
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._clock import SYSTEM_CLOCK, Clock
from .._duration import delay_to_seconds
from .._log import log_enabled as _log_enabled
from .._log import log_event, log_raised
from .._timeout import within
from ..durable.constants import DEFAULT_LEASE
from ..durable.message import Message, State
from ..durable.queue import AsyncQueue
from ..durable.retry import RetryPolicy
from ..durable.traceback import user_frames
from ..durable.tracing import run_ids, spans_on, traced
from ..errors import LeaseLost, QueueClosed
from ._app import App, BadArguments, CronJob, UnknownTask, decode_envelope
from ._cron import plan_tick, tick_id
from ._health import start_health
from ._metrics import WorkerMetrics
from .ack_batch import AckBatcher, AckOutcome
from .constants import (
    CRON_ACK_GUARD,
    CRON_PRODUCER_MAX_SLEEP,
    CRON_TICK_HEADER,
    DEFAULT_WORKER_CONCURRENCY,
    DEFAULT_WORKER_GRACE,
    WORKER_BURST_LIMIT,
    WORKER_ERROR_BACKOFF,
    WORKER_EXTEND_DIVISOR,
    WORKER_IDLE_WAIT,
    WORKER_PREFETCH_AHEAD,
    WORKER_PREFETCH_MAX_PER_HANDLER,
)
from .consumer import LeaseRenewer, check_prefetch, extend_lease, prefetch_slots, reserve_loop
from .outage import Outage
from .pool import DaemonPool, Gate, NotStarted, RunTimedOut, Slots, SyncLane

__all__ = ["Discard", "Handler", "HandlerTimeout", "JobRun", "Retry", "Worker", "current_message"]

Handler = Callable[[Message], Any]
"""A handler of plain messages: ``handler(msg)``, sync or async."""

_current: contextvars.ContextVar[Message] = contextvars.ContextVar("delayq_current_message")


def current_message() -> Message:
    """The message whose handler or task is running (in that handler, sync or async):
    its id, attempts, headers... ``LookupError`` outside a handler."""
    return _current.get()


_INFO, _WARNING, _ERROR, _DEBUG = logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG
#: How many outcomes of the lane between two looks at the default prefetch.
_PREFETCH_LOOK_EVERY = 64


class Retry(Exception):
    """Raise in a handler to try the message again after ``delay`` (seconds, a
    timedelta or ``"30s"``; None: the retry policy's backoff). The attempt counts:
    once attempts are used up the message goes to dead."""

    def __init__(self, delay: Any = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay = None if delay is None else max(0.0, delay_to_seconds(delay))
        self.reason = reason


class Discard(Exception):
    """Raise in a handler to send the message to dead at once, with ``reason`` as
    its last error."""

    def __init__(self, reason: str = "discarded") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class JobRun:
    """How one run of a message ended, as :meth:`Worker.burst` reports it.

    ``message`` is the message as reserved (``attempts`` counts this run); ``task``,
    ``args`` and ``kwargs`` are its task call (``task`` None: not a task message);
    ``outcome`` is ``"succeeded"``, ``"retried"`` (back to wait for its next attempt),
    ``"dead"``, ``"skipped"`` (a cron tick not run), ``"lease_lost"`` or
    ``"unsettled"`` (the backend did not take the outcome); ``error`` is what the run
    raised (None when it returned); ``time`` is the worker clock's epoch seconds when
    it ended.
    """

    message: Message
    task: str | None
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    outcome: str
    error: BaseException | None
    time: float


@dataclass(slots=True)
class _Call:
    """What a job runs for one message."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    is_async: bool
    label: str
    timeout: float | None
    retry: RetryPolicy
    cron: CronJob | None = None
    tick_ms: int | None = None
    # The task's max_attempts: it caps a message put by another face (the HTTP API,
    # ``put`` of an envelope) that did not say it, as ``send`` does.
    max_attempts: int | None = None


@dataclass(eq=False, slots=True)
class _Held:
    """A message on the fast path: a plain sync call run by the lane, with no task of
    its own; its lease is renewed by the worker's renewal loop until its call ends.
    Called (on a lane thread), it runs its handler in a copy of its own of ``context``
    (the loop's as its claim came in, one for the claim), where
    :func:`current_message` is its message."""

    queue: AsyncQueue
    msg: Message
    call: _Call
    renew_at: float  # loop time of its next lease renewal (inf: no more)
    acker: AckBatcher  # its queue's
    context: contextvars.Context | None = None
    started: float = 0.0  # time.monotonic() when its handler started
    took: float = 0.0  # seconds its handler ran
    busy: bool = False  # its handler ended: an ack, nack or give-back is on its way
    settled: bool = False  # done with: its slot is back

    def __call__(self) -> Any:
        assert self.context is not None
        return self.context.copy().run(_run_call, self.msg, self.call)


def _run_call(msg: Message, call: _Call) -> Any:
    _current.set(msg)
    return call.fn(*call.args, **call.kwargs)


def _cancelling(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` was asked to cancel and has not given that up (Python 3.11+:
    a cancel caught and swallowed by the code it reached still counts; before 3.11 a
    cancel, once delivered, is gone)."""
    return sys.version_info >= (3, 11) and task.cancelling() > 0


def _metering() -> Callable[[WorkerMetrics], Callable[[], None]] | None:
    """When the process has set an OpenTelemetry meter provider that records: what
    reports a Worker's metrics through it from then on (and returns what to call as
    that Worker stops), else None. One ``sys.modules`` look-up when the process has
    not imported the OpenTelemetry metrics API: nothing of it is imported here."""
    if "opentelemetry.metrics" not in sys.modules:
        return None
    from . import _otel_metrics as otel  # noqa: PLC0415

    meter = otel.recording()
    return None if meter is None else functools.partial(otel.report, meter)


class Worker:
    """Runs the tasks of an :class:`~delayq.App` (every queue it uses, or those in
    ``queues``), or ``handler(msg)`` for the messages of one
    :class:`~delayq.AsyncQueue`.

    ``concurrency`` handlers run at once, and up to ``prefetch`` more messages
    (default: 4 x ``concurrency``, up to 16 x when every handler is sync and quick,
    as long as those waiting stand for at most 50 ms of their work; 0: none) are
    reserved ahead, waiting for a handler to end; ``lease`` (seconds) is each
    reservation's lease, renewed until its handler ends (waiting ones
    included); ``grace`` is how long running handlers may finish after a stop;
    ``timeout`` (seconds) is the default limit of one run (a task's own ``timeout``
    wins). ``clock`` (default: the app's ``clock=`` option, else the system clock)
    is what cron schedules read. ``metrics=True`` counts its Prometheus metrics
    (:attr:`metrics`; ``delayq worker --metrics-port`` serves them); they are counted
    and reported through OpenTelemetry too when the process has set an OpenTelemetry
    meter provider before the Worker starts (docs/guide/observability.md).
    """

    def __init__(
        self,
        source: App | AsyncQueue,
        handler: Handler | None = None,
        *,
        concurrency: int = DEFAULT_WORKER_CONCURRENCY,
        prefetch: int | None = None,
        lease: float = DEFAULT_LEASE,
        grace: float = DEFAULT_WORKER_GRACE,
        timeout: float | None = None,
        queues: Iterable[str] | None = None,
        clock: Clock | None = None,
        metrics: bool = False,
    ) -> None:
        if isinstance(source, App):
            if handler is not None:
                raise TypeError("a Worker of an App runs its tasks: give no handler")
            names = source.queue_names if queues is None else list(queues)
            unknown = sorted(set(names) - set(source.queue_names))
            if unknown:
                raise ValueError(f"no task of the app uses the queues {unknown}")
            if not names:
                raise ValueError("the app has no tasks: nothing to run")
            self._app: App | None = source
            self._queue: AsyncQueue | None = None
            self._queue_names = names
            option = source.options.get("clock")
            self._clock: Clock = clock or (option if isinstance(option, Clock) else SYSTEM_CLOCK)
        elif isinstance(source, AsyncQueue):
            if handler is None or not callable(handler):
                raise TypeError("a Worker of a queue needs handler(msg), a function")
            if queues is not None:
                raise TypeError("queues= is for a Worker of an App")
            self._app, self._queue, self._queue_names = None, source, [source.name]
            self._clock = clock or SYSTEM_CLOCK
        else:
            raise TypeError(f"a Worker runs an App or an AsyncQueue, not {type(source).__name__}")
        if type(concurrency) is not int or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self._prefetch_auto = prefetch is None
        prefetch = check_prefetch(prefetch, concurrency)
        self._handler = handler
        self._handler_is_async = handler is not None and _is_async(handler)
        self._handler_label = getattr(handler, "__name__", "handler")
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lease = _positive("lease", lease)
        self.grace = _positive("grace", grace, zero=True)
        self.timeout = None if timeout is None else _positive("timeout", timeout)
        self.counts: Counter[str] = Counter()
        """How many messages ended how: ``succeeded``, ``retried``, ``dead``,
        ``skipped`` (cron ticks not run), ``released``, ``lease_lost``."""
        if type(metrics) is not bool:
            raise TypeError(f"metrics must be True or False, got {metrics!r}")
        self.metrics: WorkerMetrics | None = WorkerMetrics() if metrics else None
        """Its Prometheus metrics (``metrics=True``, or :meth:`run` with a ``metrics``
        socket): runs by task and outcome, run time, lateness, messages in flight,
        backend outages; ``render()`` is their text. None when off (they cost nothing),
        until it starts in a process with an OpenTelemetry meter provider set."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = False
        self._force = False
        self._stopped: asyncio.Event | None = None
        self._forced: asyncio.Event | None = None
        self._releasing = False
        self._running: dict[asyncio.Task[None], Message] = {}
        self._queues: dict[str, AsyncQueue] = {}
        self._ackers: dict[str, AckBatcher] = {}
        self._pool = DaemonPool()
        self._slots: Slots | None = None
        self._gate: Gate | None = None
        self._lane: SyncLane | None = None
        self._adaptive = False  # whether it does (a lane, the default prefetch)
        self._outcomes = 0  # the lane's, up to the next look at the prefetch
        self._held: dict[_Held, None] = {}
        self._freed = 0  # slots of settled ones, given back at the loop's next turn
        self._held_empty: asyncio.Event | None = None
        self._fast_tasks: set[asyncio.Task[None]] = set()
        self._inbox: deque[_Held] = deque()  # async plain calls waiting for a runner
        self._idle: deque[asyncio.Future[None]] = deque()  # runners waiting for a call
        self._runners: set[asyncio.Task[None]] = set()
        self._inbox_closed = False
        self._runner_context: contextvars.Context | None = None
        self._outage: Outage | None = None
        self._journal: list[JobRun] | None = None  # a burst's runs

    # -- running ----------------------------------------------------------------------
    def run(
        self, *, health: socket.socket | None = None, metrics: socket.socket | None = None
    ) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`stop`), then drain and return.

        Blocks; starts its own event loop. A second signal skips the grace period.
        ``health``: a listening socket on which the loop answers ``/healthz`` (200
        while it turns) and ``/readyz`` (200, or 503 with :meth:`not_ready`'s reason),
        until the drain ends. ``metrics``: one on which it answers ``/metrics``, the
        Prometheus text of :attr:`metrics` (turned on if it was not); the same socket
        as ``health`` answers all three.
        """
        if metrics is not None and self.metrics is None:
            self.metrics = WorkerMetrics()
        asyncio.run(self._run_with_signals(health, metrics))

    def not_ready(self) -> str | None:
        """Why the Worker is not ready for work, or None: ``starting`` (not serving
        yet), ``draining`` (stopping), ``backend_unavailable`` (an outage it rides out)."""
        outage = self._outage
        if self._stop_requested:
            return "draining"
        if self._loop is None or outage is None:
            return "starting"
        return "backend_unavailable" if outage.down else None

    async def _run_with_signals(
        self, health: socket.socket | None = None, metrics: socket.socket | None = None
    ) -> None:
        render = None if self.metrics is None else self.metrics.render
        servers = []
        if health is not None:
            both = render if metrics is health else None
            servers.append(await start_health(health, self.not_ready, metrics=both))
        if metrics is not None and metrics is not health:
            servers.append(await start_health(metrics, None, metrics=render))
        loop = asyncio.get_running_loop()
        installed = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, self._on_signal, signum)
                installed.append(signum)
            except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
                pass
        try:
            await self.serve()
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
            for server in servers:
                server.close()

    def _on_signal(self, signum: int) -> None:
        graceful = not self._stop_requested
        log_event(_INFO, "worker.signal", signal=signal.Signals(signum).name, graceful=graceful)
        self.stop(graceful=graceful)

    def stop(self, *, graceful: bool = True) -> None:
        """Stop reserving; running handlers get ``grace`` seconds (none when not
        ``graceful``), then the rest are given back. Safe from any thread, and
        before :meth:`serve` started (it then returns at once)."""
        loop = self._loop
        if loop is not None and _other_thread(loop):
            loop.call_soon_threadsafe(functools.partial(self.stop, graceful=graceful))
            return
        self._stop_requested = True
        self._force = self._force or not graceful
        if self._stopped is not None:
            self._stopped.set()
        if self._forced is not None and self._force:
            self._forced.set()

    async def serve(self) -> None:
        """Run on the current event loop until :meth:`stop`, then drain and return."""
        self._loop = asyncio.get_running_loop()
        self._stopped, self._forced = asyncio.Event(), asyncio.Event()
        if self._stop_requested:
            self._stopped.set()
        if self._force:
            self._forced.set()
        if self._all_sync():  # the lane's threads bound how many run at once
            self._lane = SyncLane(self.concurrency, batch=self.prefetch // 2)
            most = WORKER_PREFETCH_MAX_PER_HANDLER * self.concurrency
            self._gate = gate = Gate(self.concurrency + max(self.prefetch, most))
            self._adaptive = self._prefetch_auto
        else:
            self._gate = gate = Gate(self.concurrency)
            self._runner_context = contextvars.copy_context()
            for _ in range(self.concurrency):
                self._spawn_runner()
        self._slots = prefetch_slots(self.concurrency, self.prefetch, self._waiting)
        self._held_empty = asyncio.Event()
        self._held_empty.set()
        self._open_queues()
        url = next(iter(self._queues.values())).url  # an App's queues share its URL
        report = _metering()
        if report is not None and self.metrics is None:
            self.metrics = WorkerMetrics()  # counted for OpenTelemetry
        metrics = self.metrics
        self._outage = Outage(
            url,
            event_prefix="worker",
            first=WORKER_ERROR_BACKOFF,
            on_change=None if metrics is None else metrics.outage,
        )
        if metrics is not None:
            metrics.watch(self.in_flight)
        reported = None if report is None or metrics is None else report(metrics)
        background = [
            asyncio.create_task(self._reserve_loop(queue), name=f"delayq-reserve-{name}")
            for name, queue in self._queues.items()
        ]
        for job in self._cron_jobs():
            background.append(asyncio.create_task(self._produce(job), name="delayq-cron"))
        log_event(
            _INFO,
            "worker.started",
            queues=",".join(self._queues),
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            lease=self.lease,
            crons=",".join(job.task.name for job in self._cron_jobs()) or None,
        )
        renewals = asyncio.create_task(self._renew_held(), name="delayq-renew")
        try:
            await self._stopped.wait()
        finally:
            running = len(self._running.keys() - self._runners) + len(self._held)
            log_event(_INFO, "worker.stopping", running=running, grace=self.grace)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            gate.close()  # the prefetched ones go back now
            self._close_inbox()
            if self._lane is not None:
                self._lane.close()
            await self._drain()
            for acker in self._ackers.values():
                await acker.drain()
            await asyncio.gather(*self._fast_tasks, return_exceptions=True)
            renewals.cancel()
            await asyncio.gather(renewals, return_exceptions=True)
            self._pool.shutdown(wait=False)
            await self._close_queues()
            self._loop = None
            if reported is not None:
                reported()
            if metrics is not None:
                metrics.watch(None)
            log_event(_INFO, "worker.stopped", **dict(self.counts))

    async def burst(self, *, limit: int = WORKER_BURST_LIMIT) -> list[JobRun]:
        """Run every message due now, and those that these runs make due by now (a
        task sent with no delay, ``Retry(0)``), then return how each run ended, in
        order. Nothing waits for time to pass: with a :class:`~delayq.FakeClock`, a
        test moves the clock and runs a burst (:mod:`delayq.testing` does).

        Each message takes the path it takes under :meth:`serve` for a job of its own:
        its task looked up, its arguments bound, the handler on the loop (async) or a
        thread (sync) with :func:`current_message`, its timeout, then ack, retry with
        the task's backoff, or dead. Cron and interval schedules first put their next
        tick. Up to ``concurrency`` messages of a queue run at once, taken in due
        order. More than ``limit`` runs with messages still due is a ``RuntimeError``
        (a task that sends itself again with no delay would never end). Not while the
        worker serves.
        """
        if type(limit) is not int or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        if self._loop is not None:
            raise RuntimeError("the worker is serving or in a burst already")
        self._loop = asyncio.get_running_loop()
        self._gate = Gate(self.concurrency)
        self._pool = DaemonPool()
        journal: list[JobRun] = []
        self._journal = journal
        self._open_queues()
        try:
            now_ms = int(self._clock.time() * 1000.0)
            for job in self._cron_jobs():  # as the producers of serve() put it
                tick = job.tick_item(job.schedule.next_after(now_ms))
                await self._queues[job.task.queue].put(**tick)
            while await self._burst_round(limit - len(journal)):
                pass
            for acker in self._ackers.values():
                await acker.drain()
            return journal
        finally:
            self._journal = None
            self._pool.shutdown(wait=False)
            self._pool = DaemonPool()  # started by its first handler: serve() may follow
            await self._close_queues()
            self._loop = None

    async def _burst_round(self, left: int) -> bool:
        """Run what is due in each queue, up to ``concurrency`` at once: whether any ran."""
        ran = False
        for queue in self._queues.values():
            if left <= 0:
                if (await queue.stats()).ready:
                    raise RuntimeError(
                        "the burst ran its limit of messages and more are due: does a "
                        "task send itself again with no delay?"
                    )
                continue
            msgs = await queue.reserve(max=min(self.concurrency, left), wait=0, lease=self.lease)
            left -= len(msgs)
            ran = ran or bool(msgs)
            await asyncio.gather(*(self._job(queue, msg) for msg in msgs))
        return ran

    def in_flight(self) -> int:
        """How many messages it holds reserved and has not settled yet (waiting for a
        handler, running, or their ack or nack on its way)."""
        return len(self._running.keys() - self._runners) + len(self._held)

    def _note(
        self,
        msg: Message,
        call: _Call | None,
        outcome: str,
        error: BaseException | None,
        counted: str | None = None,
    ) -> None:
        """A run ended with ``outcome``: counted in :attr:`metrics` (as ``counted``
        when given: a finer word for it), and added to the burst's journal (none under
        :meth:`serve`)."""
        metrics = self.metrics
        if metrics is not None:
            metrics.settled(msg.queue, None if call is None else call.label, counted or outcome)
        if self._journal is None:
            return
        if call is not None and self._app is not None:
            task: str | None = call.label
            args, kwargs = call.args, call.kwargs
        elif self._app is not None:
            try:
                task, arguments, kwargs = decode_envelope(msg.payload)
                args = tuple(arguments)
            except UnknownTask:
                task, args, kwargs = None, (), {}
        else:
            task, args, kwargs = None, (msg,), {}
        self._journal.append(
            JobRun(msg, task, args, dict(kwargs), outcome, error, self._clock.time())
        )

    def _waiting(self) -> int:
        """How many reserved messages wait for a handler (at the gate or the lane)."""
        waiting = self._lane.waiting if self._lane is not None else 0
        assert self._gate is not None
        return waiting + self._gate.waiting

    def _open_queues(self) -> None:
        if self._queue is not None:
            self._queues = {self._queue.name: self._queue}
        else:
            assert self._app is not None
            self._queues = {name: self._app.open_queue_async(name) for name in self._queue_names}
        self._ackers = {name: AckBatcher(queue) for name, queue in self._queues.items()}

    async def _close_queues(self) -> None:
        if self._app is not None:  # a queue given by the caller stays the caller's
            for queue in self._queues.values():
                await queue.close()

    def _all_sync(self) -> bool:
        """Whether every handler this worker may run is a sync function."""
        if self._app is None:
            return not self._handler_is_async
        tasks = self._app.tasks.values()
        return not any(task.is_async for task in tasks if task.queue in self._queue_names)

    def _cron_jobs(self) -> list[CronJob]:
        if self._app is None:
            return []
        return [job for job in self._app.crons.values() if job.task.queue in self._queues]

    async def _drain(self) -> None:
        """Wait for running jobs up to ``grace`` (or a forced stop), then give back
        the messages of those still running."""
        assert self._forced is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (0.0 if self._force else self.grace)
        assert self._held_empty is not None
        forced = asyncio.create_task(self._forced.wait())
        held_empty = asyncio.create_task(self._held_empty.wait())
        try:
            while True:
                left: set[asyncio.Future[Any]] = {t for t in self._tasks() if not t.done()}
                remaining = deadline - loop.time()
                if (not left and not self._held) or forced.done() or remaining <= 0:
                    break
                if self._held:
                    left.add(held_empty)
                await asyncio.wait(
                    left | {forced}, timeout=remaining, return_when="FIRST_COMPLETED"
                )
        finally:
            forced.cancel()
            held_empty.cancel()
        left = {task for task in self._tasks() if not task.done()}
        running = [held for held in self._held if not held.busy]
        if left or running:
            log_event(_WARNING, "worker.releasing", running=len(left) + len(running))
            self._releasing = True
            for task in left:
                task.cancel()
            for held in running:  # its thread runs on; what it ends with is ignored
                held.busy = True
                self._fast_task(self._fast_give_back(held))
            await asyncio.gather(*left, *self._fast_tasks, return_exceptions=True)

    def _tasks(self) -> list[asyncio.Task[None]]:
        """The jobs and the runners of async calls: what a stop waits for."""
        return [*self._running.keys() - self._runners, *self._runners]

    # -- reserving --------------------------------------------------------------------
    def _reserve_loop(self, queue: AsyncQueue) -> Coroutine[Any, Any, None]:
        assert self._slots is not None
        assert self._outage is not None
        return reserve_loop(
            queue,
            self._slots,
            self._running,
            self._job,
            lease=self.lease,
            idle_wait=WORKER_IDLE_WAIT,
            outage=self._outage,
            hold_all_slots=len(self._queues) == 1,
            event_prefix="worker",
            start=self._start,
        )

    # -- the fast path: plain calls, no job (task) of their own per message ----------
    def _start(self, queue: AsyncQueue, msgs: list[Message], not_before: float) -> list[Message]:
        """Take the plain calls (no cron tick, no timeout) of a claim on the fast path:
        the sync ones straight to the lane (in one hand-over), the async ones to the
        runners' inbox (:meth:`_runner`); all renewed by :meth:`_renew_held` and acked with
        :meth:`AckBatcher.ack_soon`. Returns the messages left to a job of their own
        (:meth:`_job`). A claim that fired ahead (``not_before``, ``time.monotonic()``,
        still to come) goes to the lane only, whose threads hold each call until then;
        the reserve loop holds the rest and offers them again at that instant."""
        lane = self._lane
        if lane.closed if lane is not None else bool(not_before):
            return msgs
        loop = asyncio.get_running_loop()
        renew_at = loop.time() + self.lease / WORKER_EXTEND_DIVISOR
        debug = _log_enabled(_DEBUG)
        spans = spans_on()  # looked at once a claim: traced() is the call's own fn without
        context = contextvars.copy_context()  # each call runs in a copy of its own
        acker = self._ackers[queue.name]
        left: list[Message] = []
        calls: list[_Held] = []
        for msg in msgs:
            try:
                call = self._resolve(msg) if spans else self._call_of(msg)
            except Exception:  # an unknown task: its job sends it to dead
                left.append(msg)
                continue
            if call.cron is not None or call.timeout is not None:
                left.append(msg)
                continue
            if not call.is_async and lane is None:  # a sync call of a mixed app: the pool
                left.append(msg)
                continue
            if call.is_async and not_before:  # held by the reserve loop, then an inbox's
                left.append(msg)
                continue
            if call.is_async and self._inbox_closed:  # stopping: its job gives it back
                left.append(msg)
                continue
            held = _Held(queue, msg, call, renew_at, acker)
            self._held[held] = None
            if debug:
                log_event(_DEBUG, "job.reserved", queue=queue.name, id=msg.id, attempt=msg.attempts)
            if call.is_async:
                self._inbox.append(held)
                continue
            held.context = context
            calls.append(held)
        if self._held:
            assert self._held_empty is not None
            self._held_empty.clear()
        if calls:
            assert lane is not None
            lane.submit_many(calls, self._ran, not_before)
        idle = self._idle
        for _ in range(min(len(self._inbox), len(idle))):
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
        return left

    def _spawn_runner(self) -> None:
        assert self._runner_context is not None
        loop = asyncio.get_running_loop()
        # made in a copy of the serving context: the task runs in a copy of that copy
        task = self._runner_context.run(loop.create_task, self._runner())
        self._runners.add(task)
        task.add_done_callback(self._runner_ended)

    async def _runner(self) -> None:
        """One of ``concurrency`` tasks that run the fast path's async calls in turn,
        from the inbox, each once it has a place at the gate; the outcome goes to
        :meth:`_ran`, as the lane's. Each call starts in the context the runner was
        made with (a copy of the serving one, :func:`current_message` its message): a
        call that leaves the context changed ends its runner, and a new one takes its
        place. A task per call would cost its making and its first turn of the loop.
        A stop (:meth:`_close_inbox`) ends the idle runners, and the others once their
        call ended; past the grace a running one is cancelled (its message given back
        by the stop)."""
        gate, inbox, idle, running = self._gate, self._inbox, self._idle, self._running
        copy_context = contextvars.copy_context
        assert gate is not None
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        assert me is not None
        while True:
            if not inbox:
                if self._inbox_closed:
                    return
                waiter: asyncio.Future[None] = loop.create_future()
                idle.append(waiter)
                try:
                    await waiter
                finally:
                    waiter.cancel()  # cancelled while waiting: not woken again
                continue
            held = inbox.popleft()
            if held.busy or held.settled:  # given back by a stop meanwhile
                continue
            if not gate.try_enter() and not await gate.enter():  # stopping: give it back
                if not (held.busy or held.settled):
                    held.busy = True
                    await self._fast_give_back(held)
                continue
            _current.set(held.msg)
            before = copy_context()
            call = held.call
            running[me] = held.msg
            started = time.monotonic()
            error: BaseException | None = None
            cancelled = False
            try:
                await call.fn(*call.args, **call.kwargs)
            except asyncio.CancelledError as exc:  # given back past the grace (held.busy)
                error = NotStarted("cancelled") if not held.busy else exc
                cancelled = True
            except BaseException as exc:  # as a job: any failure is the message's
                error = exc
            finally:
                gate.leave()
                running.pop(me, None)
            self._ran(held, error, None, started, time.monotonic() - started)
            # Cancelled (by a stop past the grace, or by its handler's own doing, even
            # if the handler swallowed it: a cancel still pending would reach the next
            # call), or its context changed: it ends, and _runner_ended puts a new
            # runner in its place unless stopping.
            if cancelled or _cancelling(me) or copy_context() != before:
                return

    def _runner_ended(self, task: asyncio.Task[None]) -> None:
        """A runner ended (replaced, crashed, or the inbox closed): a new one takes its
        place unless stopping."""
        self._runners.discard(task)
        if task.cancelled():
            return
        if task.exception() is not None:
            log_event(_ERROR, "worker.job_crashed", error=repr(task.exception()))
        if not self._inbox_closed:
            self._spawn_runner()

    def _close_inbox(self) -> None:
        """On a stop: the async calls waiting in the inbox go back at once; idle
        runners end (the others once their call ended)."""
        self._inbox_closed = True
        while self._inbox:
            held = self._inbox.popleft()
            if not (held.busy or held.settled):
                held.busy = True
                self._fast_task(self._fast_give_back(held))
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _ran(
        self,
        held: _Held,
        error: BaseException | None,
        result: object,
        started: float | None,
        took: float,
    ) -> None:
        """The lane's word on ``held`` (on the loop): ack, nack or give back."""
        if self._adaptive:
            self._outcomes += 1
            if self._outcomes >= _PREFETCH_LOOK_EVERY:
                self._adapt_prefetch()
        if held.busy or held.settled:  # given back after the grace while it ran
            return
        held.busy = True
        held.renew_at = math.inf
        if error is None:  # counted in the metrics with its outcome (_acked)
            held.started = started or time.monotonic()
            held.took = took
            held.acker.ack_soon(held.msg, self._acked, held)
        elif isinstance(error, NotStarted):
            self._fast_task(self._fast_give_back(held))
        else:
            metrics = self.metrics
            if metrics is not None and started is not None:
                metrics.ran(held.queue.name, held.call.label, held.msg.due_at, started, took)
            seconds = time.monotonic() - (started or time.monotonic())
            self._fast_task(self._fast_failed(held, error, seconds))

    def _adapt_prefetch(self) -> None:
        """The default prefetch of a lane of sync handlers: as many messages as stand
        for :data:`WORKER_PREFETCH_AHEAD` seconds of its calls (their moving mean),
        between the default and :data:`WORKER_PREFETCH_MAX_PER_HANDLER` per handler."""
        self._outcomes = 0
        lane, slots = self._lane, self._slots
        assert lane is not None
        assert slots is not None
        mean = lane.mean_call
        if mean is None:
            return
        concurrency = self.concurrency
        most = WORKER_PREFETCH_MAX_PER_HANDLER * concurrency
        ahead = most if mean <= 0 else int(concurrency * WORKER_PREFETCH_AHEAD / mean)
        prefetch = max(self.prefetch, min(most, ahead))
        if prefetch != slots.total - concurrency:  # the prefetch now
            slots.resize(concurrency + prefetch, batch=prefetch // 2)
            lane.batch = prefetch // 2

    def _acked(self, held: _Held, outcome: AckOutcome) -> None:
        queue, msg = held.queue, held.msg
        metrics = self.metrics
        if metrics is not None:  # its run and its outcome at once (no journal here)
            said = "succeeded" if outcome is True else "lease_lost" if outcome is False else None
            metrics.ended(
                queue.name, held.call.label, said or "unsettled", msg.due_at, held.started,
                took=held.took,
            )  # fmt: skip
        if outcome is True:
            self.counts["succeeded"] += 1
            if _log_enabled(_INFO):  # the fields cost more than the line when it is off
                log_event(
                    _INFO, "job.succeeded", queue=queue.name, id=msg.id, task=held.call.label,
                    attempt=msg.attempts, seconds=round(time.monotonic() - held.started, 6),
                    **run_ids(msg, held.call.fn),
                )  # fmt: skip
        elif outcome is False:
            self.counts["lease_lost"] += 1
            log_event(_WARNING, "job.lease_lost", queue=queue.name, id=msg.id, at="ack",
                      **run_ids(msg, held.call.fn))  # fmt: skip
        elif outcome is not None:  # the ack failed: the lease runs out, it comes back
            _ack_failed(queue, msg, outcome)
        self._settle(held)

    async def _fast_failed(self, held: _Held, exc: BaseException, seconds: float) -> None:
        try:
            await self._failed(held.queue, held.msg, held.call, exc, seconds)
        finally:
            self._settle(held)

    async def _fast_give_back(self, held: _Held) -> None:
        try:
            await self._give_back(held.queue, held.msg)
        finally:
            self._settle(held)

    def _fast_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._fast_tasks.add(task)
        task.add_done_callback(self._fast_tasks.discard)

    def _settle(self, held: _Held) -> None:
        if held.settled:
            return
        held.settled = True
        held.renew_at = math.inf
        self._held.pop(held, None)
        # Its slot goes back with those of the batch it was acked in, at the loop's
        # next turn: one look at whether to claim more per batch, not per message.
        if not self._freed:
            asyncio.get_running_loop().call_soon(self._give_freed)
        self._freed += 1
        if not self._held and self._held_empty is not None:
            self._held_empty.set()

    def _give_freed(self) -> None:
        freed, self._freed = self._freed, 0
        assert self._slots is not None
        self._slots.give(freed)

    async def _renew_held(self) -> None:
        """Renew the leases of the fast path's messages, each every third of the lease
        from its reservation until its handler ended (the jobs renew their own)."""
        loop = asyncio.get_running_loop()
        every = self.lease / WORKER_EXTEND_DIVISOR
        while True:
            await asyncio.sleep(every / 4)
            if self._lane is not None:
                self._lane.deliver()  # outcomes a busy lane held for a batch
            now = loop.time()
            due = [held for held in self._held if held.renew_at <= now]
            if due:
                await asyncio.gather(*(self._renew(held, every) for held in due))

    async def _renew(self, held: _Held, every: float) -> None:
        held.renew_at = math.inf  # none again while this one is in flight
        again = await extend_lease(held.queue, held.msg, self.counts, self.lease, "job")
        if again and not held.busy and not held.settled:
            held.renew_at = asyncio.get_running_loop().time() + every

    # -- one message ------------------------------------------------------------------
    async def _job(self, queue: AsyncQueue, msg: Message) -> None:
        log_event(_DEBUG, "job.reserved", queue=queue.name, id=msg.id, attempt=msg.attempts)
        _current.set(msg)  # this job's own context (create_task copied it)
        gate = self._gate
        assert gate is not None
        every = self.lease / WORKER_EXTEND_DIVISOR
        renewer = LeaseRenewer(
            queue, msg, self.counts, lease=self.lease, first=every, every=every, event_prefix="job"
        )
        started = time.monotonic()
        call: _Call | None = None
        try:
            if not await gate.enter():  # stopping before it ran: give it back
                renewer.stop()
                await self._give_back(queue, msg)
                return
            started = time.monotonic()
            invoked = False
            try:
                call = self._resolve(msg)
                if call.cron is not None and not await self._start_tick(queue, msg, call):
                    await queue.ack(msg)
                    return
                invoked = True
                await self._invoke(call)
            finally:
                gate.leave()
                if invoked and self.metrics is not None and call is not None:
                    took = time.monotonic() - started
                    self.metrics.ran(queue.name, call.label, msg.due_at, started, took)
            if call.tick_ms is not None:
                await _cron_ack_guard(self._clock, call.tick_ms)
        except NotStarted:  # stopping before a lane thread took it
            renewer.stop()
            await self._give_back(queue, msg)
            return
        except asyncio.CancelledError:
            if not self._releasing:
                raise
            renewer.stop()
            await self._give_back(queue, msg)
            return
        except BaseException as exc:
            renewer.stop()
            await self._failed(queue, msg, call, exc, time.monotonic() - started)
            return
        finally:
            renewer.stop()
        try:
            acked = await self._ackers[queue.name].ack(msg)
        except Exception as exc:  # as on the fast path (:meth:`_acked`)
            self._note(msg, call, "unsettled", exc)
            _ack_failed(queue, msg, exc)
            return
        if not acked:
            self.counts["lease_lost"] += 1
            self._note(msg, call, "lease_lost", None)
            log_event(_WARNING, "job.lease_lost", queue=queue.name, id=msg.id, at="ack",
                      **run_ids(msg, call.fn if call else None))  # fmt: skip
            return
        self.counts["succeeded"] += 1
        self._note(msg, call, "succeeded", None)
        if _log_enabled(_INFO):  # as on the fast path: no fields for a line not logged
            log_event(
                _INFO,
                "job.succeeded",
                queue=queue.name,
                id=msg.id,
                task=call.label if call else None,
                attempt=msg.attempts,
                seconds=round(time.monotonic() - started, 6),
                **run_ids(msg, call.fn if call else None),
            )

    def _resolve(self, msg: Message) -> _Call:
        """What to run for ``msg``, in its ``process`` span when tracing
        (:mod:`delayq.durable.tracing`); :class:`UnknownTask` and
        :class:`BadArguments` send it to dead."""
        call = self._call_of(msg)
        call.fn = traced(call.fn, call.is_async, msg, call.label if self._app else None)
        return call

    def _call_of(self, msg: Message) -> _Call:
        if self._app is None:
            assert self._handler is not None
            assert self._queue is not None
            return _Call(
                self._handler, (msg,), {}, self._handler_is_async, self._handler_label,
                self.timeout, self._queue.retry,
            )  # fmt: skip
        name, arguments, kwargs = decode_envelope(msg.payload)
        task = self._app.tasks.get(name)
        if task is None:
            known = ", ".join(sorted(self._app.tasks)) or "none"
            raise UnknownTask(
                f"unknown task {name!r}: this app has no task of that name (known: {known})"
            )
        args = tuple(arguments)
        task.check_arguments(args, kwargs)
        timeout = task.timeout if task.timeout is not None else self.timeout
        call = _Call(
            task.fn, args, kwargs, task.is_async, name, timeout, task.backoff, None, None,
            task.max_attempts,
        )  # fmt: skip
        crons = self._app.crons
        if crons and name in crons:
            tick = msg.headers.get(CRON_TICK_HEADER)
            if tick is not None and tick.isdigit():
                call.cron, call.tick_ms = crons[name], int(tick)
        return call

    async def _start_tick(self, queue: AsyncQueue, msg: Message, call: _Call) -> bool:
        """Put the next tick (the chain) and decide whether this one runs."""
        assert call.cron is not None
        assert call.tick_ms is not None
        job, tick = call.cron, call.tick_ms
        plan = plan_tick(
            job.schedule,
            tick_ms=tick,
            due_at=msg.due_at,
            attempts=msg.attempts,
            now_ms=int(self._clock.time() * 1000.0),
            catch_up=job.catch_up,
        )
        await queue.put(**job.tick_item(plan.next_tick))
        if not plan.run:
            self.counts["skipped"] += 1
            self._note(msg, call, "skipped", None)
            log_event(_INFO, "cron.skipped", task=job.task.name, id=msg.id, reason=plan.reason)
            call.tick_ms = None
            return False
        log_event(
            _INFO, "cron.tick", task=job.task.name, id=msg.id, run=plan.reason,
            next=tick_id(job.task.name, plan.next_tick),
        )  # fmt: skip
        return True

    async def _invoke(self, call: _Call) -> None:
        if self._lane is not None and not call.is_async:
            context = contextvars.copy_context()
            partial = functools.partial(context.run, call.fn, *call.args, **call.kwargs)
            try:
                await self._lane.run(partial, call.timeout)
            except RunTimedOut:
                raise HandlerTimeout(f"timed out after {call.timeout:g}s") from None
            return
        if call.is_async:
            awaitable = call.fn(*call.args, **call.kwargs)
        else:
            loop = asyncio.get_running_loop()
            partial = functools.partial(call.fn, *call.args, **call.kwargs)
            context = contextvars.copy_context()
            awaitable = loop.run_in_executor(self._pool, context.run, partial)
        if call.timeout is None:
            await awaitable
            return
        try:
            await within(awaitable, call.timeout)
        except asyncio.TimeoutError:
            raise HandlerTimeout(f"timed out after {call.timeout:g}s") from None

    async def _failed(
        self,
        queue: AsyncQueue,
        msg: Message,
        call: _Call | None,
        exc: BaseException,
        seconds: float,
    ) -> None:
        label = call.label if call else None
        fields: dict[str, object] = {"queue": queue.name, "id": msg.id, "task": label}
        try:
            # BadArguments from the task's own body (a send of another task) is a
            # failure like any other: only the message's own arguments are dead at once.
            if isinstance(exc, (Discard, UnknownTask)) or (
                call is None and isinstance(exc, BadArguments)
            ):
                reason = exc.reason if isinstance(exc, Discard) else str(exc)
                error = f"{type(exc).__name__}: {reason}"
                state = await queue.nack(msg, error=error, dead=True)
                event = "job.discarded"
            elif isinstance(exc, Retry):
                error = f"Retry: {exc.reason}"
                if msg.attempts >= _max_attempts(msg, call):  # the task's, as a failure's
                    state = await queue.nack(msg, error=error, dead=True)
                else:
                    state = await queue.nack(msg, delay=exc.delay, error=error)
                event = "job.retry_requested"
            else:
                policy = call.retry if call else queue.retry
                delay = policy.backoff(max(msg.attempts, 1))
                # A timeout's traceback is the worker's own: its message says it all.
                raised = f"HandlerTimeout: {exc}" if isinstance(exc, HandlerTimeout) else exc
                if msg.attempts >= _max_attempts(msg, call):  # the task's, whatever the face
                    state = await queue.nack(msg, error=raised, dead=True)
                else:
                    state = await queue.nack(msg, delay=delay, error=raised)
                event = "job.failed"
                fields["retry_in"] = round(delay, 3) if state is State.SCHEDULED else None
        except LeaseLost:
            self.counts["lease_lost"] += 1
            self._note(msg, call, "lease_lost", exc)
            fields.update(run_ids(msg, call.fn if call else None))
            log_event(_WARNING, "job.lease_lost", at="nack", error=repr(exc), **fields)
            return
        except Exception as failed:  # the backend did not answer, or the queue closed
            self._note(msg, call, "unsettled", exc)
            fields.update(run_ids(msg, call.fn if call else None))
            log_event(_WARNING, "job.unsettled", error=repr(exc), nack_error=repr(failed), **fields)
            return
        outcome = "dead" if state is State.DEAD else "retried"
        self.counts[outcome] += 1
        self._note(msg, call, outcome, exc, _counted(event, state, exc))
        level = _ERROR if state is State.DEAD else _WARNING
        fields.update(
            state=state.value,
            attempt=msg.attempts,
            max_attempts=_max_attempts(msg, call),
            seconds=round(seconds, 6),
            error=f"{type(exc).__name__}: {exc}",
            **run_ids(msg, call.fn if call else None),
        )
        if event == "job.failed" and not isinstance(exc, HandlerTimeout):
            # The traceback from the handler's first frame (delayq's call of it left
            # out, as every face shows a stored one): where it was raised.
            log_raised(level, event, exc, user_frames(exc.__traceback__), **fields)
        else:
            log_event(level, event, **fields)

    async def _give_back(self, queue: AsyncQueue, msg: Message) -> None:
        try:
            await queue.release(msg)
        except Exception as exc:  # lease lost, queue closed, or no answer: it comes back
            log_event(_WARNING, "job.release_failed", queue=queue.name, id=msg.id, error=repr(exc))
            return
        self.counts["released"] += 1
        log_event(_INFO, "job.released", queue=queue.name, id=msg.id, attempt=msg.attempts)

    # -- cron producers ---------------------------------------------------------------
    async def _produce(self, job: CronJob) -> None:
        """Put the next tick, about one period ahead; again after each tick."""
        queue = self._queues[job.task.queue]
        outage = self._outage
        assert outage is not None
        while True:
            now_ms = int(self._clock.time() * 1000.0)
            tick = job.schedule.next_after(now_ms)
            try:
                await queue.put(**job.tick_item(tick))
                log_event(
                    _DEBUG, "cron.produced", task=job.task.name, id=tick_id(job.task.name, tick)
                )
            except QueueClosed:
                return
            except Exception as exc:
                failed = "cron.put_failed"
                await asyncio.sleep(outage.failed(exc, failed_event=failed, task=job.task.name))
                continue
            outage.answered()
            seconds = (tick - now_ms) / 1000.0
            await asyncio.sleep(min(max(seconds, 0.001), CRON_PRODUCER_MAX_SLEEP))

    def __repr__(self) -> str:
        return f"<Worker queues={self._queue_names} concurrency={self.concurrency}>"


class HandlerTimeout(TimeoutError):
    """A handler ran past its timeout: a failure like any other (the message is
    nacked with its backoff). A sync handler's thread cannot be stopped and runs on."""


def _counted(event: str, state: State, exc: BaseException) -> str:
    """The outcome :attr:`Worker.metrics` counts for a run that raised ``exc`` and left
    its message in ``state``, after the log ``event`` of :meth:`Worker._failed`."""
    if event == "job.discarded":
        return "discarded"
    if state is State.DEAD:
        return "dead"
    if event == "job.retry_requested":
        return "retried"
    return "timeout" if isinstance(exc, HandlerTimeout) else "failed"


def _max_attempts(msg: Message, call: _Call | None) -> int:
    """The attempts ``msg`` has: its own, capped by its task's (a message put by a face
    that did not say them, the HTTP API's, has the queue's default)."""
    if call is None or call.max_attempts is None:
        return msg.max_attempts
    return min(msg.max_attempts, call.max_attempts)


def _ack_failed(queue: AsyncQueue, msg: Message, exc: Exception) -> None:
    """Log an ack that failed (the backend did not answer, or the queue closed): its
    handler ran, but the message comes back once its lease runs out and runs again."""
    log_event(_ERROR, "job.ack_failed", queue=queue.name, id=msg.id, error=repr(exc))


async def _cron_ack_guard(clock: Clock, tick_ms: int) -> None:
    """Hold the ack of a run until 2 ms past its tick (see :mod:`delayq.runtime._cron`)."""
    wait = tick_ms / 1000.0 + CRON_ACK_GUARD - clock.time()
    if wait > 0:
        await asyncio.sleep(min(wait, CRON_ACK_GUARD))


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def _positive(name: str, value: object, *, zero: bool = False) -> float:
    seconds = delay_to_seconds(value, name)
    if not (seconds >= 0 if zero else seconds > 0) or math.isinf(seconds):
        raise ValueError(f"{name} must be seconds {'>= 0' if zero else '> 0'}, got {value!r}")
    return seconds


def _other_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is not loop
    except RuntimeError:
        return True
