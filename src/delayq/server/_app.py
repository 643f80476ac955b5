"""The FastAPI application of ``delayq serve``.

:func:`create_app` wires the pieces: the request guard (host, cross-site writes,
header size), token auth, the body limit and the fast path of single puts (ASGI
middleware, outermost first), the JSON error handlers, the ``/v1``
API, ``/healthz`` and ``/metrics``, the dashboard, and a lifespan that opens the
backend and runs the callback dispatcher. :func:`request_stop` tells open long-polls
to return now (the ``serve`` command calls it on SIGINT/SIGTERM, before uvicorn
waits for requests).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from .. import __version__
from ..durable.registry import BASE_OUTAGE_ERRORS, outage_errors
from ..errors import BackendNotInstalled, UnsupportedURL
from ._api import router as api_router
from ._api_queues import ops_router, queues_router
from ._auth import AttemptThrottle, Sessions, TokenAuth
from ._config import ServeConfig
from ._docs import install_docs
from ._errors import install_error_handlers
from ._fastput import FastPut
from ._guard import LongPolls, RequestGuard
from ._head import HeadAsGet
from ._limits import BodyLimit
from ._openapi import install_openapi, operation_id
from ._state import ServerState

__all__ = ["create_app", "request_stop"]

_DESCRIPTION = """\
A durable delay queue over HTTP: put messages due later, cancel or reschedule them by
id, consume them with reserve (long-poll) and ack/nack, or let the server deliver them
to a URL (callbacks). Errors are `{"error": {"code": ..., "message": ...}}`. A server
started with a token needs `Authorization: Bearer <token>` on every operation but
`getHealth` (this document is served without it too); one started without a token
needs none and ignores one sent: this document is the same for both. A POST sends
JSON (`Content-Type: application/json`), `{}` for a body of defaults. Each
operation lists every answer it can give; a method a path does not take is a 405 with
`Allow`, and `OPTIONS` answers 204 with `Allow`.
"""


class _Stopper:
    """The app's "stopping" event and the loop it lives on, settable from any thread
    or a signal handler."""

    def __init__(self) -> None:
        self.event: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.requested = False

    def bind(self) -> asyncio.Event:
        self.event = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        if self.requested:
            self.event.set()
        return self.event

    def set(self) -> None:
        self.requested = True
        if self.event is not None and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.event.set)


def request_stop(app: FastAPI) -> None:
    """Make every waiting reserve of ``app`` return at once (safe from a signal
    handler or another thread); new long-polls return at once too."""
    stopper: _Stopper = app.state.delayq_stopper
    stopper.set()


def _include_dashboard(app: FastAPI) -> None:
    try:
        from ._dashboard import mount_static  # noqa: PLC0415
        from ._dashboard import router as dashboard_router  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover  (until the dashboard lands)
        if exc.name != f"{__package__}._dashboard":
            raise
        return
    app.include_router(dashboard_router)
    mount_static(app)


def _outages(url: str) -> tuple[type[Exception], ...]:
    """What the backend at ``url`` raises when it does not answer (a 503, never a 500)."""
    try:
        return outage_errors(url)
    except (UnsupportedURL, BackendNotInstalled):  # the lifespan refuses it when it opens
        return BASE_OUTAGE_ERRORS


def create_app(config: ServeConfig, *, state: ServerState | None = None) -> FastAPI:
    """The HTTP API (and dashboard) for ``config``.

    The lifespan opens the backend (a :class:`ServerState`, unless ``state`` is given:
    then the caller owns and closes it) and, with ``config.dispatch``, runs the callback
    dispatcher; shutdown stops the dispatcher and closes what it opened.
    """
    stopper = _Stopper()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        own_state = state is None
        server_state = ServerState(config) if state is None else state
        app.state.delayq = server_state
        app.state.delayq_stopping = stopper.bind()
        dispatcher: Any = None
        try:
            if config.dispatch:
                from ._dispatch import Dispatcher  # noqa: PLC0415

                dispatcher = Dispatcher(server_state)
                await dispatcher.start()
            yield {}
        finally:
            stopper.set()
            try:
                if dispatcher is not None:
                    await dispatcher.stop()
            finally:
                if own_state:
                    await server_state.close()

    app = FastAPI(
        title="delayq",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from local files by install_docs
        redoc_url=None,
        servers=[{"url": "/", "description": "The server that serves this document."}],
        license_info={"name": "MIT", "identifier": "MIT"},
        generate_unique_id_function=operation_id,
    )
    install_openapi(app)
    app.state.delayq_stopper = stopper
    sessions = None if config.token is None else Sessions(config.token, config.session_ttl)
    throttle = AttemptThrottle()
    app.state.delayq_sessions = sessions
    app.state.delayq_throttle = throttle
    app.state.delayq_long_polls = LongPolls(config.max_long_polls_per_client)
    if state is not None:
        app.state.delayq = state
    app.state.delayq_outages = _outages(config.url)
    install_error_handlers(app, app.state.delayq_outages)
    app.include_router(api_router)
    app.include_router(queues_router)
    app.include_router(ops_router)
    install_docs(app)
    _include_dashboard(app)
    # Added last = runs first: the guard, then auth before anything reads the body,
    # and the put fast path (the hot route without FastAPI's per-request machinery)
    # after them.
    app.add_middleware(FastPut)
    app.add_middleware(HeadAsGet)
    app.add_middleware(BodyLimit, max_body=config.max_body)
    app.add_middleware(TokenAuth, token=config.token, sessions=sessions, throttle=throttle)
    app.add_middleware(RequestGuard, config=config)
    return app
