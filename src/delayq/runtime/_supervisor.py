"""Supervisor: N worker processes, each with its own event loop and connections.

``Supervisor(make_worker, processes=N).run()`` starts N children and keeps N running
until it is stopped. Each child calls ``make_worker()`` and serves the
:class:`~delayq.Worker` it returns until told to stop; so ``make_worker`` must be
picklable (a function of an importable module, or a ``functools.partial`` of one),
as any target of :mod:`multiprocessing`.

Start method: ``spawn``. Each child is a fresh interpreter that imports what it
needs and opens its own connections; nothing is inherited from the supervisor. A
fork would copy whatever the parent holds (a redis-py pool, a SQLite connection, the
locks of threads that do not exist in the child), and the supervisor has imported
the app and checked the backend before it starts anyone. The price is the start-up
of an interpreter per child (a fraction of a second), paid at start and per restart.

Signals. The first SIGTERM or SIGINT of the supervisor becomes a graceful stop of
every child: each stops reserving, lets its running handlers finish for its
``grace``, gives the rest back and exits. A second signal makes every child give back
at once (as a second signal does to a lone ``Worker.run()``). The supervisor tells a
child its stop level (1: graceful, 2: now) as a byte on a pipe of its own, not as
signals: two SIGTERMs sent in quick succession to a process that is not running at
that moment are merged by the kernel into one (a standard signal is pending once),
so a second stop could be lost and a child would wait out its grace. A child that
has not said it is ready yet gets a SIGTERM as well, which ends a start-up that
hangs. A SIGTERM sent to a child directly (a service manager signalling the whole
group) still stops it: gracefully, and at once on a second; the level is the higher
of the two. Children ignore SIGINT: a Ctrl-C in a terminal reaches the whole process
group, and the supervisor alone decides what it means (SIGINT is blocked while a
child is spawned, so not even its start-up sees one). A child whose supervisor died
(kill -9) stops gracefully by itself: it watches the pipe that :mod:`multiprocessing`
keeps open to its parent.

Restarts. A child that exits while the supervisor is not stopping (killed, crashed)
is started again, after a pause that doubles with every death in a row of a child of
that slot that lived less than ``SUPERVISOR_STABLE`` seconds (from
``SUPERVISOR_RESTART_FIRST`` up to ``SUPERVISOR_RESTART_MAX``), so a child that
crashes at start-up does not spin. A child that dies before it is ready (its
``make_worker()`` raised or exited) while no child has ever been ready means the
workers cannot start at all: the supervisor stops the others and :meth:`run`
returns non-zero; unless a stop signal from outside ended it (SIGTERM, SIGINT,
SIGHUP, SIGKILL): that is a death like any other, and a SIGTERM to the whole group
while the children import is a stop, exit status 0. Every start, death and restart
is a log line on the ``delayq`` logger.

Health. With ``health`` (a listening socket), a thread of the supervisor answers
``/healthz`` and ``/readyz`` for all its children: each child's loop beats every
``SUPERVISOR_HEALTH_BEAT`` seconds into shared memory, with its Worker's
:meth:`~delayq.Worker.not_ready` reason. Ready when every slot has a child that
said ready and whose Worker is ready; not alive when a ready child's loop has not
beaten for ``SUPERVISOR_HEALTH_STALE`` seconds (it is stuck, and the supervisor does
not restart a child that still runs).

Metrics. With ``metrics`` (a listening socket, or the health one), the same thread
answers ``/metrics`` for all its children, their counts added up: each child sends
its Worker's :meth:`~delayq.runtime._metrics.WorkerMetrics.snapshot` on a pipe of its
own every ``METRICS_PUSH_EVERY`` seconds and once more as it stops, and the
supervisor keeps the last one of each (so a page lags the children by that much at
most). A child that dies leaves its counts in the total (a restarted one starts from
0, the counters never go back), less what it counted since its last report when it
was killed. Children report rather than share files (prometheus-client's
multiprocess mode): their counting stays the Worker's plain, lock-free one, nothing
is left on disk, and a dead child's gauges are simply gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from .._log import log_event
from ._health import start_health
from ._metrics import Snapshot, WorkerMetrics, merge, render
from ._worker import Worker
from .constants import (
    METRICS_PUSH_EVERY,
    SUPERVISOR_HEALTH_BEAT,
    SUPERVISOR_HEALTH_STALE,
    SUPERVISOR_RESTART_FIRST,
    SUPERVISOR_RESTART_MAX,
    SUPERVISOR_STABLE,
)

__all__ = ["Supervisor"]

_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: A child ended by one of these was stopped from outside (a service manager, an
#: operator, the OOM killer), which says nothing of whether it can start: it is a
#: death (restarted after its pause), never a failed start.
_STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL})
_READY = b"ready"

#: Exit status of :meth:`Supervisor.run` when the children could not start.
START_FAILED = 1

#: What a child's beat says, by index: its Worker's ``not_ready()`` reason.
_STATES: tuple[str | None, ...] = (None, "starting", "backend_unavailable", "draining")


class _Beat:
    """A child's beat in shared memory: when its loop last turned (``time.monotonic``,
    0: not yet) and the index of its state in ``_STATES``."""

    __slots__ = ("at", "state")

    def __init__(self, context: Any) -> None:
        self.at: Synchronized[float] = context.Value("d", 0.0, lock=False)
        self.state: Synchronized[int] = context.Value("b", 1, lock=False)


class _Child:
    """One running child: its process, the pipe it says "ready" on (None once read),
    the pipe it is told its stop level on, when it started."""

    __slots__ = ("metrics_pipe", "pid", "process", "ready", "ready_pipe", "started", "stop_pipe")

    def __init__(
        self,
        process: BaseProcess,
        ready_pipe: Connection,
        stop_pipe: Connection,
        metrics_pipe: Connection | None,
    ) -> None:
        self.process = process
        self.pid = process.pid
        self.ready_pipe: Connection | None = ready_pipe
        self.stop_pipe = stop_pipe
        self.metrics_pipe = metrics_pipe
        self.ready = False
        self.started = time.monotonic()

    def tell_stop(self, level: int) -> None:
        """Send the stop ``level``; a child still starting gets a SIGTERM as well."""
        with contextlib.suppress(OSError):  # it is gone: its sentinel says so
            self.stop_pipe.send_bytes(bytes([level]))
        if not self.ready and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)


class Supervisor:
    """Runs ``processes`` worker processes, each serving ``make_worker()``.

    ``make_worker`` is called in each child (and again in a restarted one) and must
    return a :class:`~delayq.Worker`; it must be picklable, as for
    :mod:`multiprocessing` with the ``spawn`` start method. Call :meth:`run` in the
    main thread (there it handles SIGTERM/SIGINT; elsewhere only :meth:`stop` ends it).
    """

    def __init__(
        self,
        make_worker: Callable[[], Worker],
        *,
        processes: int,
        health: socket.socket | None = None,
        metrics: socket.socket | None = None,
    ) -> None:
        if not callable(make_worker):
            raise TypeError(
                f"make_worker must be a function that returns a Worker, "
                f"not {type(make_worker).__name__}"
            )
        if type(processes) is not int or processes < 1:
            raise ValueError(f"processes must be an int >= 1, got {processes!r}")
        self.make_worker = make_worker
        self.processes = processes
        self._context = multiprocessing.get_context("spawn")
        self._children: list[_Child | None] = [None] * processes
        self._restart_at: list[float | None] = [None] * processes
        self._quick_deaths = [0] * processes
        # Stop requests (signal name or None, graceful), from signal handlers and any
        # thread: a SimpleQueue's put is safe in both. The loop turns them into levels.
        self._requests: queue.SimpleQueue[tuple[str | None, bool]] = queue.SimpleQueue()
        self._stop_level = 0  # 1: a graceful stop was sent to the children, 2: stop now
        self._signals = 0
        self._ever_ready = False
        self._failed: int | None = None
        self._wake_r = self._wake_w = -1  # the self-pipe, while run() runs
        self._health = health
        self._beats = [_Beat(self._context) for _ in range(processes)] if health else None
        self._metrics = metrics
        # The last report of each slot's child, and what the children gone counted.
        self._reports: list[Snapshot | None] = [None] * processes
        self._gone: Snapshot = merge([])
        self._reports_lock = threading.Lock()

    # -- stopping ---------------------------------------------------------------------
    def stop(self, *, graceful: bool = True) -> None:
        """Stop every child: gracefully the first time (each lets its handlers finish
        within its ``grace``), at once the second time or when not ``graceful``.
        Safe from any thread; before :meth:`run`, it then returns at once."""
        self._requests.put((None, graceful))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed
            os.write(self._wake_w, b"\0")

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only what is safe in a handler: the loop logs and acts.
        self._signals += 1
        self._requests.put((_signal_name(signum), self._signals == 1))
        self._wake()

    @property
    def _stopping(self) -> bool:
        return self._stop_level > 0

    # -- running ----------------------------------------------------------------------
    def not_ready(self) -> str | None:
        """Why the children are not all ready (``draining``, ``starting``,
        ``backend_unavailable``), or None."""
        if self._stopping:
            return "draining"
        reasons = []
        for slot, child in enumerate(list(self._children)):
            if child is None or not child.ready or self._beats is None:
                reasons.append("starting")
            else:
                reasons.append(_STATES[self._beats[slot].state.value] or "")
        found = [reason for reason in reasons if reason]
        return max(found, key=_STATES.index) if found else None

    def not_alive(self) -> str | None:
        """``stuck`` when a ready child's loop has not beaten for a while, else None."""
        now = time.monotonic()
        for slot, child in enumerate(list(self._children)):
            if child is not None and child.ready and self._beats is not None:
                at = self._beats[slot].at.value
                if at and now - at > SUPERVISOR_HEALTH_STALE:
                    return "stuck"
        return None

    def run(self) -> int:
        """Start the children, keep them running until a stop, wait for all to exit.

        Returns 0 once every child has stopped after a stop, :data:`START_FAILED` (or
        the failed child's own positive exit status) when children could not start.
        """
        installed: dict[int, Any] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                installed[signum] = signal.signal(signum, self._on_signal)
        log_event(_INFO, "supervisor.started", processes=self.processes, pid=os.getpid())
        serving = self._health is not None or self._metrics is not None
        health = _HealthThread(self, self._health, self._metrics) if serving else None
        try:
            self._take_requests()
            if not self._stopping:
                for slot in range(self.processes):
                    self._start(slot)
            self._loop()
        finally:
            for number, previous in installed.items():
                signal.signal(number, previous)
            for child in self._children:  # only after an error of the supervisor itself
                if child is not None and child.process.is_alive():
                    child.process.kill()
                    child.process.join()
            if health is not None:
                health.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        status = 0 if self._failed is None else self._failed
        log_event(_INFO, "supervisor.stopped", exitcode=status)
        return status

    def _loop(self) -> None:
        while True:
            self._take_requests()
            children = [child for child in self._children if child is not None]
            if self._stopping and not children:
                return
            now = time.monotonic()
            for slot, when in enumerate(self._restart_at):
                if when is not None and when <= now and not self._stopping:
                    self._restart_at[slot] = None
                    self._start(slot)
            pending = [when for when in self._restart_at if when is not None]
            timeout = None
            if pending and not self._stopping:
                timeout = max(0.0, min(pending) - time.monotonic())
            watched: list[Any] = [self._wake_r]
            for child in self._children:
                if child is not None:
                    watched.append(child.process.sentinel)
                    if child.ready_pipe is not None:
                        watched.append(child.ready_pipe)
                    if child.metrics_pipe is not None:
                        watched.append(child.metrics_pipe)
            ready = wait(watched, timeout)
            if self._wake_r in ready:
                os.read(self._wake_r, 512)
            # A stop that arrived with the exits it caused (a SIGTERM to the whole
            # process group) is taken first: those children were stopped, not failed.
            self._take_requests()
            for slot, child in enumerate(self._children):
                if child is None:
                    continue
                if child.ready_pipe is not None and child.ready_pipe in ready:
                    self._on_ready(child)
                pipe = child.metrics_pipe
                if pipe is not None and pipe in ready and not self._on_report(slot, pipe):
                    pipe.close()  # it stopped reporting: not watched again
                    child.metrics_pipe = None
                if child.process.sentinel in ready:
                    self._on_exit(slot, child)

    def _take_requests(self) -> None:
        """Turn the stop requests into levels, one SIGTERM to every child per level."""
        while not self._requests.empty():
            name, graceful = self._requests.get()
            level = min(2, max(self._stop_level + 1, 1 if graceful else 2))
            if name is not None:
                log_event(_INFO, "supervisor.signal", signal=name, graceful=level == 1)
            while self._stop_level < level:
                self._stop_level += 1
                log_event(
                    _INFO,
                    "supervisor.stopping",
                    graceful=self._stop_level == 1,
                    children=sum(child is not None for child in self._children),
                )
                for child in self._children:
                    if child is not None:
                        child.tell_stop(self._stop_level)

    def _start(self, slot: int) -> None:
        ready_r, ready_w = self._context.Pipe(duplex=False)
        stop_r, stop_w = self._context.Pipe(duplex=False)
        beat = None if self._beats is None else self._beats[slot]
        if beat is not None:
            beat.at.value, beat.state.value = 0.0, 1
        metrics_r = metrics_w = None
        if self._metrics is not None:
            metrics_r, metrics_w = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=_child_main,
            args=(self.make_worker, ready_w, stop_r, beat, metrics_w),
            name=f"delayq-worker-{slot}",
        )
        # The child starts with SIGINT blocked (the mask survives exec) until it has
        # set SIGINT aside: a Ctrl-C meant for the supervisor never interrupts it. The
        # resource tracker is started first: starting it unblocks SIGINT.
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        ready_w.close()
        stop_r.close()
        if metrics_w is not None:
            metrics_w.close()
        self._children[slot] = _Child(process, ready_r, stop_w, metrics_r)
        log_event(_INFO, "supervisor.child_started", slot=slot, pid=process.pid)

    def _on_ready(self, child: _Child) -> None:
        pipe = child.ready_pipe
        assert pipe is not None
        try:
            child.ready = pipe.recv_bytes() == _READY
        except (EOFError, OSError):  # it closed the pipe unready: its exit comes next
            child.ready = False
        pipe.close()
        child.ready_pipe = None
        self._ever_ready = self._ever_ready or child.ready

    def _on_report(self, slot: int, pipe: Connection) -> bool:
        """Take the reports the child of ``slot`` sent on ``pipe``, keep the last:
        whether the pipe is still open."""
        last = None
        try:
            while pipe.poll():
                last = pipe.recv_bytes()
        except (EOFError, OSError):  # it stopped: its exit comes next
            return False
        finally:
            if last is not None:
                report = json.loads(last)
                with self._reports_lock:
                    self._reports[slot] = report
        return True

    def _retire_report(self, slot: int, child: _Child) -> None:
        """A child exited: its last report joins the counts of the children gone."""
        pipe = child.metrics_pipe
        if pipe is not None:
            self._on_report(slot, pipe)
            pipe.close()
            child.metrics_pipe = None
        with self._reports_lock:
            report, self._reports[slot] = self._reports[slot], None
            if report is not None:
                self._gone = merge([self._gone, report], gauges=False)

    def render_metrics(self) -> bytes:
        """The ``/metrics`` page: the children's counts added up, those of the
        children gone included, and their gauges as last reported."""
        with self._reports_lock:
            reports = [self._gone, *(r for r in self._reports if r is not None)]
            return render(merge(reports))

    def _on_exit(self, slot: int, child: _Child) -> None:
        process = child.process
        process.join()
        code = process.exitcode
        self._retire_report(slot, child)
        if child.ready_pipe is not None:
            if child.ready_pipe.poll():  # said ready, then died at once
                self._on_ready(child)
            else:
                child.ready_pipe.close()
                child.ready_pipe = None
        process.close()
        child.stop_pipe.close()
        self._children[slot] = None
        lived = time.monotonic() - child.started
        fields: dict[str, Any] = {"slot": slot, "pid": child.pid, "exitcode": code}
        if code is not None and code < 0:
            fields["signal"] = _signal_name(-code)
        if self._stopping or self._failed is not None:
            log_event(_INFO if code == 0 else _WARNING, "supervisor.child_stopped", **fields)
            return
        if not child.ready and not self._ever_ready and -(code or 0) not in _STOP_SIGNALS:
            log_event(_ERROR, "supervisor.start_failed", **fields)
            self._failed = code if code is not None and code > 0 else START_FAILED
            self.stop(graceful=True)
            return
        deaths = self._quick_deaths[slot] + 1 if lived < SUPERVISOR_STABLE else 1
        self._quick_deaths[slot] = deaths
        pause = min(SUPERVISOR_RESTART_MAX, SUPERVISOR_RESTART_FIRST * 2 ** (deaths - 1))
        self._restart_at[slot] = time.monotonic() + pause
        log_event(
            _WARNING,
            "supervisor.child_died",
            **fields,
            lived=round(lived, 3),
            ready=child.ready,
            restart_in=pause,
        )

    def __repr__(self) -> str:
        running = sum(child is not None for child in self._children)
        return f"<Supervisor processes={self.processes} running={running}>"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


