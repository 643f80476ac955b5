"""The dashboard of ``delayq serve``: server-rendered pages plus a little JavaScript.

Every page is complete HTML rendered here from :class:`ServerState` (Jinja2 with
autoescaping on), so without a token reading works without JavaScript and without
the ``/v1`` API.
``static/dashboard.js`` then keeps the numbers fresh from the API and drives the
buttons (cancel, reschedule, retry), sending ``X-Requested-With: delayq-dashboard``.

When the server has a token, every page needs a live session (a signed value that
expires and that ``POST /logout`` ends; see :class:`~._auth.Sessions`) in the
:data:`~._auth.SESSION_HEADER` header, or an ``Authorization: Bearer`` header. The
session is no cookie (a browser sends cookies to every port of the host): the login
answers a page that hands it to the script, which keeps it in the origin's
``localStorage`` and sends it with its own requests. A page navigated to carries no
header, so it redirects to ``/login``; the login page's script then fetches the page
with the session and shows it in place (or shows the form when there is none). Wrong
tokens in the login form count against the client's address like wrong bearer tokens
(429 past the burst).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import shlex
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import jinja2
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from .._log import log_event, log_raised
from ..durable import AsyncQueue, Message, State
from ..durable.registry import redact_url
from ..durable.traceback import user_traceback
from ..errors import QueueClosed
from ._auth import SESSION_HEADER, AttemptThrottle, Sessions, client_key, token_matches
from ._budget import fetch_page, per_message, position
from ._config import check_queue_name
from ._constants import (
    DASHBOARD_CHART_BUCKETS,
    DASHBOARD_CHART_HORIZON,
    DASHBOARD_LIST_LIMIT,
    DASHBOARD_MAX_LOGIN_BODY,
    DASHBOARD_REFRESH_MS,
    SERVE_ANSWER_BUDGET,
)
from ._lag import stats_json, stats_json_many
from ._state import ServerState, message_to_json

__all__ = [
    "PageRoute",
    "chart_bars",
    "first_message_hints",
    "format_duration",
    "format_relative",
    "format_utc",
    "format_when",
    "is_signed_in",
    "message_href",
    "mount_static",
    "payload_preview",
    "reachable_by_api",
    "router",
    "safe_next",
    "server_state",
]

_HERE = Path(__file__).parent
_STATIC_DIR = _HERE / "static"


class PageRoute(APIRoute):
    """A dashboard route: what it fails with is an HTML page, not the API's JSON.

    A backend that does not answer (the exceptions of ``app.state.delayq_outages``) or a
    server that is stopping is a 503 "backend unavailable" page with
    ``Retry-After``; anything else unexpected is logged with its traceback and is a
    500 page. HTTP and validation errors go on to the app's handlers.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except (StarletteHTTPException, RequestValidationError):
                raise
            except Exception as exc:
                if isinstance(exc, (QueueClosed, *request.app.state.delayq_outages)):
                    text = " ".join(str(exc).split())[:200] or type(exc).__name__
                    path = request.url.path
                    log_event(logging.WARNING, "dashboard.unavailable", path=path, error=text)
                    page = _error_page(request, 503, stopping=isinstance(exc, QueueClosed))
                    page.headers["Retry-After"] = _RETRY_AFTER
                    return page
                log_raised(logging.ERROR, "dashboard.failed", exc, path=request.url.path)
                return _error_page(request, 500, stopping=False)

        return page_handler


#: The dashboard's routes; ``create_app`` includes them (they stay out of the OpenAPI
#: document, which describes the ``/v1`` API only).
router = APIRouter(include_in_schema=False, route_class=PageRoute)

# Pages load scripts and styles from /static only: no inline script, no inline style.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
# Seconds a browser is asked to wait before it tries a 503 page again.
_RETRY_AFTER = "5"

# Chart geometry (SVG user units); static/dashboard.js draws the same chart.
_CHART_WIDTH = 1000
_CHART_PLOT_TOP = 18
_CHART_PLOT_HEIGHT = 106
_CHART_HEIGHT = 146
_CHART_GAP = 3
_CHART_TICKS = 4


