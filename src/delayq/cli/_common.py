"""What every subcommand of ``delayq`` shares: one-line errors, ``--url``, time options.

Errors. A user mistake (bad JSON, an unknown duration, a naive datetime, an unknown
URL scheme, a missing message, a server that does not answer) prints ONE red line on
stderr and exits non-zero: 2 for a usage error (a bad argument), 1 for a runtime
error (the queue said no, or could not be reached). :class:`OneLineGroup` prints
click's own usage errors that way too, and :func:`translate_errors` turns delayq's
and the backends' exceptions into those lines. A traceback means a bug in delayq.
"""

from __future__ import annotations

import errno
import gc
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

from .._duration import delay_to_seconds
from .._redact import redact_text
from ..durable.constants import DEFAULT_QUEUE_URL
from ..durable.queue import Queue
from ..durable.registry import (
    client_errors,
    consumer_options,
    database_file,
    default_url,
    redact_url,
    scheme_of,
)
from ..errors import (
    BackendNotInstalled,
    DelayqError,
    DuplicateId,
    PayloadTooLarge,
    UnsupportedURL,
)

__all__ = [
    "CliError",
    "OneLineGroup",
    "address",
    "at_option",
    "check_backend",
    "check_url",
    "duration_option",
    "err_console",
    "format_ms",
    "format_seconds",
    "freeze_startup_heap",
    "listen",
    "open_queue",
    "parse_delay",
    "parse_duration",
    "parse_timestamp",
    "relative",
    "resolve_url",
    "translate_errors",
    "url_option",
    "warn_visible",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Exit status of a runtime error: the queue refused, or could not be reached.
RUNTIME_EXIT = 1


def err_console() -> Console:
    """A rich console on the current stderr (CliRunner swaps it per call)."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(click.ClickException):
    """A runtime error for the user (exit 1): the queue refused, or could not be
    reached. Usage errors (exit 2) are :class:`click.UsageError`."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def show_error(exc: click.ClickException) -> None:
    """Print ``exc`` as one red ``error: ...`` line on stderr; usage errors name the
    command whose ``--help`` explains it."""
    message = redact_text(_one_line(exc.format_message()))
    if isinstance(exc, click.UsageError) and exc.ctx is not None:
        message += f" (see '{exc.ctx.command_path} --help')"
    err_console().print(Text(f"error: {message}", style="bold red"))


class OneLineGroup(click.Group):
    """A click group whose errors are one red line on stderr, never a usage block."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; with ``standalone_mode`` (the default) exit the
        process, printing errors as one line."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.Abort:
            err_console().print(Text("aborted", style="bold red"))
            sys.exit(RUNTIME_EXIT)
        except click.ClickException as exc:
            help_error = getattr(click.exceptions, "NoArgsIsHelpError", None)
            if help_error is not None and isinstance(exc, help_error):
                exc.show()  # the group's help, as click prints it
            else:
                show_error(exc)
            sys.exit(exc.exit_code)
        sys.exit(status if isinstance(status, int) else 0)


def address(host: str, port: int) -> str:
    """``http://host:port/``, an IPv6 host in brackets."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


def listen(
    host: str, port: int, *, host_option: str = "--host", port_option: str = "--port"
) -> socket.socket:
    """A listening socket, bound before anything is printed, so that a busy port or a
    wrong address is one clear line naming the option to change."""
    name = host.strip("[]")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    try:
        return socket.create_server((name, port), family=family, backlog=2048)
    except socket.gaierror as exc:
        raise CliError(f"cannot listen on {host!r}: {exc.strerror}") from None
    except OSError as exc:
        where = address(host, port)
        if exc.errno == errno.EADDRINUSE:
            reason = f"the port is in use: stop what holds it, or choose another with {port_option}"
        elif exc.errno == errno.EADDRNOTAVAIL:
            reason = f"that address is not one of this machine's: check {host_option}"
        elif exc.errno == errno.EACCES:
            reason = f"ports below 1024 need privileges: choose another with {port_option}"
        else:
            reason = exc.strerror or str(exc)
        raise CliError(f"cannot listen on {where}: {reason}") from None


# -- errors from the queue -------------------------------------------------------------


def _is_connection_error(exc: BaseException, url: str) -> bool:
    if isinstance(exc, OSError):
        return True
    try:
        return isinstance(exc, client_errors(url))  # the backend's (psycopg_pool's timeout)
    except (UnsupportedURL, BackendNotInstalled):
        return False


@contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Turn what the queue at ``url`` raises for a user mistake into a :class:`CliError`."""
    try:
        yield
    except click.ClickException:
        raise
    except UnsupportedURL as exc:
        raise click.UsageError(str(exc)) from None
    except PayloadTooLarge as exc:
        raise click.UsageError(str(exc)) from None
    except DuplicateId as exc:
        raise CliError(f"duplicate id: {exc}") from None
    except DelayqError as exc:
        raise CliError(str(exc) or type(exc).__name__) from None
    except (ValueError, TypeError) as exc:  # the facade's argument checks
        raise click.UsageError(str(exc)) from None
    except Exception as exc:
        if _is_connection_error(exc, url):
            shown = redact_url(url)
            raise CliError(f"cannot use the queue at {shown}: {_one_line(str(exc))}") from None
        raise


# -- --url -------------------------------------------------------------------------------


def warn_visible(option: str, instead: str) -> None:
    """Warn on stderr that ``option``, given on the command line, shows a secret to
    every user of the machine (``ps``, ``/proc/PID/cmdline``); ``instead`` says what
    does not."""
    click.echo(
        f"warning: {option} on the command line can be read by other users of this "
        f"machine (ps): use {instead}",
        err=True,
    )


def check_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a queue URL of a scheme delayq cannot serve (exit status 2); warn when
    it holds a password (or a secret parameter), which ``ps`` shows."""
    if value is not None:
        if redact_url(value) != value:
            warn_visible("a password in --url", "$DELAYQ_URL")
        try:
            scheme_of(value)
        except UnsupportedURL as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def url_option(help: str | None = None) -> Callable[[F], F]:
    """The ``--url`` option (default None: :func:`resolve_url` picks the default)."""
    return click.option(
        "--url",
        metavar="URL",
        default=None,
        callback=check_url,
        help=help or f"The queue URL (default: $DELAYQ_URL, else {DEFAULT_QUEUE_URL}).",
    )


def resolve_url(url: str | None) -> str:
    """``url``, else the default URL, checked (a bad ``$DELAYQ_URL`` is a usage error)."""
    if url is not None:
        return url
    url = default_url()
    try:
        scheme_of(url)
    except UnsupportedURL as exc:
        raise CliError(f"$DELAYQ_URL: {exc}") from None
    return url


@contextmanager
def open_queue(
    url: str, name: str, *, create: bool = False, options: dict[str, Any] | None = None
) -> Iterator[Queue]:
    """The queue ``name`` at ``url``, closed on exit; errors become :class:`CliError`.

    Without ``create``, a ``sqlite:///`` file that does not exist is an error rather
    than a new empty database (a typo in a path should not leave a file behind).
    """
    with translate_errors(url):
        path = database_file(url)
        if path is not None and not os.path.exists(path):
            if not create:
                raise CliError(f"no queue database at {path} (check --url or $DELAYQ_URL)")
            folder = os.path.dirname(path)
            if not os.path.isdir(folder):
                raise CliError(
                    f"cannot use the queue at {redact_url(url)}: the directory {folder} of "
                    "its database does not exist (create it, or check --url or $DELAYQ_URL)"
                )
        queue = Queue(url, name=name, **(options or {}))
        try:
            yield queue
        finally:
            queue.close()


def check_backend(url: str, name: str, timeout: float) -> None:
    """Fail with one line (:class:`CliError`) unless the queue ``name`` at ``url``
    answers a ``stats`` call within ``timeout`` seconds: a missing directory, a file
    that is not a database, a refused connection, a wrong password, an unknown host.

    For the long-running commands, which would otherwise start and then only log
    retries. The call runs on a daemon thread, so a backend that accepts and never
    answers cannot hold the command past ``timeout``.
    """
    failure: list[BaseException] = []

    def probe() -> None:
        try:
            # As the consumer that runs after this check will (amqp:// stands for its
            # scheduler), so that a namespace with no scheduler yet passes the check.
            with open_queue(url, name, create=True, options=consumer_options(url)) as queue:
                queue.stats()
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=probe, name="delayq-backend-check", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CliError(f"the queue at {redact_url(url)} did not answer within {timeout:g}s")
    if failure:
        raise failure[0]


# -- times ---------------------------------------------------------------------------------


def parse_duration(
    ctx: click.Context, param: click.Parameter, value: str | float | None
) -> float | None:
    """Option callback: seconds (float) of a duration, read by the parser of every face
    (``"250ms"``, ``"90s"``, ``"1h30m"``, ``"90"``); a usage error unless it is >= 0."""
    seconds = _duration_of(param, value)
    if seconds is not None and seconds < 0.0:
        raise click.UsageError(f"{_option_name(param)} must be >= 0 seconds, got {value!r}")
    return seconds


def parse_delay(
    ctx: click.Context, param: click.Parameter, value: str | float | None
) -> float | None:
    """Option callback of ``--delay``: as :func:`parse_duration`, but a negative delay
    means "due now", as on every face."""
    return _duration_of(param, value)


def _option_name(param: click.Parameter) -> str:
    return param.opts[0] if param.opts else str(param.name)


def _duration_of(param: click.Parameter, value: str | float | None) -> float | None:
    """The seconds of ``value``; errors name the argument as Python and HTTP do
    (``delay``, not ``--delay``), in the same words."""
    if value is None or isinstance(value, float):
        return value
    try:
        return delay_to_seconds(str(value), str(param.name))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def parse_timestamp(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> datetime | None:
    """Option callback: an aware datetime of an ISO 8601 time with its offset (``Z``
    or ``+01:00``); a usage error if it is naive or malformed."""
    if value is None:
        return None
    text = value.strip()
    if text[-1:] in ("Z", "z"):  # Python 3.10's fromisoformat does not know "Z"
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 date and time, e.g. 2030-01-31T09:00:00+01:00",
            ctx=ctx,
            param=param,
        ) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise click.BadParameter(
            f"{value!r} has no time zone: add one, e.g. {text}Z or {text}+01:00",
            ctx=ctx,
            param=param,
        )
    return moment


def duration_option(
    *names: str, default: float | None = None, help: str, negative_is_now: bool = False
) -> Callable[[F], F]:
    """An option whose value is a duration (seconds as a float), >= 0 unless
    ``negative_is_now`` (a delay: negative means due now)."""
    return click.option(
        *names,
        type=click.STRING,
        default=None if default is None else f"{default:g}",
        show_default=default is not None,
        metavar="DURATION",
        callback=parse_delay if negative_is_now else parse_duration,
        help=help,
    )


def at_option(help: str) -> Callable[[F], F]:
    """The ``--at`` option: an ISO 8601 time with its offset, as an aware datetime."""
    return click.option(
        "--at", "at", default=None, metavar="ISO8601", callback=parse_timestamp, help=help
    )


def format_seconds(seconds: float) -> str:
    """``"850ms"``, ``"12.5s"``, ``"3m 20s"``, ``"2h 5m"``, ``"3d 4h"`` (no sign)."""
    seconds = abs(seconds)
    if seconds < 1.0:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60.0:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    for unit, size, small, small_size in (
        ("d", 86_400, "h", 3_600),
        ("h", 3_600, "m", 60),
        ("m", 60, "s", 1),
    ):
        if whole >= size:
            rest = (whole % size) // small_size
            return f"{whole // size}{unit} {rest}{small}" if rest else f"{whole // size}{unit}"
    return f"{whole}s"  # pragma: no cover  (whole >= 60 always matches "m")


def relative(ms: int, now_ms: int) -> str:
    """``ms`` (epoch) relative to ``now_ms``: ``"in 4m 10s"``, ``"12.0s ago"``, ``"now"``."""
    delta = (ms - now_ms) / 1000.0
    if abs(delta) < 0.0005:
        return "now"
    return f"in {format_seconds(delta)}" if delta > 0 else f"{format_seconds(delta)} ago"


def format_ms(ms: int, timespec: str = "milliseconds") -> str:
    """Epoch milliseconds as local ISO 8601 with its offset (to the millisecond by
    default; ``timespec`` as :meth:`datetime.isoformat` takes it)."""
    return (
        datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
        .astimezone()
        .isoformat(timespec=timespec)
    )


def freeze_startup_heap() -> None:
    """Collect, then move every object alive now out of the collector's sight
    (:func:`gc.freeze`), once a long-running process is set up.

    CPython's full collections scan every tracked object. The imports alone leave
    many: redis-py about 26,000, the server's FastAPI and uvicorn about 78,000. A full
    collection then stops the process for tens of milliseconds, often enough to make
    messages and callbacks that fall due during it late by as much. Frozen, those
    objects are never scanned again; what the process makes later is collected as
    before. Only the CLI's long-running commands call this: they own their process.
    """
    gc.collect()
    gc.freeze()
