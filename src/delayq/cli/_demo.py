"""The order-timeout scenarios behind ``delayq demo``.

Every order gets a "cancel it if unpaid" timeout at the end of its payment window;
about 30% of the orders (:data:`PAID_SHARE`) are paid in time, which cancels their
timeout; every firing is printed with its lateness, and a summary line ends the run.

* :func:`run_durable` (the default engine) puts the timeouts on a durable
  :class:`~delayq.Queue` with ``put_many``; a producer thread pays orders
  (``cancel``) and gives a few customers more time (``reschedule``) while a consumer
  thread reserves and acks what falls due.
* :func:`run_inproc` gives each order a timer on the in-process
  :class:`~delayq.Scheduler`.
"""

from __future__ import annotations

import math
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import click
from rich.console import Console
from rich.markup import escape

from ..durable.queue import Queue
from ..durable.registry import redact_url
from ..inproc.heap import HeapStore
from ..inproc.scheduler import Scheduler, Timer
from ..inproc.store import TimerStore
from ..inproc.wheel import WheelStore
from ._common import translate_errors

__all__ = ["PAID_SHARE", "RESCHEDULE_SHARE", "run_durable", "run_inproc"]

#: The share of orders that are paid before their payment window ends.
PAID_SHARE = 0.3
#: The share of unpaid orders whose customer asks for more time (durable engine).
RESCHEDULE_SHARE = 0.05
#: Seconds beyond the window after which the demo gives up waiting for an event.
GRACE_SECONDS = 30.0
#: How long (s) one ``reserve`` of the durable consumer waits at most, and so how
#: often it checks whether every order is settled.
CONSUMER_WAIT = 0.1
#: Messages one ``reserve`` of the durable consumer takes at most.
CONSUMER_BATCH = 50

# event kinds
_EXPIRED, _PAID, _PAID_LATE = "expired", "paid", "paid too late"
_MORE_TIME, _MORE_TIME_LATE, _DONE = "more time", "more time too late", "done"


@dataclass(frozen=True)
class _Order:
    """One order of the plan; times are seconds after the start of the run."""

    number: int
    deadline: float
    pay_at: float | None = None
    more_time: tuple[float, float] | None = None  # (asked at, new deadline)


def _plan(
    rng: random.Random, orders: int, window: float, reschedule_share: float = 0.0
) -> list[_Order]:
    """Deadlines within ``window``, which orders are paid and when, and (with a
    ``reschedule_share``) which unpaid orders get a later deadline, still within it."""
    plan = []
    for number in range(orders):
        deadline = rng.uniform(0.1, 1.0) * window
        pay_at = rng.uniform(0.1, 0.9) * deadline if rng.random() < PAID_SHARE else None
        more_time = None
        if pay_at is None and reschedule_share and rng.random() < reschedule_share:
            asked = rng.uniform(0.3, 0.8) * deadline
            more_time = (asked, deadline + rng.uniform(0.2, 1.0) * (window - deadline))
        plan.append(_Order(number, deadline, pay_at, more_time))
    return plan


def _order_id(order: int) -> str:
    return f"order-{order:04d}"


def _print_firing(console: Console, stamp: str, late_ms: float) -> None:
    style = "green" if late_ms < 1.0 else "yellow" if late_ms < 5.0 else "red"
    console.print(f"{stamp}  expired: order cancelled  [{style}]late {late_ms:6.2f} ms[/]")


