"""``delayq scheduler --url amqp://...``: stand for election as the scheduler of a
replicated backend's namespace, and be it when elected, until SIGTERM/SIGINT.

For deployments where no delayq consumer runs (plain AMQP consumers fed through
``deliver_exchange``) or where the scheduler should have a process of its own, away from
producer and consumer threads (docs/rabbitmq.md, "Measured"). Run two, on two hosts:
the second takes over when the first goes; it is a hot standby (``standby=hot``) unless
the URL says ``standby=cold``. A namespace of ``shards=N`` has N elections: the process
stands for each, or for those its URL lists in ``scheduler_shards``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit

import click

from .._log import log_event
from ..durable.queue import Queue
from ..durable.registry import consumer_options, descriptor, descriptors, redact_url
from ._common import freeze_startup_heap, resolve_url, translate_errors, url_option
from ._worker import configure_logging, log_format_option, log_level_option

__all__ = ["scheduler"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@runtime_checkable
class _Stands(Protocol):
    """A replicated backend's sync face: it stands for the elections of its shards."""

    def stand(self) -> None: ...


def _replicated_schemes() -> str:
    """The schemes of the backends that have an elected scheduler, as a sentence lists
    them: ``amqp:// and amqps://``."""
    names = [f"{s}://" for found in descriptors() if found.replicated for s in found.schemes]
    return " and ".join([", ".join(names[:-1]), *names[-1:]] if len(names) > 1 else names)


def _options(url: str) -> dict[str, Any]:
    """The options a scheduler process opens ``url`` with: a consumer's, and a hot
    standby (it folds the log while it waits, so that a failover reads only the log's
    tail) unless the URL says ``standby=``."""
    options = consumer_options(url)
    if "standby" not in parse_qs(urlsplit(url).query, keep_blank_values=True):
        options["standby"] = "hot"
    return options


@click.command(
    short_help="Be the scheduler of a replicated backend's namespace until SIGTERM/SIGINT."
)
@log_level_option
@log_format_option
@url_option("The queue URL, of a replicated backend (default: $DELAYQ_URL).")
def scheduler(*, log_level: str, log_format: str, url: str | None) -> None:
    """Stand for election as the scheduler of the URL's namespace (its prefix) and
    run it while elected; exit 0 on SIGTERM or SIGINT, handing over to the next
    candidate."""
    url = resolve_url(url)
    with translate_errors(url):
        if not descriptor(url).replicated:
            raise click.UsageError(
                f"{redact_url(url)}: only {_replicated_schemes()} have an elected scheduler"
            )
        queue = Queue(url, **_options(url))
    stop = threading.Event()
    stopped_by: list[int] = []

    def on_signal(signum: int, _: object) -> None:
        stopped_by.append(signum)
        stop.set()

    configure_logging(log_level, log_format=log_format)
    log_event(logging.INFO, "scheduler_process_started", url=redact_url(url), pid=os.getpid())
    previous = {signum: signal.signal(signum, on_signal) for signum in _STOP_SIGNALS}
    try:
        with translate_errors(url):
            # Connects and stands, for each shard it stands for (each its own
            # election); fails fast when the broker is unreachable.
            backend = queue.backend
            assert isinstance(backend, _Stands)  # every replicated backend's face
            backend.stand()
        log_event(logging.INFO, "scheduler_standing")  # elected now, or when the lead goes
        freeze_startup_heap()
        while not stop.wait(3600):
            pass
    finally:
        queue.close()  # an elected scheduler hands over (logged: scheduler_stepped_down)
        for signum, handler in previous.items():  # as it found them (a caller in-process)
            signal.signal(signum, handler)
        signame = signal.Signals(stopped_by[0]).name if stopped_by else None
        log_event(logging.INFO, "scheduler_process_stopped", signal=signame)
