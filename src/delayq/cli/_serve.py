"""``delayq serve``: the HTTP API, callback dispatcher and dashboard on uvicorn.

The server modules (FastAPI, uvicorn) are imported when the command runs, so the
rest of the ``delayq`` command works without the ``serve`` extra.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console

from .._constants import (
    DEFAULT_CALLBACK_QUEUE,
    SERVE_CLIENT_TIMEOUT,
    SERVE_DEFAULT_HOST,
    SERVE_DEFAULT_PORT,
    SERVE_MAX_CONCURRENCY,
    SERVE_SESSION_TTL,
)
from .._log import LOGGER_NAME
from ..durable.constants import DEFAULT_QUEUE_NAME
from ..durable.registry import redact_url
from ._common import (
    CliError,
    address,
    check_backend,
    freeze_startup_heap,
    listen,
    resolve_url,
    url_option,
    warn_visible,
)
from ._constants import SERVE_SHUTDOWN_GRACE, STARTUP_CHECK_TIMEOUT
from ._worker import log_format_option, log_formatter

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["serve"]

F = TypeVar("F", bound=Callable[..., Any])


def _log_config(log_format: str) -> dict[str, Any]:
    """uvicorn's log lines (the access log too, with --access-log) and delayq's, on
    stderr through the worker's formatter: text with their time, or JSON."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"delayq": {"()": log_formatter, "log_format": log_format}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "delayq"}},
        "loggers": {
            name: {"handlers": ["stderr"], "level": "INFO", "propagate": False}
            for name in ("uvicorn", LOGGER_NAME)
        },
    }


def _make_server(
    config: Any, app: FastAPI, console: Console, *, access_log: bool, log_format: str
) -> Any:
    """A uvicorn server that prints the dashboard address once it listens, tells
    long-polls to return as soon as SIGINT/SIGTERM arrives, and then exits with 0."""
    import uvicorn  # noqa: PLC0415

    from ..server import request_stop  # noqa: PLC0415
    from ..server.protocol import GuardedHttpToolsProtocol  # noqa: PLC0415

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                port = config.port
                for server in self.servers:
                    for sock in server.sockets:
                        port = sock.getsockname()[1]
                console.print(f"dashboard: {address(config.host, port)}", markup=False)
                freeze_startup_heap()

        def handle_exit(self, sig: int, frame: Any) -> None:
            # Not uvicorn's own: it re-raises the signal after shutdown, so a clean
            # stop would end with "killed by SIGTERM" instead of exit status 0.
            request_stop(app)
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: do not wait for requests
            else:
                self.should_exit = True

    return Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            proxy_headers=bool(config.forwarded_allow_ips),
            forwarded_allow_ips=list(config.forwarded_allow_ips) or None,
            server_header=False,
            access_log=access_log,
            log_config=_log_config(log_format),
            log_level="info",
            lifespan="on",
            # uvloop when importable (the serve extra installs it), and httptools (it
            # too): several times the requests per second of asyncio and h11; the
            # protocol adds a size cap and a deadline to each request's head.
            loop="auto",
            http=GuardedHttpToolsProtocol.limited(client_timeout=config.client_timeout),
            limit_concurrency=config.max_concurrency,
            timeout_graceful_shutdown=int(SERVE_SHUTDOWN_GRACE),
        )
    )


def _first_line(path: Path, option: str) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint=option) from None
    if not lines or not lines[0].strip():
        raise click.BadParameter(f"{path} is empty", param_hint=option)
    return lines[0].strip()


def _secret_file_option(name: str, what: str) -> Callable[[F], F]:
    return click.option(
        name,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help=f"Read the {what} from this file (its first line).",
    )


