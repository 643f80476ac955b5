"""``delayq serve``: the HTTP API, callback dispatcher and dashboard on uvicorn.

The server modules (FastAPI, uvicorn) are imported when the command runs, so the
rest of the ``delayq`` command works without the ``serve`` extra.
"""

from __future__ import annotations

import secrets
import signal
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from ._cli_common import CliError, resolve_url, url_option
from ._constants import (
    DEFAULT_CALLBACK_QUEUE,
    SERVE_DEFAULT_HOST,
    SERVE_DEFAULT_PORT,
    SERVE_SHUTDOWN_GRACE,
)
from ._runtime import freeze_startup_heap

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["serve"]


def _address(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


def _make_server(config: Any, app: FastAPI, console: Console, *, access_log: bool) -> Any:
    """A uvicorn server that prints the dashboard address once it listens, tells
    long-polls to return as soon as SIGINT/SIGTERM arrives, and then exits with 0."""
    import uvicorn  # noqa: PLC0415

    from .server import request_stop  # noqa: PLC0415

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                port = config.port
                for server in self.servers:
                    for sock in server.sockets:
                        port = sock.getsockname()[1]
                console.print(f"dashboard: {_address(config.host, port)}", markup=False)
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
            proxy_headers=False,
            server_header=False,
            access_log=access_log,
            log_level="info",
            lifespan="on",
            # uvloop and httptools when importable (the serve extra installs them):
            # several times the requests per second of asyncio and h11.
            loop="auto",
            http="auto",
            timeout_graceful_shutdown=int(SERVE_SHUTDOWN_GRACE),
        )
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
    "a non-loopback address. Default: $DELAYQ_TOKEN.",
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
    "--signing-secret",
    envvar="DELAYQ_SIGNING_SECRET",
    default=None,
    help="Key of the callbacks' HMAC-SHA256 signature (default: $DELAYQ_SIGNING_SECRET, "
    "else a new one, printed once).",
)
@click.option("--access-log", is_flag=True, help="Log every request.")
def serve(
    *,
    url: str | None,
    host: str,
    port: int,
    token: str | None,
    no_dispatch: bool,
    callback_queues: tuple[str, ...],
    callback_hosts: tuple[str, ...],
    allow_loopback_callbacks: bool,
    allow_private_callbacks: bool,
    signing_secret: str | None,
    access_log: bool,
) -> None:
    """Serve the queue at --url over HTTP until SIGINT/SIGTERM.

    The JSON API is under /v1 (OpenAPI at /openapi.json), the dashboard at /,
    Prometheus metrics at /metrics, a health check at /healthz. Messages put with a
    callback are delivered to their URL when due, signed with the signing secret.
    """
    url = resolve_url(url)
    generated = not signing_secret
    secret = secrets.token_urlsafe(32) if generated else signing_secret
    try:
        from .server import ServeConfig, create_app  # noqa: PLC0415
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
            signing_secret=secret,
        )
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"delayq serve: {url}", markup=False)
    if generated:
        console.print(
            f"signing secret (generated; pass --signing-secret or $DELAYQ_SIGNING_SECRET "
            f"to keep it across restarts): {secret}",
            markup=False,
        )
    app = create_app(config)
    server = _make_server(config, app, console, access_log=access_log)
    server.run()
    if not server.started:
        raise CliError(f"the server did not start on {_address(host, port)} (see above)")
