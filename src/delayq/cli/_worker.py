"""``delayq worker module:app``: import an :class:`~delayq.App` and run a
:class:`~delayq.Worker` over its tasks until SIGTERM/SIGINT.

The app is found as uvicorn finds one: ``module:attribute`` (the attribute may be
dotted), imported with the current directory first on ``sys.path``. A bad path, a
module that fails to import, or an attribute that is not an ``App`` is one red line
on stderr, exit 2 (1 when the module's own code raised).

``--processes N`` (N > 1) runs N worker processes under a
:class:`~delayq.runtime.Supervisor`: this process checks everything first (the app,
the options, the store), exactly as for one process, so a mistake is one line shown
once; then each child imports the app again and serves its own Worker.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .._log import LOGGER_NAME, JsonFormatter, TextFormatter
from ..durable.constants import DEFAULT_LEASE
from ..durable.registry import scheme_of
from ..runtime import App, Supervisor, Worker
from ..runtime.constants import DEFAULT_WORKER_CONCURRENCY, DEFAULT_WORKER_GRACE
from ._common import (
    CliError,
    check_backend,
    duration_option,
    freeze_startup_heap,
    listen,
    show_error,
    translate_errors,
    url_option,
)
from ._constants import STARTUP_CHECK_TIMEOUT

__all__ = [
    "configure_logging",
    "load_app",
    "log_format_option",
    "log_formatter",
    "log_level_option",
    "worker",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_LOG_LEVELS = ("debug", "info", "warning", "error")
_LOG_FORMATS = ("text", "json")
#: The options a refusal to listen on the health port names.
_HEALTH = {"host_option": "--health-host", "port_option": "--health-port"}
_METRICS = {"host_option": "--metrics-host", "port_option": "--metrics-port"}


def _where(exc: BaseException) -> str:
    """`` (file.py:12)``: where ``exc`` was raised, for a one-line report: the file
    and line a SyntaxError names (not ``<string>``: a compile() of the module's own),
    else the last frame outside the import machinery."""
    if isinstance(exc, SyntaxError) and exc.filename and not exc.filename.startswith("<"):
        line = "" if exc.lineno is None else f":{exc.lineno}"
        return f" ({_shown_path(exc.filename)}{line})"
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen ")
    ]
    if not frames:
        return ""
    last = frames[-1]
    return f" ({_shown_path(last.filename)}:{last.lineno})"


def _shown_path(filename: str) -> str:
    """``filename`` relative to the current directory when it is below it (``shop/tasks.py``),
    else as it is."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if relative.startswith(os.pardir) else relative


def _import(module_name: str) -> object:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise click.UsageError(
                f"cannot import {module_name!r}: no module named {missing!r} "
                f"(looked in {os.getcwd()} and sys.path)"
            ) from None
        raise CliError(f"importing {module_name!r} failed: {exc}{_where(exc)}") from None
    except Exception as exc:
        # A SyntaxError's text ends with "(file.py, line 3)": its place is said once, below.
        text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        raise CliError(f"importing {module_name!r} failed: {detail}{_where(exc)}") from None


def load_app(spec: str) -> App:
    """The :class:`App` named by ``"module:attribute"`` (the current directory is put
    first on ``sys.path``, as uvicorn does); :class:`CliError` otherwise."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise click.UsageError(f"APP must be module:attribute, e.g. myapp:app, not {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    found = _import(module_name)
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise click.UsageError(
                f"{spec}: {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not isinstance(found, App):
        raise click.UsageError(
            f"{spec} is a {type(found).__name__}, not a delayq App (app = delayq.App(url))"
        )
    return found


def _split_queues(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise click.BadParameter("name at least one queue: a,b", param_hint="'--queues'")
    return names


#: The ``--log-level`` option of the long-running commands.
log_level_option = click.option(
    "--log-level",
    type=click.Choice(_LOG_LEVELS),
    default="info",
    show_default=True,
    help="Level of the delayq log lines on stderr.",
)


#: The ``--log-format`` option of the long-running commands.
log_format_option = click.option(
    "--log-format",
    type=click.Choice(_LOG_FORMATS),
    envvar="DELAYQ_LOG_FORMAT",
    default="text",
    show_default=True,
    help="Log lines as text, or as one JSON object per line with each field as a key "
    "(default: $DELAYQ_LOG_FORMAT, else text).",
)


def log_formatter(log_format: str, *, pid: bool = False) -> logging.Formatter:
    """The formatter of ``--log-format``: a JSON object per line, or a text line with
    its time, level and logger (and its process with ``pid``)."""
    if log_format == "json":
        return JsonFormatter()
    return TextFormatter(pid=pid)


def configure_logging(level: str, *, log_format: str = "text", pid: bool = False) -> None:
    """``delayq`` log records, one line each, on stderr (unless the app set logging up);
    with ``pid``, each text line names its process (several processes share stderr;
    a JSON line always has its ``process``)."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(log_formatter(log_format, pid=pid))
        root.addHandler(handler)
    logging.getLogger(LOGGER_NAME).setLevel(level.upper())


def _port_options(name: str, port_help: str) -> Callable[[_F], _F]:
    """``--<name>-port`` (``port_help``) and ``--<name>-host``, 127.0.0.1 by default."""
    port = click.option(
        f"--{name}-port", type=click.IntRange(0, 65535), default=None, help=port_help
    )
    host = click.option(
        f"--{name}-host",
        default="127.0.0.1",
        show_default=True,
        help=f"Address the {name} port binds.",
    )
    return lambda command: port(host(command))


@click.command(short_help="Run the tasks of an App until SIGTERM/SIGINT.")
@click.argument("app_spec", metavar="MODULE:APP")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=DEFAULT_WORKER_CONCURRENCY,
    show_default=True,
    help="Handlers running at once.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=None,
    help="Messages reserved ahead of the free handlers, their leases renewed while they "
    "wait (default: 4 x --concurrency, up to 16 x for quick sync handlers while those "
    "waiting stand for at most 50 ms of work; 0: none, for long jobs shared among workers).",
)
@click.option(
    "--queues", default=None, metavar="A,B", help="Only these queues (default: every task's)."
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes, each with --concurrency handlers, under one supervisor "
    "that restarts a child that dies.",
)
@duration_option(
    "--lease",
    default=DEFAULT_LEASE,
    help="Lease of each reservation, renewed while its handler runs: 30s, 2m...",
)
@duration_option(
    "--grace",
    default=DEFAULT_WORKER_GRACE,
    help="After a stop, how long running handlers may finish before their messages are given back.",
)
@_port_options(
    "health",
    "Answer GET /healthz (200 while the worker's loop turns) and /readyz (200 when "
    "connected and not draining, else 503 with the reason) on this port; with "
    "--processes, the supervisor answers for all its children.",
)
@_port_options(
    "metrics",
    "Answer GET /metrics (Prometheus text: runs by task and outcome, run time and "
    "lateness histograms, messages in flight, backend outages) on this port; the same "
    "port as --health-port answers all three paths; with --processes, the supervisor "
    "answers for all its children, their counts added up.",
)
@log_level_option
@log_format_option
@url_option("The queue URL (default: the App's own, i.e. App(url) or $DELAYQ_URL...).")
def worker(
    *,
    app_spec: str,
    concurrency: int,
    prefetch: int | None,
    processes: int,
    queues: str | None,
    lease: float,
    grace: float,
    health_port: int | None,
    health_host: str,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
    log_format: str,
    url: str | None,
) -> None:
    """Import MODULE:APP (a delayq App, e.g. myapp:app) and run its tasks.

    SIGTERM or SIGINT stops reserving, lets running handlers finish for --grace
    seconds, gives the rest back without charging an attempt and exits 0; a second
    signal skips the grace period.

    With --processes N, N worker processes (spawned fresh, each with its own
    connections) run under this one, which restarts a child that dies and passes
    SIGTERM/SIGINT on to all of them; it exits 0 once all have stopped.
    """
    names = _split_queues(queues)
    if lease <= 0:
        raise click.BadParameter("must be > 0", param_hint="'--lease'")
    options: dict[str, Any] = {
        "app_spec": app_spec,
        "url": url,
        "queues": names,
        "concurrency": concurrency,
        "prefetch": prefetch,
        "lease": lease,
        "grace": grace,
    }
    app, runner = _build_worker(**options)
    # Fail fast when the store cannot be reached, rather than log retries forever (as
    # `delayq serve` does: see there why a backend merely down is fatal too).
    check_backend(app.url, (names or app.queue_names)[0], STARTUP_CHECK_TIMEOUT)
    health = None if health_port is None else listen(health_host, health_port, **_HEALTH)
    metrics = health
    if metrics_port is not None and (metrics_port, metrics_host) != (health_port, health_host):
        metrics = listen(metrics_host, metrics_port, **_METRICS)
    elif metrics_port is None:
        metrics = None
    if processes > 1:
        configure_logging(log_level, log_format=log_format, pid=True)
        make_worker = functools.partial(
            _child_worker, log_level=log_level, log_format=log_format, **options
        )
        supervisor = Supervisor(make_worker, processes=processes, health=health, metrics=metrics)
        sys.exit(supervisor.run())
    configure_logging(log_level, log_format=log_format)
    freeze_startup_heap()
    runner.run(health=health, metrics=metrics)


def _build_worker(
    *,
    app_spec: str,
    url: str | None,
    queues: list[str] | None,
    concurrency: int,
    prefetch: int | None,
    lease: float,
    grace: float,
) -> tuple[App, Worker]:
    """The app and the Worker the command line describes; one-line errors."""
    app = load_app(app_spec)
    if url is not None:
        app.url = url  # before the worker opens its queues
    with translate_errors(app.url):
        scheme_of(app.url)
        try:
            runner = Worker(
                app,
                concurrency=concurrency,
                prefetch=prefetch,
                lease=lease,
                grace=grace,
                queues=queues,
            )
        except (TypeError, ValueError) as exc:
            raise click.UsageError(f"{app_spec}: {exc}") from None
    return app, runner


def _child_worker(*, log_level: str, log_format: str, **options: Any) -> Worker:
    """In a child of ``--processes``: the Worker the command line describes (checked
    already by the supervisor; a failure here is still one line, with the exit status
    the command would have)."""
    try:
        _, runner = _build_worker(**options)
    except click.ClickException as exc:
        show_error(exc)
        sys.exit(exc.exit_code)
    configure_logging(log_level, log_format=log_format, pid=True)
    freeze_startup_heap()
    return runner
