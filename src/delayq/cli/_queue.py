"""``delayq put | send | get | ls | cancel | reschedule | stats | dead | purge``: one
queue operation each, on the durable queue at ``--url``.

Output that scripts read goes to stdout as plain text (the id ``put`` prints) or JSON
(``--json``); everything for people is rich text. Errors are one red line on stderr
(see :mod:`delayq.cli._common`).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from datetime import datetime
from typing import Any

import click
from rich import box
from rich.console import Console, Group
from rich.json import JSON
from rich.live import Live
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..durable.constants import (
    DEFAULT_DEAD_LIMIT,
    DEFAULT_PEEK_LIMIT,
    DEFAULT_QUEUE_NAME,
    MAX_PEEK_LIMIT,
)
from ..durable.message import Message, PutResult, State, Stats
from ..durable.queue import Queue
from ..durable.registry import redact_url
from ..durable.traceback import short_error, user_traceback
from ..durable.tracing import carried, with_context
from ._common import (
    CliError,
    at_option,
    duration_option,
    format_ms,
    format_seconds,
    open_queue,
    relative,
    resolve_url,
    translate_errors,
    url_option,
)

__all__ = [
    "QUEUE_COMMANDS",
    "cancel",
    "dead",
    "get",
    "ls",
    "purge",
    "put",
    "reschedule",
    "send",
    "stats",
]

_STATES = [state.value for state in State]


#: The width of output that is not for a terminal: wide enough that no table line
#: wraps, and tables (which do not expand) take only the width their cells need.
_PIPED_WIDTH = 100_000
#: The width of a heading rule (wider for a long title; never wider than the console):
#: on a pipe, a rule as wide as the console would be a line of 100,000 characters.
_RULE_WIDTH = 80


def _console() -> Console:
    """A rich console on stdout; when stdout is not a terminal (a pipe, a file) its
    lines are not wrapped at 80 columns."""
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=_PIPED_WIDTH)
    return console


def _now_ms() -> int:
    return int(time.time() * 1000)


def _print_json(data: object) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, default=str))


def _due(delay: float | None, at: datetime | None, *, required: bool) -> dict[str, Any]:
    """``delay=``/``at=`` keywords of ``put``/``reschedule`` from the options."""
    if delay is not None and at is not None:
        raise click.UsageError("give --delay or --at, not both")
    if required and delay is None and at is None:
        raise click.UsageError("give the new due time: --delay DURATION or --at ISO8601")
    return {"delay": delay, "at": at}


def _read_payload(text: str) -> Any:
    """The JSON ``PAYLOAD`` argument, read from stdin when it is ``-``."""
    source = "stdin" if text == "-" else "PAYLOAD"
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "quote a string as '\"text\"'"
        ) from None


def _headers(items: Sequence[str]) -> dict[str, str]:
    headers = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="'--header'")
        headers[key] = value
    return headers


def _traced(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the trace context of the environment, ``TRACEPARENT`` and
    ``TRACESTATE`` (as a CI job or a traced script passes it to the commands it runs),
    unless they carry one (``--header traceparent=...``) or it is not valid W3C."""
    with_context(headers, carried(os.environ.get("TRACEPARENT"), os.environ.get("TRACESTATE")))
    return headers


def _explain_refusal(queue: Queue, message_id: str, action: str) -> CliError:
    """Why ``action`` (cancel, reschedule) did not apply to ``message_id``."""
    msg = queue.get(message_id)
    where = f"in queue {queue.name!r}"
    if msg is None:
        return CliError(f"no message {message_id!r} {where}")
    if msg.state is State.ACTIVE:
        return CliError(f"message {message_id!r} {where} is in flight: a worker holds it")
    if msg.state is State.DEAD:
        hint = f"delayq dead {queue.name} --retry {message_id}"
        return CliError(f"message {message_id!r} {where} is dead: '{hint}' makes it ready")
    return CliError(f"message {message_id!r} {where} could not {action}: it changed meanwhile")


