"""The ``delayq`` command: a click group that later issues extend (worker, serve).

``delayq demo`` runs an order-timeout scenario on the in-process
:class:`~delayq.inproc.scheduler.Scheduler`: every order gets a cancellation timer
at the end of its payment window, paid orders cancel theirs, and each firing is
printed with its lateness.
"""

from __future__ import annotations

import math
import queue
import random
import threading
import time
from dataclasses import dataclass, field

import click
from rich.console import Console

from . import __version__
from .inproc.heap import HeapStore
from .inproc.scheduler import Scheduler, Timer
from .inproc.store import TimerStore
from .inproc.wheel import WheelStore

__all__ = ["main"]

#: The share of orders that are paid before their payment window ends.
PAID_SHARE = 0.3
#: Seconds beyond the window after which the demo gives up waiting for an event.
GRACE_SECONDS = 30.0

_EXPIRED, _PAID, _PAID_LATE = "expired", "paid", "paid too late"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="delayq")
def main() -> None:
    """delayq: a delay queue for Python, exact to the millisecond."""


@dataclass
class _Tally:
    """What the demo saw: lateness of every firing (seconds) and the counts."""

    lateness: list[float] = field(default_factory=list)
    cancelled: int = 0
    paid_too_late: int = 0


@main.command(short_help="Order timeouts on the in-process Scheduler, with lateness.")
@click.option(
    "--orders", default=300, show_default=True, type=click.IntRange(min=1), help="Orders to place."
)
@click.option(
    "--window",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.0, min_open=True, max=3600.0),
    help="Payment windows end within this many seconds.",
)
@click.option("--seed", type=int, default=None, help="Random seed (default: a new one, printed).")
@click.option(
    "--store",
    type=click.Choice(["heap", "wheel"]),
    default="heap",
    show_default=True,
    help="The timer store under the scheduler.",
)
def demo(orders: int, window: float, seed: int | None, store: str) -> None:
    """Order timeouts: cancel every order that is not paid within its window.

    Each order gets a cancellation timer (its id is the order id) due somewhere in
    the window; about a third of the orders are paid in time, which cancels their
    timer. Every firing is printed with its lateness; the last line sums up.
    """
    if seed is None:
        seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    console = Console(highlight=False)
    timer_store: TimerStore[Timer] = HeapStore() if store == "heap" else WheelStore()
    console.print(
        f"[bold]delayq demo[/]: {orders} orders, payment windows up to {window:g} s, "
        f"store={store}, seed={seed}"
    )
    events: queue.SimpleQueue[tuple[str, int, float, float]] = queue.SimpleQueue()
    timers: dict[int, Timer] = {}
    scheduling = threading.Lock()  # held while the timers are created

    with Scheduler(store=timer_store) as scheduler:

        def expire(order: int) -> None:
            now = time.monotonic()
            with scheduling:
                deadline = timers[order].deadline
            events.put((_EXPIRED, order, now, now - deadline))

        def pay(order: int) -> None:
            paid = scheduler.cancel(_order_id(order))
            events.put((_PAID if paid else _PAID_LATE, order, time.monotonic(), 0.0))

        start = time.monotonic()
        payments = 0
        with scheduling:
            for order in range(orders):
                delay = rng.uniform(0.1, 1.0) * window
                timers[order] = scheduler.call_later(delay, expire, order, id=_order_id(order))
                if rng.random() < PAID_SHARE:
                    scheduler.call_later(rng.uniform(0.1, 0.9) * delay, pay, order)
                    payments += 1
        tally = _show_events(console, events, orders, payments, start=start, window=window)
    elapsed = time.monotonic() - start

    fired = len(tally.lateness)
    ms = sorted(late * 1000.0 for late in tally.lateness)
    early = sum(1 for late in ms if late < 0.0)
    console.print(
        f"fired={fired} cancelled={tally.cancelled} p50={_percentile(ms, 50):.2f}ms "
        f"p99={_percentile(ms, 99):.2f}ms max={(ms[-1] if ms else 0.0):.2f}ms "
        f"early={early} elapsed={elapsed:.2f}s",
        soft_wrap=True,
    )
    if early or fired + tally.cancelled != orders:
        raise SystemExit(1)


def _order_id(order: int) -> str:
    return f"order-{order:04d}"


def _show_events(
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
            kind, order, at, late = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise click.ClickException("timed out waiting for the scheduler") from None
        stamp = f"{at - start:7.3f}s  {_order_id(order)}"
        if kind == _EXPIRED:
            settled += 1
            tally.lateness.append(late)
            late_ms = late * 1000.0
            style = "green" if late_ms < 1.0 else "yellow" if late_ms < 5.0 else "red"
            console.print(f"{stamp}  expired: order cancelled  [{style}]late {late_ms:6.2f} ms[/]")
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


def _percentile(sorted_values: list[float], percent: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(percent / 100.0 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


if __name__ == "__main__":
    main()