@click.command(short_help="Serve the queue over HTTP: API, URL callbacks, dashboard, metrics.")
@url_option()
@click.option("--host", default=SERVE_DEFAULT_HOST, show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=SERVE_DEFAULT_PORT,
    show_default=True,
    help="Port to bind (0: any free port).",
)
@click.option(
    "--token",
    envvar="DELAYQ_TOKEN",
    default=None,
    help="Require 'Authorization: Bearer TOKEN' (or the dashboard login); needed to bind "
    "a non-loopback address. Default: $DELAYQ_TOKEN. Other users of the machine can read "
    "a command line: prefer --token-file or the variable.",
)
@_secret_file_option("--token-file", "token")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A name clients reach the server by (the Host header): queue.example.com, "
    "*.example.com, or * for any (repeatable). On loopback only loopback names are "
    "answered unless listed.",
)
@click.option(
    "--forwarded-allow-ips",
    default=None,
    metavar="IPS",
    help="Comma-separated addresses of proxies whose X-Forwarded-For and "
    "X-Forwarded-Proto are believed (the client's address; https makes the session "
    "cookie Secure).",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(1),
    default=SERVE_MAX_CONCURRENCY,
    show_default=True,
    help="Connections and requests served at once; more are answered 503.",
)
@click.option(
    "--client-timeout",
    type=click.FloatRange(0.1, 3600),
    default=SERVE_CLIENT_TIMEOUT,
    show_default=True,
    help="Seconds a client may take to send a request's headers, or each piece of its "
    "body; past it the connection is closed.",
)
@click.option(
    "--session-ttl",
    type=click.FloatRange(60, 366 * 86400),
    default=SERVE_SESSION_TTL,
    show_default=True,
    help="Seconds a dashboard login lasts.",
)
@click.option("--no-dispatch", is_flag=True, help="Do not deliver callbacks from this process.")
@click.option(
    "--callback-queue",
    "callback_queues",
    multiple=True,
    metavar="NAME",
    help=f"A queue whose messages may carry callbacks (repeatable; default: "
    f"{DEFAULT_CALLBACK_QUEUE}).",
)
@click.option(
    "--allow-callback-host",
    "callback_hosts",
    multiple=True,
    metavar="PATTERN",
    help="A host callbacks may go to: api.example.com, *.example.com, with :PORT for that "
    "port or :* for any; without one, only port 80 (http) or 443 (https) "
    "(repeatable; default: none).",
)
@click.option(
    "--allow-loopback-callbacks",
    is_flag=True,
    help="Allow callbacks to loopback addresses (on any port, listed or not).",
)
@click.option(
    "--allow-private-callbacks",
    is_flag=True,
    help="Allow listed callback hosts to resolve to private and other non-public "
    "addresses (10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10, NAT64, ...).",
)
@click.option(
    "--dispatch-prefetch",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    metavar="N",
    help="Callback messages reserved ahead of a free request slot, their leases renewed "
    "while they wait (0: none).",
)
@click.option(
    "--signing-secret",
    envvar="DELAYQ_SIGNING_SECRET",
    default=None,
    help="Key of the callbacks' HMAC-SHA256 signature (default: $DELAYQ_SIGNING_SECRET, "
    "else one made for this run and never shown, which no receiver can verify).",
)
@_secret_file_option("--signing-secret-file", "signing secret")
@click.option("--access-log", is_flag=True, help="Log every request.")
@log_format_option
def serve(
    *,
    url: str | None,
    host: str,
    port: int,
    token: str | None,
    token_file: Path | None,
    allowed_hosts: tuple[str, ...],
    forwarded_allow_ips: str | None,
    max_concurrency: int,
    session_ttl: float,
    client_timeout: float,
    no_dispatch: bool,
    callback_queues: tuple[str, ...],
    callback_hosts: tuple[str, ...],
    allow_loopback_callbacks: bool,
    allow_private_callbacks: bool,
    dispatch_prefetch: int | None,
    signing_secret: str | None,
    signing_secret_file: Path | None,
    access_log: bool,
    log_format: str,
) -> None:
    """Serve the queue at --url over HTTP until SIGINT/SIGTERM.

    The JSON API is under /v1 (OpenAPI at /openapi.json), the dashboard at /,
    Prometheus metrics at /metrics, a health check at /healthz. Messages put with a
    callback are delivered to their URL when due, signed with the signing secret.
    """
    url = resolve_url(url)
    context = click.get_current_context()
    if token_file is not None:
        token = _first_line(token_file, "--token-file")
    elif token and context.get_parameter_source("token") is ParameterSource.COMMANDLINE:
        warn_visible("--token", "--token-file or $DELAYQ_TOKEN")
    if signing_secret_file is not None:
        signing_secret = _first_line(signing_secret_file, "--signing-secret-file")
    elif (
        signing_secret
        and context.get_parameter_source("signing_secret") is ParameterSource.COMMANDLINE
    ):
        warn_visible("--signing-secret", "--signing-secret-file or $DELAYQ_SIGNING_SECRET")
    generated = not signing_secret
    secret = secrets.token_urlsafe(32) if generated else signing_secret
    try:
        from ..server import ServeConfig, create_app  # noqa: PLC0415
    except ImportError as exc:
        raise CliError(
            f"delayq serve needs the serve extra (pip install 'delayq[serve]'): {exc}"
        ) from None
    try:
        config = ServeConfig(
            url=url,
            host=host,
            port=port,
            token=token or None,
            dispatch=not no_dispatch,
            callback_queues=callback_queues or (DEFAULT_CALLBACK_QUEUE,),
            callback_hosts=callback_hosts,
            allow_loopback_callbacks=allow_loopback_callbacks,
            allow_private_callbacks=allow_private_callbacks,
            dispatch_prefetch=dispatch_prefetch,
            signing_secret=secret,
            allowed_hosts=allowed_hosts,
            forwarded_allow_ips=tuple(
                part.strip() for part in (forwarded_allow_ips or "").split(",") if part.strip()
            ),
            max_concurrency=max_concurrency,
            session_ttl=session_ttl,
            client_timeout=client_timeout,
        )
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    listener = listen(host, port)
    # A backend that cannot be reached now is one line and exit 1, before anything is
    # printed, even one that is merely down (Redis not started yet): a server that
    # starts without its store answers nothing but 503s, and a person at `make run`
    # wants the reason rather than a log of retries. A service manager restarts the
    # command with its own backoff (systemd Restart=, Kubernetes, compose `restart:`)
    # and shows the line; an outage after the start is ridden out, not fatal.
    try:
        check_backend(url, DEFAULT_QUEUE_NAME, STARTUP_CHECK_TIMEOUT)
    except BaseException:
        listener.close()
        raise
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"delayq serve: {redact_url(url)}", markup=False)
    # A callback can go only to a listed host, or to loopback with the flag (at put and
    # again at send, see delayq.server._callbacks): with neither, nothing is signed.
    sends = config.dispatch and (config.callback_hosts or config.allow_loopback_callbacks)
    if generated and sends:
        console.print(
            "callbacks are signed with a secret made for this run, not shown: give one "
            "with --signing-secret-file or $DELAYQ_SIGNING_SECRET for receivers to verify",
            markup=False,
        )
    app = create_app(config)
    server = _make_server(config, app, console, access_log=access_log, log_format=log_format)
    with listener:
        server.run(sockets=[listener])
    if not server.started:
        raise CliError(f"the server did not start on {address(host, port)} (see above)")