def message_data(msg: Message) -> dict[str, Any]:
    """``msg`` as JSON-ready data (a bytes payload as ``payload_base64``)."""
    data: dict[str, Any] = {
        "id": msg.id,
        "queue": msg.queue,
        "state": msg.state.value,
        "due_at": msg.due_at,
        "due_at_iso": format_ms(msg.due_at),
        "attempts": msg.attempts,
        "max_attempts": msg.max_attempts,
        "headers": dict(msg.headers),
        "last_error": msg.last_error,
        "lease_expires_at": msg.lease_expires_at,
    }
    if msg.headers_error is not None:
        data["headers_error"] = msg.headers_error
    if msg.payload_error is not None:
        data["payload"] = None
        data["payload_error"] = msg.payload_error
    elif isinstance(msg.payload, bytes):
        data["payload_base64"] = base64.b64encode(msg.payload).decode("ascii")
    else:
        data["payload"] = msg.payload
    return data


def _unreadable(msg: Message) -> Text | None:
    """What ``ls``, ``dead`` and ``get`` show for a payload that cannot be given back."""
    if msg.payload_error is None:
        return None
    return Text(f"(cannot be shown: {msg.payload_error})", style="red")


def stats_data(name: str, snapshot: Stats) -> dict[str, Any]:
    """One queue's :class:`Stats` as JSON-ready data."""
    due = snapshot.next_due_at
    return {
        "name": name,  # the HTTP API's field
        "queue": name,
        "scheduled": snapshot.scheduled,
        "ready": snapshot.ready,
        "active": snapshot.active,
        "dead": snapshot.dead,
        "next_due_at": due,
        "next_due_iso": None if due is None else format_ms(due),
        "lag": snapshot.lag,
    }


# -- put, cancel, reschedule ------------------------------------------------------------


@click.command(short_help="Put a message on a queue; print its id.")
@click.argument("queue")
@click.argument("payload")
@duration_option(
    "--delay", help="Due after this long: 30m, 1h30m, 250ms, 90 (seconds).", negative_is_now=True
)
@at_option("Due at this ISO 8601 time with its offset: 2030-01-31T09:00:00+01:00, ...Z.")
@click.option("--id", "message_id", default=None, help="The message id (default: a random one).")
@click.option(
    "--on-conflict",
    type=click.Choice(["ignore", "replace", "error"]),
    default="ignore",
    show_default=True,
    help="What a put with an existing --id does.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=None,
    help="Deliveries before the message goes to dead (default: the queue's policy, 5).",
)
@click.option(
    "--header",
    "header_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="A header of the message (repeat for more).",
)
@url_option()
def put(
    *,
    queue: str,
    payload: str,
    delay: float | None,
    at: datetime | None,
    message_id: str | None,
    on_conflict: str,
    max_attempts: int | None,
    header_items: tuple[str, ...],
    url: str | None,
) -> None:
    """Put PAYLOAD (JSON, or - to read it from stdin) on QUEUE, due now, after
    --delay or at --at; print the message id on stdout. When --id exists and
    --on-conflict is ignore (the default), the existing message is kept unchanged, and
    stderr says so."""
    due = _due(delay, at, required=False)
    headers = _traced(_headers(header_items))
    data = _read_payload(payload)
    target = resolve_url(url)
    with open_queue(target, queue, create=True) as q:
        result = q.put_outcome(
            data,
            id=message_id,
            on_conflict=on_conflict,  # type: ignore[arg-type]  # click.Choice checked it
            max_attempts=max_attempts,
            headers=headers,
            **due,
        )
    _echo_put(result, queue, "--on-conflict replace overwrites it")


def _echo_put(result: PutResult, queue: str, hint: str) -> None:
    """Print a put's id on stdout and, when it kept an existing message, say so on
    stderr (the id alone cannot tell)."""
    click.echo(result.id)
    if not result.created:
        click.echo(
            f"message {result.id!r} already exists in queue {queue!r}: the existing "
            f"message was kept and not changed ({hint})",
            err=True,
        )


