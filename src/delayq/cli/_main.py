"""The ``delayq`` command: a click group (options and errors only).

* ``delayq demo`` runs an order-timeout scenario (see :mod:`delayq.cli._demo`): every
  order gets a "cancel it if unpaid" timeout at the end of its payment window, paid
  orders cancel theirs, and each firing is printed with its lateness. By default it
  runs on the durable queue at ``--url`` (``$DELAYQ_URL``, else ``sqlite:///delayq.db``);
  ``--engine inproc`` runs it on the in-process :class:`~delayq.Scheduler`.
* ``delayq worker module:app`` runs the tasks of an App (:mod:`delayq.cli._worker`).
* ``delayq put | get | cancel | reschedule | stats | dead | purge`` operate one
  queue at ``--url`` (:mod:`delayq.cli._queue`).
* ``delayq serve`` serves the queue over HTTP: API, callbacks, dashboard, metrics
  (:mod:`delayq.cli._serve`).
* ``delayq bench`` measures jobs/s of a no-op task through the Worker
  (:mod:`delayq.cli._bench`).

Every user mistake is one red line on stderr: exit 2 for usage, 1 at run time
(:mod:`delayq.cli._common`).
"""

from __future__ import annotations

import random

import click
from rich.console import Console

from .. import __version__
from ..durable.constants import DEFAULT_QUEUE_URL
from ..durable.registry import default_url, scheme_of
from ..errors import UnsupportedURL
from ._bench import bench
from ._common import OneLineGroup, check_url
from ._demo import run_durable, run_inproc
from ._queue import QUEUE_COMMANDS
from ._scheduler import scheduler
from ._serve import serve
from ._worker import worker

__all__ = ["main"]


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="delayq")
def main() -> None:
    """delayq: a delay queue for Python, exact to the millisecond."""


@main.command(short_help="Order timeouts on the durable queue, each firing with its lateness.")
@click.option(
    "--engine",
    type=click.Choice(["durable", "inproc"]),
    default="durable",
    show_default=True,
    help="The durable queue at --url, or the in-process Scheduler.",
)
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
    "--url",
    metavar="URL",
    default=None,
    callback=check_url,
    help=f"Durable engine: the queue URL (default: $DELAYQ_URL, else {DEFAULT_QUEUE_URL}).",
)
@click.option(
    "--store",
    type=click.Choice(["heap", "wheel"]),
    default=None,
    help="Inproc engine: the timer store under the scheduler.  [default: heap]",
)
def demo(
    *,
    engine: str,
    orders: int,
    window: float,
    seed: int | None,
    url: str | None,
    store: str | None,
) -> None:
    """Order timeouts: cancel every order that is not paid within its window.

    Each order gets a timeout message (its id is the order id) due somewhere in the
    window; about 30% of the orders are paid in time, which cancels it, and on
    the durable queue a few customers get more time (a reschedule). Every firing is
    printed with its lateness; the last line sums up. The durable demo uses a queue
    of its own, purged at the end; the database file stays.
    """
    if engine == "durable" and store is not None:
        raise click.UsageError("--store applies to --engine inproc only")
    if engine == "inproc" and url is not None:
        raise click.UsageError("--url applies to --engine durable only")
    if seed is None:
        seed = random.randrange(1_000_000)
    console = Console(highlight=False)
    if engine == "inproc":
        run_inproc(console, orders=orders, window=window, seed=seed, store=store or "heap")
        return
    if url is None:
        url = default_url()
        try:
            scheme_of(url)
        except UnsupportedURL as exc:
            raise click.ClickException(f"$DELAYQ_URL: {exc}") from None
    run_durable(console, url=url, orders=orders, window=window, seed=seed)


main.add_command(worker)
for _command in QUEUE_COMMANDS:
    main.add_command(_command)
main.add_command(bench)
main.add_command(serve)
main.add_command(scheduler)