def _percentile(sorted_values: list[float], percent: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(percent / 100.0 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


def _lateness_fields(lateness_ms: Sequence[float]) -> tuple[str, int]:
    """``p50=..ms p99=..ms max=..ms`` of the lateness values, and how many were early."""
    ms = sorted(lateness_ms)
    text = (
        f"p50={_percentile(ms, 50):.2f}ms p99={_percentile(ms, 99):.2f}ms "
        f"max={(ms[-1] if ms else 0.0):.2f}ms"
    )
    return text, sum(1 for late in ms if late < 0.0)


# -- in-process ---------------------------------------------------------------------------


@dataclass
class _Tally:
    """What the in-process demo saw: lateness of every firing (ms) and the counts."""

    lateness: list[float] = field(default_factory=list)
    cancelled: int = 0
    paid_too_late: int = 0


def run_inproc(console: Console, *, orders: int, window: float, seed: int, store: str) -> None:
    """The scenario on a :class:`~delayq.Scheduler` over a ``"heap"`` or ``"wheel"``
    store; exits with status 1 if a timer fired early or an order was not settled."""
    timer_store: TimerStore[Timer] = HeapStore() if store == "heap" else WheelStore()
    console.print(
        f"[bold]delayq demo[/]: {orders} orders, payment windows up to {window:g} s, "
        f"engine=inproc, store={store}, seed={seed}"
    )
    plan = _plan(random.Random(seed), orders, window)
    events: queue.SimpleQueue[tuple[str, int, float, float]] = queue.SimpleQueue()
    timers: dict[int, Timer] = {}
    scheduling = threading.Lock()  # held while the timers are created

    with Scheduler(store=timer_store) as scheduler:

        def expire(order: int) -> None:
            now = time.monotonic()
            with scheduling:
                deadline = timers[order].deadline
            events.put((_EXPIRED, order, now, (now - deadline) * 1000.0))

        def pay(order: int) -> None:
            paid = scheduler.cancel(_order_id(order))
            events.put((_PAID if paid else _PAID_LATE, order, time.monotonic(), 0.0))

        start = time.monotonic()
        payments = 0
        with scheduling:
            for order in plan:
                timers[order.number] = scheduler.call_later(
                    order.deadline, expire, order.number, id=_order_id(order.number)
                )
                if order.pay_at is not None:
                    scheduler.call_later(order.pay_at, pay, order.number)
                    payments += 1
        tally = _show_inproc(console, events, orders, payments, start=start, window=window)
    elapsed = time.monotonic() - start

    fired = len(tally.lateness)
    lateness, early = _lateness_fields(tally.lateness)
    console.print(
        f"fired={fired} cancelled={tally.cancelled} {lateness} "
        f"early={early} elapsed={elapsed:.2f}s",
        soft_wrap=True,
    )
    if early or fired + tally.cancelled != orders:
        raise SystemExit(1)


def _show_inproc(
    console: Console,
    events: queue.SimpleQueue[tuple[str, int, float, float]],
    orders: int,
    payments: int,
    *,
    start: float,
    window: float,
) -> _Tally:
    """Print what the callbacks report until every order is settled and every payment
    seen (times relative to ``start``); give up well after the window has passed."""
    tally = _Tally()
    deadline = start + window + GRACE_SECONDS
    settled = seen_payments = 0
    while settled < orders or seen_payments < payments:
        try:
            kind, order, at, late_ms = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise click.ClickException("timed out waiting for the scheduler") from None
        stamp = f"{at - start:7.3f}s  {_order_id(order)}"
        if kind == _EXPIRED:
            settled += 1
            tally.lateness.append(late_ms)
            _print_firing(console, stamp, late_ms)
            continue
        seen_payments += 1
        if kind == _PAID:
            settled += 1
            tally.cancelled += 1
            console.print(f"[dim]{stamp}  paid: its timeout cancelled[/]")
        else:
            tally.paid_too_late += 1
            console.print(f"[yellow]{stamp}  paid too late: order already cancelled[/]")
    return tally


# -- durable ------------------------------------------------------------------------------


class _Event(NamedTuple):
    """What a thread of the durable demo reports to the printing (main) thread."""

    kind: str
    order: int = -1
    at: float = 0.0  # time.monotonic() when it happened
    value: float = 0.0  # lateness (ms) of a firing; the new deadline of a reschedule


@dataclass
class _DurableTally:
    """What the durable demo saw."""

    lateness: list[float] = field(default_factory=list)  # ms, one per delivery
    fired: set[int] = field(default_factory=set)
    cancelled: set[int] = field(default_factory=set)
    rescheduled: int = 0


class _DurableRun:
    """One run of the durable scenario: a producer and a consumer thread on one
    :class:`~delayq.Queue`, and the main thread printing what they report."""

    def __init__(self, q: Queue, plan: list[_Order], window: float) -> None:
        self.q = q
        self.plan = plan
        self.events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self.stop = threading.Event()
        self.producer_done = threading.Event()
        self.cancelled = 0  # written by the producer before it sets producer_done
        self.errors: list[BaseException] = []
        self.start = time.monotonic()
        self.give_up = self.start + window + GRACE_SECONDS

    def run(self, console: Console) -> _DurableTally:
        """Put every timeout, run both threads, print their events until both are done."""
        self.q.put_many(
            {
                "payload": {"order": order.number, "action": "cancel-if-unpaid"},
                "delay": order.deadline,
                "id": _order_id(order.number),
            }
            for order in self.plan
        )
        threads = [
            threading.Thread(target=self._guard, args=(self._produce,), name="demo-producer"),
            threading.Thread(target=self._guard, args=(self._consume,), name="demo-consumer"),
        ]
        for thread in threads:
            thread.start()
        try:
            return self._show(console, running=len(threads))
        finally:
            self.stop.set()
            for thread in threads:
                thread.join()

    def _guard(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # reported by the main thread
            self.errors.append(exc)
            self.stop.set()
        finally:
            self.events.put(_Event(_DONE))

    def _produce(self) -> None:
        """Pay orders (cancel their timeout) and give customers more time (reschedule),
        each at its planned moment."""
        actions: list[tuple[float, int, float | None]] = []  # (when, order, new deadline)
        for order in self.plan:
            if order.pay_at is not None:
                actions.append((order.pay_at, order.number, None))
            if order.more_time is not None:
                asked, later = order.more_time
                actions.append((asked, order.number, later))
        actions.sort(key=lambda action: action[0])
        for when, number, new_deadline in actions:
            if self.stop.wait(max(0.0, self.start + when - time.monotonic())):
                return
            if new_deadline is None:
                paid = self.q.cancel(_order_id(number))
                self.cancelled += paid
                self.events.put(_Event(_PAID if paid else _PAID_LATE, number, time.monotonic()))
            else:
                now = time.monotonic()
                moved = self.q.reschedule(_order_id(number), delay=self.start + new_deadline - now)
                self.events.put(
                    _Event(_MORE_TIME if moved else _MORE_TIME_LATE, number, now, new_deadline)
                )
        self.producer_done.set()

    def _consume(self) -> None:
        """Reserve what is due, note its lateness, ack it; stop once every order is
        settled (or nothing is left to wait for, or the grace period is over)."""
        fired: set[int] = set()
        while not self.stop.is_set() and time.monotonic() < self.give_up:
            batch = self.q.reserve(wait=CONSUMER_WAIT, max=CONSUMER_BATCH)
            now_ms = time.time() * 1000.0
            at = time.monotonic()
            for msg in batch:
                self.q.ack(msg)
                number = int(msg.payload["order"])
                fired.add(number)
                self.events.put(_Event(_EXPIRED, number, at, now_ms - msg.due_at))
            if self.producer_done.is_set() and (
                len(fired) + self.cancelled >= len(self.plan) or self.q.stats().total == 0
            ):
                return

    def _show(self, console: Console, *, running: int) -> _DurableTally:
        tally = _DurableTally()
        while running:
            try:
                event = self.events.get(timeout=max(0.0, self.give_up + 5.0 - time.monotonic()))
            except queue.Empty:
                raise click.ClickException("timed out waiting for the demo's threads") from None
            stamp = f"{event.at - self.start:7.3f}s  {_order_id(event.order)}"
            if event.kind == _DONE:
                running -= 1
            elif event.kind == _EXPIRED:
                tally.lateness.append(event.value)
                tally.fired.add(event.order)
                _print_firing(console, stamp, event.value)
            elif event.kind == _PAID:
                tally.cancelled.add(event.order)
                console.print(f"[dim]{stamp}  paid: its timeout cancelled[/]")
            elif event.kind == _PAID_LATE:
                console.print(f"[yellow]{stamp}  paid too late: order already cancelled[/]")
            elif event.kind == _MORE_TIME:
                tally.rescheduled += 1
                console.print(f"[cyan]{stamp}  more time: deadline moved to {event.value:.3f}s[/]")
            else:
                console.print(f"[yellow]{stamp}  asked for more time too late[/]")
        if self.errors:
            exc = self.errors[0]
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
        return tally


def run_durable(console: Console, *, url: str, orders: int, window: float, seed: int) -> None:
    """The scenario on a durable :class:`~delayq.Queue` at ``url``, in a queue named
    for this run and purged at the end (the database itself stays). Exits with status
    1 if a message came early or an order was neither fired nor cancelled (lost)."""
    name = f"demo-{os.getpid()}-{int(time.time())}"
    console.print(
        f"[bold]delayq demo[/]: {orders} orders, payment windows up to {window:g} s, "
        f"engine=durable, url={escape(redact_url(url))}, queue={name}, seed={seed}",
        soft_wrap=True,
    )
    plan = _plan(random.Random(seed), orders, window, RESCHEDULE_SHARE)
    with translate_errors(url), Queue(url, name=name) as q:  # one line if it cannot be used
        run = _DurableRun(q, plan, window)
        try:
            tally = run.run(console)
        finally:
            q.purge()
    elapsed = time.monotonic() - run.start

    fired, cancelled = len(tally.lateness), len(tally.cancelled)
    lost = orders - len(tally.fired | tally.cancelled)
    lateness, early = _lateness_fields(tally.lateness)
    console.print(
        f"fired={fired} cancelled={cancelled} rescheduled={tally.rescheduled} {lateness} "
        f"early={early} lost={lost} elapsed={elapsed:.2f}s",
        soft_wrap=True,
    )
    if early or lost or fired + cancelled != orders:
        raise SystemExit(1)