def _argument_value(text: str) -> Any:
    """A task argument from the command line: JSON when it parses as JSON (``42``,
    ``true``, ``{"a": 1}``, ``"42"``), else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@click.command(short_help="Start a task of an App: put its message; print its id.")
@click.argument("task")
@click.argument("args", nargs=-1)
@click.option(
    "--kw",
    "kw_items",
    multiple=True,
    metavar="NAME=VALUE",
    help="A keyword argument of the task (repeatable); VALUE as for ARGS.",
)
@click.option(
    "--queue",
    default=None,
    help=f"The task's queue (default: the one --app gives it, else {DEFAULT_QUEUE_NAME}).",
)
@click.option(
    "--app",
    "app_spec",
    default=None,
    metavar="MODULE:ATTR",
    help="The App that defines TASK: the task must exist there, and its queue and "
    "max_attempts are used.",
)
@duration_option(
    "--delay", help="Run after this long: 30m, 1h30m, 250ms, 90 (seconds).", negative_is_now=True
)
@at_option("Run at this ISO 8601 time with its offset: 2030-01-31T09:00:00+01:00, ...Z.")
@click.option("--id", "message_id", default=None, help="The message id (default: a random one).")
@url_option()
def send(
    *,
    task: str,
    args: tuple[str, ...],
    kw_items: tuple[str, ...],
    queue: str | None,
    app_spec: str | None,
    delay: float | None,
    at: datetime | None,
    message_id: str | None,
    url: str | None,
) -> None:
    """Put the message that runs TASK(*ARGS, **kw) on a worker: the task envelope
    {"task": TASK, "args": [...], "kwargs": {...}} that App workers run. Each ARG is
    JSON when it parses as JSON (42, true, "quoted text", [1, 2]), else plain text.
    With --app, arguments the task's function cannot take are refused (exit 1).
    Print the message id; sending the same --id twice runs the task once (the second
    send keeps the first message, and stderr says so)."""
    due = _due(delay, at, required=False)
    kwargs: dict[str, Any] = {}
    for item in kw_items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint="'--kw'")
        kwargs[name] = _argument_value(value)
    values = [_argument_value(a) for a in args]
    max_attempts = None
    if app_spec is not None:
        from ..runtime import BadArguments  # noqa: PLC0415
        from ._worker import load_app  # noqa: PLC0415

        defined = load_app(app_spec).tasks.get(task)
        if defined is None:
            raise click.UsageError(f"{app_spec} has no task {task!r}")
        try:
            defined.check_arguments(tuple(values), kwargs)
        except BadArguments as exc:
            raise CliError(str(exc)) from None
        queue = queue or defined.queue
        max_attempts = defined.max_attempts
    elif queue is None:
        click.echo(
            f"warning: without --app or --queue the message goes to queue "
            f"{DEFAULT_QUEUE_NAME!r}: a worker reads {task!r} from its task's queue "
            f"(give --app MODULE:ATTR, or --queue)",
            err=True,
        )
    payload = {"task": task, "args": values, "kwargs": kwargs}
    name = queue or DEFAULT_QUEUE_NAME
    with open_queue(resolve_url(url), name, create=True) as q:
        result = q.put_outcome(
            payload, id=message_id, max_attempts=max_attempts, headers=_traced({}), **due
        )
    _echo_put(result, name, "it runs once")


@click.command(short_help="Remove a waiting or dead message.")
@click.argument("queue")
@click.argument("message_id", metavar="ID")
@url_option()
def cancel(*, queue: str, message_id: str, url: str | None) -> None:
    """Remove the message ID of QUEUE unless a worker holds it (exit 1 if it was not
    removed)."""
    target = resolve_url(url)
    with open_queue(target, queue) as q:
        if not q.cancel(message_id):
            raise _explain_refusal(q, message_id, "be cancelled")
    _console().print(f"cancelled {message_id!r} in queue {queue!r}")


@click.command(short_help="Move a waiting message to a new due time.")
@click.argument("queue")
@click.argument("message_id", metavar="ID")
@duration_option("--delay", help="Due this long from now: 1h, 90s, 250ms...", negative_is_now=True)
@at_option("Due at this ISO 8601 time with its offset (...Z, ...+01:00).")
@url_option()
def reschedule(
    *, queue: str, message_id: str, delay: float | None, at: datetime | None, url: str | None
) -> None:
    """Make the scheduled or ready message ID of QUEUE due after --delay or at --at."""
    due = _due(delay, at, required=True)
    target = resolve_url(url)
    with open_queue(target, queue) as q:
        if not q.reschedule(message_id, **due):
            raise _explain_refusal(q, message_id, "be rescheduled")
        msg = q.get(message_id)
    when = (
        "" if msg is None else f": due {relative(msg.due_at, _now_ms())} ({format_ms(msg.due_at)})"
    )
    _console().print(f"rescheduled {message_id!r} in queue {queue!r}{when}")


# -- get --------------------------------------------------------------------------------


def _message_panel(msg: Message) -> Panel:
    now = _now_ms()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("state", Text(msg.state.value, style=_STATE_STYLE.get(msg.state, "")))
    grid.add_row("due", f"{relative(msg.due_at, now)}  ({format_ms(msg.due_at)})")
    grid.add_row("attempts", f"{msg.attempts} of {msg.max_attempts}")
    if msg.lease_expires_at is not None:
        grid.add_row("lease until", format_ms(msg.lease_expires_at))
    for key, value in msg.headers.items():
        grid.add_row(f"header {key}", value)
    if msg.last_error is not None:
        grid.add_row("last error", Text(user_traceback(msg.last_error), style="red"))
    body: Any = _unreadable(msg)
    if body is None and isinstance(msg.payload, bytes):
        body = Text(f"{len(msg.payload)} raw bytes: {msg.payload[:200]!r}")
    elif body is None:
        body = JSON.from_data(msg.payload, default=str)
    return Panel(
        Group(grid, Text("payload", style="bold"), body),
        title=f"[bold]{msg.id}[/] in {msg.queue}",
        title_align="left",
        expand=False,
    )


_STATE_STYLE = {
    State.SCHEDULED: "cyan",
    State.READY: "green",
    State.ACTIVE: "yellow",
    State.DEAD: "red",
}


@click.command(short_help="Show one message.")
@click.argument("queue")
@click.argument("message_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the message as JSON on stdout.")
@url_option()
def get(*, queue: str, message_id: str, as_json: bool, url: str | None) -> None:
    """Show the message ID of QUEUE: state, due time, attempts, headers, last error
    and payload (exit 1 if there is none)."""
    target = resolve_url(url)
    with open_queue(target, queue) as q:
        msg = q.get(message_id)
    if msg is None:
        raise CliError(f"no message {message_id!r} in queue {queue!r}")
    if as_json:
        _print_json(message_data(msg))
    else:
        _console().print(_message_panel(msg))


# -- stats ----------------------------------------------------------------------------


def _pause(seconds: float) -> None:
    """Sleep between two refreshes of ``stats --watch`` (tests replace it)."""
    time.sleep(seconds)


def _queue_names(url: str, given: Sequence[str]) -> tuple[list[str], str | None]:
    """The queues to show (those named, else every queue of the store that holds a
    message, else ``default``) and a note for the caption (none)."""
    if given:
        return list(dict.fromkeys(given)), None
    with open_queue(url, DEFAULT_QUEUE_NAME) as probe:
        names = probe.queues()
    return (names or [DEFAULT_QUEUE_NAME]), None


def _stats_table(
    rows: Sequence[tuple[str, Stats]], now_ms: int, caption: str | None, error: str | None
) -> Table:
    table = Table(
        title=f"delayq queues at {format_ms(now_ms, 'seconds')}",
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("queue", style="bold")
    for column in ("scheduled", "ready", "active", "dead"):
        table.add_column(column, justify="right", style=_STATE_STYLE[State(column)])
    table.add_column("next due", no_wrap=True)
    table.add_column("lag", justify="right")
    for name, snapshot in rows:
        due = snapshot.next_due_at
        lag = snapshot.lag
        table.add_row(
            name,
            str(snapshot.scheduled),
            str(snapshot.ready),
            str(snapshot.active),
            str(snapshot.dead),
            "-" if due is None else f"{relative(due, now_ms)}\n{format_ms(due, 'seconds')}",
            Text(format_seconds(lag), style="red" if lag >= 1.0 else "") if lag > 0 else "0",
        )
    notes = [Text(caption, style="dim")] if caption else []
    if error:
        notes.append(Text(f"error: {error}", style="bold red"))
    if notes:
        table.caption = Text("\n").join(notes)
    return table


@click.command(short_help="Counts per state, next due time and lag, per queue.")
@click.argument("queues", nargs=-1, metavar="[QUEUE]...")
@click.option("--watch", is_flag=True, help="Refresh the table until Ctrl-C.")
@duration_option("--interval", default=1.0, help="Time between two refreshes of --watch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout (a line per refresh).")
@url_option()
def stats(
    *, queues: tuple[str, ...], watch: bool, interval: float, as_json: bool, url: str | None
) -> None:
    """Scheduled, ready, active and dead messages of each QUEUE, the next due time
    and the lag (how overdue the oldest ready message is). Without QUEUE: every queue
    that holds a message, else "default"."""
    if interval <= 0:
        raise click.BadParameter("must be > 0", param_hint="'--interval'")
    target = resolve_url(url)
    names, note = _queue_names(target, queues)
    console = _console()
    with ExitStack() as stack:
        opened = [stack.enter_context(open_queue(target, name)) for name in names]

        def snapshot() -> list[tuple[str, Stats]]:
            with translate_errors(target):
                return [(q.name, q.stats()) for q in opened]

        if as_json:
            _until_reader_leaves(lambda: _stats_json(snapshot, watch, interval))
        elif not watch:
            console.print(_stats_table(snapshot(), _now_ms(), note, None))
        elif console.is_terminal:
            _stats_live(console, snapshot, interval, note)
        else:
            _until_reader_leaves(lambda: _stats_lines(console, snapshot, interval, note))


def _until_reader_leaves(watch: Callable[[], None]) -> None:
    """Run ``watch``, which writes to stdout until Ctrl-C; a reader that goes away
    (``| head -3``) ends it with status 1 and nothing on stderr, as rich does for the
    table, rather than as an error of the queue (the open queue takes any OSError for
    one)."""
    try:
        watch()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that the
        # flush of what is left cannot fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(1) from None


Snapshot = Callable[[], list[tuple[str, Stats]]]


def _stats_json(snapshot: Snapshot, watch: bool, interval: float) -> None:
    while True:
        _print_json([stats_data(name, snap) for name, snap in snapshot()])
        if not watch:
            return
        try:
            _pause(interval)
        except KeyboardInterrupt:
            return


def _stats_live(console: Console, snapshot: Snapshot, interval: float, note: str | None) -> None:
    """Redraw the table every ``interval`` until Ctrl-C; a failed refresh shows its
    error under the last good numbers and the watch goes on."""
    rows: list[tuple[str, Stats]] = snapshot()
    with Live(
        _stats_table(rows, _now_ms(), note, None), console=console, auto_refresh=False
    ) as live:
        try:
            while True:
                _pause(interval)
                error = None
                try:
                    rows = snapshot()
                except CliError as exc:
                    error = exc.format_message()
                live.update(_stats_table(rows, _now_ms(), note, error), refresh=True)
        except KeyboardInterrupt:
            pass


def _stats_lines(console: Console, snapshot: Snapshot, interval: float, note: str | None) -> None:
    """``stats --watch`` on a pipe or a file: print the table again every
    ``interval`` (a redraw in place needs a terminal) until Ctrl-C; a failed refresh
    prints its error and the watch goes on."""
    try:
        while True:
            try:
                console.print(_stats_table(snapshot(), _now_ms(), note, None))
            except CliError as exc:
                console.print(Text(f"error: {exc.format_message()}", style="bold red"))
            console.file.flush()
            _pause(interval)
    except KeyboardInterrupt:
        pass


# -- ls, dead, purge ----------------------------------------------------------------------


def _short(value: Any, width: int = 60) -> str:
    text = (
        repr(value)
        if isinstance(value, bytes)
        else json.dumps(value, ensure_ascii=False, default=str)
    )
    return text if len(text) <= width else text[: width - 1] + "…"


@click.command(short_help="List the messages of a queue: waiting, in flight or dead.")
@click.argument("queue")
@click.option(
    "--state",
    type=click.Choice(_STATES),
    default=None,
    help="Only the messages in this state (default: the waiting ones, ready and "
    "scheduled, in the order a worker takes them).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_PEEK_LIMIT),
    default=DEFAULT_PEEK_LIMIT,
    show_default=True,
    help="List at most this many.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON on stdout.")
@url_option()
def ls(*, queue: str, state: str | None, limit: int, as_json: bool, url: str | None) -> None:
    """List the messages of QUEUE without changing anything: the waiting ones by
    default (earliest due first), or those in --state (in flight: by lease expiry)."""
    with open_queue(resolve_url(url), queue) as q:
        messages = q.peek(state, limit)
        snapshot = q.stats()
    if as_json:
        _print_json([message_data(msg) for msg in messages])
        return
    which = "waiting" if state is None else state
    total = snapshot.ready + snapshot.scheduled if state is None else getattr(snapshot, state)
    if not messages:
        _console().print(f"no {which} messages in queue {queue!r}")
        return
    now = _now_ms()
    table = Table(title=f"{which} messages of {queue!r}", title_justify="left")
    for column in ("id", "state", "due", "attempts", "lease until", "payload"):
        table.add_column(column, overflow="fold")
    for msg in messages:
        lease = msg.lease_expires_at
        table.add_row(
            msg.id,
            Text(msg.state.value, style=_STATE_STYLE.get(msg.state, "")),
            f"{relative(msg.due_at, now)} ({format_ms(msg.due_at)})",
            f"{msg.attempts}/{msg.max_attempts}",
            "" if lease is None else format_ms(lease),
            _unreadable(msg) or _short(msg.payload),
        )
    table.caption = f"{len(messages)} shown of {total} {which}"
    _console().print(table)


@click.command(short_help="List dead messages, or make them ready again.")
@click.argument("queue")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_DEAD_LIMIT,
    show_default=True,
    help="List at most this many (oldest first).",
)
@click.option(
    "--retry",
    "retry_ids",
    multiple=True,
    metavar="all|ID",
    help="Make dead messages ready now with attempts reset: all, or an ID (repeatable).",
)
@click.option(
    "--traceback",
    "tracebacks",
    is_flag=True,
    help="Print each one's last error with its traceback (the handler's frames).",
)
@click.option(
    "--full",
    is_flag=True,
    help="Like --traceback, with the whole stored text (delayq's own frames too).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON on stdout.")
@url_option()
def dead(
    *,
    queue: str,
    limit: int,
    retry_ids: tuple[str, ...],
    tracebacks: bool,
    full: bool,
    as_json: bool,
    url: str | None,
) -> None:
    """List the dead messages of QUEUE (out of attempts, or discarded), or with --retry
    give them another chance. The list shows each last error's first line and where
    the handler's own code raised it; --traceback prints the tracebacks, --full and
    --json the whole stored text."""
    target = resolve_url(url)
    if retry_ids:
        _retry(target, queue, retry_ids)
        return
    with open_queue(target, queue) as q:
        messages = q.dead(limit)
        total = q.stats().dead
    if as_json:
        _print_json([message_data(msg) for msg in messages])
        return
    if not messages:
        _console().print(f"no dead messages in queue {queue!r}")
        return
    if tracebacks or full:
        _print_errors(messages, full=full)
        return
    table = Table(title=f"dead messages of {queue!r}", title_justify="left")
    for column in ("id", "attempts", "last error", "payload"):
        table.add_column(column, overflow="fold")
    for msg in messages:
        table.add_row(
            msg.id,
            f"{msg.attempts}/{msg.max_attempts}",
            Text(short_error(msg.last_error or ""), style="red"),
            _unreadable(msg) or _short(msg.payload),
        )
    table.caption = f"{len(messages)} shown of {total} dead (--traceback: their tracebacks)"
    _console().print(table)


def _print_errors(messages: Sequence[Message], *, full: bool) -> None:
    """Each message's id and attempts, then its last error: the handler's frames of
    its traceback, or the whole stored text with ``full``."""
    console = _console()
    for msg in messages:
        title = Text(f"{msg.id}  ({msg.attempts}/{msg.max_attempts} attempts)")
        width = min(console.width, max(_RULE_WIDTH, title.cell_len + 4))
        console.print(Rule(title, align="left"), width=width)
        error = msg.last_error or "(no error recorded)"
        console.print(Text(error if full else user_traceback(error), style="red"), soft_wrap=True)


def _retry(url: str, queue: str, retry_ids: Sequence[str]) -> None:
    retry_all = "all" in retry_ids
    if retry_all and len(set(retry_ids)) > 1:
        raise click.BadParameter("give 'all' or message ids, not both", param_hint="'--retry'")
    ids = None if retry_all else list(dict.fromkeys(retry_ids))
    with open_queue(url, queue) as q:
        count = q.retry_dead(ids)
    _console().print(f"{count} dead message(s) of {queue!r} made ready")
    if ids is not None and count < len(ids):
        raise CliError(
            f"{len(ids) - count} of the {len(ids)} ids are not dead messages of {queue!r}"
        )


@click.command(short_help="Remove the messages of a queue (asks first).")
@click.argument("queue")
@click.option(
    "--state",
    type=click.Choice(_STATES),
    default=None,
    help="Only the messages in this state (default: all, in flight included).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@url_option()
def purge(*, queue: str, state: str | None, yes: bool, url: str | None) -> None:
    """Remove every message of QUEUE, or those in --state; asks for confirmation
    unless --yes (no answer, or not "y", removes nothing and exits 1)."""
    target = resolve_url(url)
    chosen = None if state is None else State(state)
    with open_queue(target, queue) as q:
        if not yes:
            snapshot = q.stats()
            count = snapshot.total if chosen is None else getattr(snapshot, chosen.value)
            if count == 0:
                _console().print(f"nothing to purge in queue {queue!r}")
                return
            which = "" if chosen is None else f"{chosen.value} "
            try:
                confirmed = click.confirm(
                    f"remove {count} {which}message(s) of queue {queue!r} at {redact_url(target)}?",
                    err=True,
                )
            except click.Abort:  # no answer (end of input)
                click.echo(err=True)
                confirmed = False
            if not confirmed:
                raise CliError("nothing purged: not confirmed (--yes skips the question)")
        removed = q.purge(chosen)
    _console().print(f"purged {removed} message(s) of queue {queue!r}")


#: Every command of this module, in the order ``delayq --help`` lists them.
QUEUE_COMMANDS = (put, send, get, ls, cancel, reschedule, stats, dead, purge)