# -- the child ------------------------------------------------------------------------


class _HealthThread:
    """The supervisor's ``/healthz`` and ``/readyz``, answered by an event loop of
    their own in a daemon thread (the supervisor's own loop blocks in ``wait``)."""

    def __init__(
        self, supervisor: Supervisor, sock: socket.socket | None, metrics: socket.socket | None
    ) -> None:
        self._loop = asyncio.new_event_loop()
        render = None if metrics is None else supervisor.render_metrics
        self._servers: list[asyncio.Server] = []
        if sock is not None:
            both = render if metrics is sock else None
            self._servers.append(
                self._loop.run_until_complete(
                    start_health(sock, supervisor.not_ready, supervisor.not_alive, metrics=both)
                )
            )
        if metrics is not None and metrics is not sock:
            self._servers.append(
                self._loop.run_until_complete(start_health(metrics, None, metrics=render))
            )
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="delayq-health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        for server in self._servers:
            server.close()
            self._loop.run_until_complete(server.wait_closed())
        self._loop.close()


def _child_main(
    make_worker: Callable[[], Worker],
    ready: Connection,
    stop: Connection,
    beat: _Beat | None,
    metrics: Connection | None,
) -> None:
    """A child's whole life: build the worker, say ready, serve until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    worker = make_worker()
    if not isinstance(worker, Worker):
        raise TypeError(f"make_worker() must return a Worker, not {type(worker).__name__}")
    if metrics is not None and worker.metrics is None:
        worker.metrics = WorkerMetrics()
    asyncio.run(_serve(worker, ready, stop, beat, metrics))


def _report(worker: Worker, pipe: Connection) -> None:
    """Send the supervisor the worker's counts (a full pipe waits: it reads at once)."""
    assert worker.metrics is not None
    with contextlib.suppress(OSError):  # the supervisor is gone
        pipe.send_bytes(json.dumps(worker.metrics.snapshot()).encode())