def server_state(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request`` (``app.state.delayq``)."""
    state = getattr(request.app.state, "delayq", None)
    if not isinstance(state, ServerState):
        raise RuntimeError("the app has no ServerState: set app.state.delayq")
    return state


def mount_static(app: FastAPI) -> None:
    """Serve the dashboard's stylesheet and script at ``/static``."""
    app.mount("/static", StaticFiles(directory=_STATIC_DIR), name="static")


def _static_version() -> str:
    digest = hashlib.sha256()
    for name in ("dashboard.css", "dashboard.js"):
        digest.update((_STATIC_DIR / name).read_bytes())
    return digest.hexdigest()[:12]


# -- formatting (mirrored by static/dashboard.js) ---------------------------------------


def format_duration(seconds: float) -> str:
    """A non-negative duration for people: ``"350ms"``, ``"42s"``, ``"4m 12s"``, ``"2h 5m"``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms" if seconds > 0 else "0s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next(i for i, (value, _) in enumerate(parts) if value)
    shown = [f"{value}{unit}" for value, unit in parts[first : first + 2] if value]
    return " ".join(shown)


def format_relative(target_ms: int, now_ms: float) -> str:
    """``target_ms`` seen from ``now_ms``: ``"in 4m 12s"``, ``"3s ago"`` or ``"now"``."""
    delta = (target_ms - now_ms) / 1000.0
    if abs(delta) < 1:
        return "now"
    text = format_duration(abs(delta))
    return f"in {text}" if delta > 0 else f"{text} ago"


#: Times further than this from now (seconds) are shown as a date, not "in 1156d 19h".
RELATIVE_LIMIT = 3 * 86400
#: Characters of a payload shown in the waiting list.
PREVIEW_CHARS = 80


def format_utc(epoch_ms: int, *, seconds: bool = True) -> str:
    """An absolute time as the dashboard shows every one: ``"2026-12-01 14:02:33 UTC"``
    (``"2026-12-01 14:02 UTC"`` without ``seconds``)."""
    moment = dt.datetime.fromtimestamp(epoch_ms / 1000.0, dt.timezone.utc)
    text = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d} "
        f"{moment.hour:02d}:{moment.minute:02d}"
    )
    if seconds:
        text += f":{moment.second:02d}"
    return text + " UTC"


def format_when(target_ms: int, now_ms: float) -> str:
    """``target_ms`` for people: relative when it is within :data:`RELATIVE_LIMIT` of
    ``now_ms`` (``"in 4m 12s"``), else the date in UTC (``"2030-01-05 14:00 UTC"``)."""
    if abs(target_ms - now_ms) >= RELATIVE_LIMIT * 1000:
        return format_utc(target_ms, seconds=False)
    return format_relative(target_ms, now_ms)


def payload_preview(body: dict[str, Any]) -> str:
    """The start of a message's payload (``body`` from ``message_to_json``) on one
    line: compact JSON cut at :data:`PREVIEW_CHARS` characters, or what it is when
    it is not JSON. Plain text: the template (or the script) escapes it."""
    if "payload_error" in body:
        return "(cannot be shown)"
    if "payload_base64" in body:
        encoded = str(body["payload_base64"])
        size = len(encoded) * 3 // 4 - (len(encoded) - len(encoded.rstrip("=")))
        return f"({size} bytes)"
    text = json.dumps(body["payload"], ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def reachable_by_api(message_id: str) -> bool:
    """Whether the ``/v1`` routes of one message can name ``message_id`` in their path:
    ``.`` and ``..`` are dropped by every URL parser (a put refuses them; an older
    version stored them). Such ids have a page, but no cancel or reschedule button."""
    return message_id not in (".", "..")


def message_href(base: str, queue: str, message_id: str) -> str:
    """The dashboard page of one message: ``/queues/Q/messages/ID`` with both parts
    percent-encoded, or ``/queues/Q/message?id=ID`` for the ids ``.`` and ``..``, which
    no URL path can carry."""
    if message_id in (".", ".."):
        return f"{base}/queues/{_url_part(queue)}/message?" + urlencode({"id": message_id})
    return f"{base}/queues/{_url_part(queue)}/messages/{_url_part(message_id)}"


def _iso(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return ""
    moment = dt.datetime.fromtimestamp(epoch_ms / 1000.0, dt.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _url_part(value: str) -> str:
    return quote(value, safe="")


def chart_bars(start_ms: int, bucket_ms: int, counts: list[int]) -> dict[str, Any]:
    """The geometry of the "falls due over the next hour" bar chart.

    One bar per bucket, scaled to the busiest one, each with a tooltip; x-axis ticks
    at each quarter of the horizon. The template draws it as an inline SVG.
    """
    peak = max(counts, default=0)
    slot = _CHART_WIDTH / max(len(counts), 1)
    bars = []
    for index, count in enumerate(counts):
        height = 0.0 if count <= 0 else max(1.5, count / peak * _CHART_PLOT_HEIGHT)
        bucket_start = start_ms + index * bucket_ms
        bars.append(
            {
                "x": round(index * slot + _CHART_GAP / 2, 2),
                "y": round(_CHART_PLOT_TOP + _CHART_PLOT_HEIGHT - height, 2),
                "width": round(max(slot - _CHART_GAP, 1.0), 2),
                "height": round(height, 2),
                "count": count,
                "title": (
                    f"{count} due {format_utc(bucket_start)} to "
                    f"{format_utc(bucket_start + bucket_ms)}"
                ),
            }
        )
    ticks = []
    for tick in range(_CHART_TICKS + 1):
        offset_ms = len(counts) * bucket_ms * tick // _CHART_TICKS
        ticks.append(
            {
                "x": round(_CHART_WIDTH * tick / _CHART_TICKS, 2),
                "label": "now" if tick == 0 else f"+{format_duration(offset_ms / 1000)}",
                "anchor": "start" if tick == 0 else "end" if tick == _CHART_TICKS else "middle",
            }
        )
    return {
        "width": _CHART_WIDTH,
        "height": _CHART_HEIGHT,
        "baseline": _CHART_PLOT_TOP + _CHART_PLOT_HEIGHT,
        "label_y": _CHART_HEIGHT - 4,
        "peak": peak,
        "total": sum(counts),
        "bars": bars,
        "ticks": ticks,
    }


_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters["iso"] = _iso
_templates.filters["duration"] = format_duration
_templates.filters["pretty_json"] = _pretty_json
_templates.filters["urlpart"] = _url_part
_templates.filters["utc"] = format_utc
_templates.filters["preview"] = payload_preview
_templates.filters["user_traceback"] = user_traceback


@jinja2.pass_context
def _when(context: Any, epoch_ms: int) -> Markup:
    """A ``<time>``: relative or a date (:func:`format_when`), the full UTC time as
    its tooltip; the script keeps the text current."""
    return Markup('<time datetime="{}" title="{}" data-due="{}">{}</time>').format(
        _iso(epoch_ms), format_utc(epoch_ms), epoch_ms, format_when(epoch_ms, context["now_ms"])
    )


@jinja2.pass_context
def _message_href(context: Any, queue: str, message_id: str) -> str:
    return message_href(context["base"], queue, message_id)


def _lag_cell(stats: dict[str, Any]) -> Markup:
    """A queue's work lag; when a cron tick has waited longer, a note saying so (the
    tick is no overdue work: a worker started runs it once)."""
    text = Markup("{}").format(format_duration(stats["work_lag"]))
    tick_wait = stats["lag"]
    if tick_wait - stats["work_lag"] < 1:
        return text
    return text + Markup(' <span class="tick-note" title="{}">{}</span>').format(
        _TICK_TITLE, f"tick waiting {format_duration(tick_wait)}"
    )


# What the tick note of a lag means (static/dashboard.js says the same).
_TICK_TITLE = (
    "A cron tick (@app.cron, @app.every) waits for a worker: no overdue work. "
    "A worker started runs it once."
)

_templates.globals["lag_cell"] = _lag_cell
_templates.globals["when"] = _when
_templates.globals["message_href"] = _message_href
_templates.globals["reachable_by_api"] = reachable_by_api


# -- sessions ----------------------------------------------------------------------------


def _sessions(request: Request) -> Sessions | None:
    sessions: Sessions | None = request.app.state.delayq_sessions
    return sessions


def is_signed_in(request: Request) -> bool:
    """True when the server has no token, or the request carries a live session (in
    :data:`~._auth.SESSION_HEADER`) or ``Authorization: Bearer <token>`` (compared in
    constant time)."""
    token = server_state(request).config.token
    if token is None:
        return True
    sessions = _sessions(request)
    if sessions is not None and sessions.live(request.headers.get(SESSION_HEADER)):
        return True
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and token_matches(credentials.strip(), token)


def safe_next(target: str | None) -> str:
    """``target`` if it is a path on this site (``/queues/x?y``), else ``"/"``.

    Absolute URLs, scheme-relative ``//host`` and ``/\\host`` (which browsers read as
    ``//host``) and control characters are refused, so the login form cannot be used
    to send someone to another site.
    """
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    if "\\" in target or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in target):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    return target


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _login_redirect(request: Request) -> RedirectResponse | None:
    """A redirect to the login form when the request is not signed in, else None."""
    if is_signed_in(request):
        return None
    here = quote(request.url.path, safe="/:@!$&'()*+,;=-._~")
    if request.url.query:
        here += "?" + request.url.query
    target = f"{_base(request)}/login?" + urlencode({"next": here})
    return RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})


def _error_page(request: Request, status: int, *, stopping: bool) -> HTMLResponse:
    """The page of a failure (500) or of a backend that does not answer (503)."""
    return _render(request, "error.html", status, status=status, stopping=stopping)


def _render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    page = {
        "base": _base(request),
        "now_ms": int(time.time() * 1000),
        "refresh_ms": DASHBOARD_REFRESH_MS,
        "list_limit": DASHBOARD_LIST_LIMIT,
        "chart_horizon": int(DASHBOARD_CHART_HORIZON),
        "chart_buckets": DASHBOARD_CHART_BUCKETS,
        "static_version": _STATIC_VERSION,
        # The app's own state, not through server_state(): an error page renders
        # even when the app has none.
        "has_token": getattr(request.app.state, "delayq_sessions", None) is not None,
        "page": name.removesuffix(".html"),
        "version": __version__,
        **context,
    }
    html = _templates.get_template(name).render(page)
    return HTMLResponse(html, status_code=status_code, headers=_PAGE_HEADERS)


def _servable_queue(request: Request, name: str) -> AsyncQueue | None:
    """The queue ``name``, or None when the server cannot serve that name (see
    ``check_queue_name``) or no page link can carry it (a ``/`` in a name an older
    version stored). A valid name is a queue even while it holds nothing."""
    if "/" in name:
        return None
    try:
        return server_state(request).queue(name)
    except (TypeError, ValueError):
        return None


def _not_a_queue(request: Request, name: str) -> HTMLResponse:
    try:
        check_queue_name(name)
        reason = ""
    except (TypeError, ValueError) as exc:
        reason = str(exc)
    return _render(request, "missing.html", 404, queue=name, message_id=None, reason=reason)


# -- pages -------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request) -> Response:
    """Every queue with its counts per state, next due time and lag. A stored queue
    whose name the server cannot serve (put by another face) is named, not linked."""
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    state = server_state(request)
    queues: list[AsyncQueue] = []
    unservable: list[str] = []
    for name in await state.queue_names():
        queue = _servable_queue(request, name)
        if queue is None:
            unservable.append(name)
        else:
            queues.append(queue)
    stats = await asyncio.gather(*(queue.stats() for queue in queues))
    rows = [{"name": one["name"], "stats": one} for one in await stats_json_many(queues, stats)]
    curl, put = first_message_hints(request)
    return _render(
        request,
        "overview.html",
        queues=rows,
        unservable=unservable,
        hint_curl=curl,
        hint_put=put,
    )


#: What the overview's hint puts: queue, payload, delay.
_HINT = ("default", {"hello": "world"}, "30s")


def first_message_hints(request: Request) -> tuple[str, str]:
    """How to put a first message on this server, as two shell commands: ``curl`` to
    its API at the address the browser used, and ``delayq put`` to its backend (the
    URL's password hidden). With a token, curl sends ``$DELAYQ_TOKEN``."""
    queue, payload, delay = _HINT
    body = json.dumps({"payload": payload, "delay": delay})
    endpoint = f"{str(request.base_url).rstrip('/')}/v1/queues/{queue}/messages"
    curl = [f"curl -X POST {shlex.quote(endpoint)}", "-H 'Content-Type: application/json'"]
    if server_state(request).config.token is not None:
        curl.append('-H "Authorization: Bearer $DELAYQ_TOKEN"')
    curl.append(f"-d {shlex.quote(body)}")
    backend = redact_url(server_state(request).config.url)
    put = shlex.join(
        ["delayq", "put", queue, json.dumps(payload), "--delay", delay, "--url", backend]
    )
    return " \\\n  ".join(curl), put


@router.get("/find")
async def find_message(request: Request, queue: str = "", id: str = "") -> Response:
    """The "find a message by id" form: on to that message's page."""
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    queue, message_id = queue.strip(), id.strip()
    if not queue or not message_id:
        return RedirectResponse(f"{_base(request)}/", status_code=303)
    return RedirectResponse(message_href(_base(request), queue, message_id), status_code=303)


async def _list(handle: AsyncQueue, state: State | None, size: int) -> list[Message]:
    """The first messages of one list of the queue page: :data:`DASHBOARD_LIST_LIMIT`,
    or fewer when their JSON passes a third of the answer budget."""

    async def fetch(count: int, last: Message | None) -> list[Message]:
        after = None if last is None else position(state.value if state else "due", last)
        return await handle.peek(state=state, limit=count, after=after)

    page = await fetch_page(fetch, DASHBOARD_LIST_LIMIT, size, SERVE_ANSWER_BUDGET // 3)
    return page.messages


@router.get("/queues/{queue}", response_class=HTMLResponse)
async def queue_page(request: Request, queue: str) -> Response:
    """One queue: counts, the due-time chart, waiting messages, messages in flight
    and dead letters. Any name the server can serve has a page, empty or not."""
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    handle = _servable_queue(request, queue)
    if handle is None:
        return _not_a_queue(request, queue)
    size = per_message(server_state(request))
    stats, waiting, active, dead, (start_ms, counts) = await asyncio.gather(
        handle.stats(),
        _list(handle, None, size),
        _list(handle, State.ACTIVE, size),
        _list(handle, State.DEAD, size),
        handle.due_counts(horizon=DASHBOARD_CHART_HORIZON, buckets=DASHBOARD_CHART_BUCKETS),
    )
    bucket_ms = int(DASHBOARD_CHART_HORIZON * 1000) // DASHBOARD_CHART_BUCKETS
    return _render(
        request,
        "queue.html",
        queue=queue,
        stats=await stats_json(handle, stats),
        empty=stats.scheduled + stats.ready + stats.active + stats.dead == 0,
        waiting=[message_to_json(msg) for msg in waiting],
        active=[message_to_json(msg) for msg in active],
        dead=[message_to_json(msg) for msg in dead],
        chart=chart_bars(start_ms, bucket_ms, list(counts)),
    )


async def _message_page(request: Request, queue: str, message_id: str) -> Response:
    if (redirect := _login_redirect(request)) is not None:
        return redirect
    handle = _servable_queue(request, queue)
    if handle is None:
        return _not_a_queue(request, queue)
    try:
        msg = await handle.get(message_id)
    except (TypeError, ValueError):
        msg = None
    if msg is None:
        return _render(request, "missing.html", 404, queue=queue, message_id=message_id)
    body = message_to_json(msg)
    if "payload_error" in body:
        payload_text, payload_kind = body["payload_error"], "cannot be shown"
    elif "payload_base64" in body:
        payload_text, payload_kind = body["payload_base64"], "bytes, base64"
    else:
        payload_text, payload_kind = _pretty_json(body["payload"]), "JSON"
    return _render(
        request,
        "message.html",
        queue=queue,
        msg=body,
        payload_text=payload_text,
        payload_kind=payload_kind,
    )


@router.get("/queues/{queue}/messages/{message_id:path}", response_class=HTMLResponse)
async def message_page(request: Request, queue: str, message_id: str) -> Response:
    """One message: state, due time, attempts, lease expiry, last error, headers,
    callback, payload. The id may hold ``/`` (sent as ``%2F``)."""
    return await _message_page(request, queue, message_id)


@router.get("/queues/{queue}/message", response_class=HTMLResponse)
async def message_page_by_query(request: Request, queue: str, id: str = "") -> Response:
    """The same page with the id in the query: for ``.`` and ``..``, which a URL
    path cannot carry (see :func:`message_href`)."""
    if not id:
        return RedirectResponse(f"{_base(request)}/queues/{_url_part(queue)}", status_code=303)
    return await _message_page(request, queue, id)


# -- login -------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str = "/") -> Response:
    """The token form (straight on to ``next`` when no token is needed or already in)."""
    target = safe_next(next)
    if server_state(request).config.token is None or is_signed_in(request):
        return RedirectResponse(_base(request) + target, status_code=303)
    return _render(request, "login.html", next=target, error=None)


# The login form's fields (``token``, ``next``), with room for what a browser or a
# password manager may add; a form of more is refused.
_LOGIN_FIELDS = 8
_TOO_MANY_FIELDS = "The form has too many fields: send the token and where to go next."


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Check the posted token (constant time); on success start a session, handed to
    the script by the page it answers."""
    token = server_state(request).config.token
    sessions = _sessions(request)
    if token is None or sessions is None:
        return RedirectResponse(f"{_base(request)}/", status_code=303)
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > DASHBOARD_MAX_LOGIN_BODY:
            return _render(request, "login.html", 413, next="/", error="The form is too large.")
    # The body is capped above, so reading every field is bounded; the form has two.
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    target = safe_next(fields.get("next", "/"))
    throttle: AttemptThrottle = request.app.state.delayq_throttle
    client = client_key(request.scope)
    if len(pairs) > _LOGIN_FIELDS and "token" not in fields:
        return _render(request, "login.html", 400, next=target, error=_TOO_MANY_FIELDS)
    # From here on the form presents a token: it is an attempt, throttled and counted.
    wait = throttle.retry_after(client)
    if wait > 0:
        page = _render(
            request, "login.html", 429, next=target, error="Too many wrong tokens: wait a while."
        )
        page.headers["Retry-After"] = str(max(1, int(wait + 0.999)))
        return page
    if len(pairs) > _LOGIN_FIELDS:
        throttle.failed(client, via="login", path="/login")
        return _render(request, "login.html", 400, next=target, error=_TOO_MANY_FIELDS)
    if not token_matches(fields.get("token", ""), token):
        throttle.failed(client, via="login", path="/login")
        return _render(request, "login.html", 401, next=target, error="Wrong token.")
    # No cookie: the page hands the session to the script, which keeps it in this
    # origin's storage and goes on to ``target`` (the page is no-store).
    return _render(request, "signed_in.html", session=sessions.start(), next=target)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session sent in :data:`~._auth.SESSION_HEADER` (it stops working,
    even a copy of it), back to the login form. The script forgets it too."""
    sessions = _sessions(request)
    if sessions is not None:
        sessions.end(request.headers.get(SESSION_HEADER))
    target = f"{_base(request)}/login" if sessions is not None else f"{_base(request)}/"
    return RedirectResponse(target, status_code=303)


_STATIC_VERSION = _static_version()