async def _reports(worker: Worker, pipe: Connection) -> None:
    """Report the worker's counts every ``METRICS_PUSH_EVERY`` seconds."""
    while True:
        await asyncio.sleep(METRICS_PUSH_EVERY)
        _report(worker, pipe)


async def _beat(worker: Worker, beat: _Beat) -> None:
    """Tell the supervisor, every beat, that the loop turns and how the Worker is."""
    while True:
        beat.state.value = _STATES.index(worker.not_ready())
        beat.at.value = time.monotonic()
        await asyncio.sleep(SUPERVISOR_HEALTH_BEAT)


async def _serve(
    worker: Worker,
    ready: Connection,
    stop: Connection,
    beat: _Beat | None,
    metrics: Connection | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    signals = 0  # SIGTERMs sent to this child directly
    told = 0  # the highest stop level the supervisor sent
    level = 0

    def raise_level(wanted: int, event: str, **fields: str) -> None:
        nonlocal level
        if wanted > level:
            level = min(wanted, 2)
            log_event(_INFO, event, **fields, graceful=level == 1)
            worker.stop(graceful=level == 1)

    def on_sigterm() -> None:
        nonlocal signals
        signals += 1
        raise_level(max(signals, told), "worker.signal", signal="SIGTERM")

    def on_stop_level() -> None:
        nonlocal told
        try:
            while stop.poll():
                told = max(told, *stop.recv_bytes())
        except (EOFError, OSError):  # the supervisor is gone: on_parent_gone stops us
            loop.remove_reader(stop.fileno())
        raise_level(max(signals, told), "worker.stop_told")

    def on_parent_gone(sentinel: int) -> None:
        loop.remove_reader(sentinel)
        log_event(_WARNING, "worker.supervisor_gone", pid=os.getpid())
        worker.stop(graceful=True)

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_reader(stop.fileno(), on_stop_level)
    parent = multiprocessing.parent_process()
    parent_sentinel = parent.sentinel if parent is not None else None
    if parent_sentinel is not None:
        loop.add_reader(parent_sentinel, on_parent_gone, parent_sentinel)
    ready.send_bytes(_READY)
    ready.close()
    beating = None if beat is None else asyncio.create_task(_beat(worker, beat))
    reporting = None if metrics is None else asyncio.create_task(_reports(worker, metrics))
    try:
        await worker.serve()
    finally:
        if beating is not None:
            beating.cancel()
        if reporting is not None:
            reporting.cancel()
        if metrics is not None:
            _report(worker, metrics)  # the last counts, the in-flight ones settled
            metrics.close()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_reader(stop.fileno())
        stop.close()
        if parent_sentinel is not None:
            loop.remove_reader(parent_sentinel)
