"""Queue-wide routes of the HTTP API (``/v1/queues...``: list, stats, peek, due
counts, dead letters, purge) and the operational ones (``/healthz``, ``/metrics``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, Response

from .._duration import seconds_to_ms
from .._log import log_event
from .._timeout import within
from ..durable import AsyncQueue, Message, State, Stats
from ..durable.constants import DEFAULT_QUEUE_NAME
from ..runtime.outage import error_kind
from ._api import KNOWN_QUERY, QueueDep, StateDep, error_docs, state_of
from ._budget import Page, fetch_page, messages_answer, per_message, position
from ._constants import (
    SERVE_HEALTH_TIMEOUT,
    SERVE_MAX_DUE_BUCKETS,
    SERVE_MAX_DUE_HORIZON,
    SERVE_MAX_LIMIT,
)
from ._errors import ApiError, error_response, facade_errors
from ._lag import stats_json, stats_json_many
from ._limits import JsonRoute
from ._models import (
    LIMIT_DEFAULT,
    DeadRetryRequest,
    DueResponse,
    ErrorResponse,
    HealthResponse,
    MessageList,
    PurgeRequest,
    PurgeResponse,
    QueueList,
    QueueStats,
    RetriedResponse,
    StateName,
)
from ._state import ServerState

__all__ = ["ops_router", "queues_router"]

#: The content type of the Prometheus text exposition.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

queues_router = APIRouter(
    prefix="/v1",
    tags=["queues"],
    responses=error_docs(),
    dependencies=KNOWN_QUERY,
    route_class=JsonRoute,
)
# Not /v1: uptime checkers and scrapers may add parameters of their own.
ops_router = APIRouter(tags=["operations"])

Limit = Annotated[
    int, Query(ge=1, le=SERVE_MAX_LIMIT, description="A count: at most this many messages.")
]
Cursor = Annotated[
    str | None,
    Query(
        max_length=200,
        description="The next_cursor of the previous page (opaque); none: the first page.",
    ),
]
# What a cursor's position is of: an order. Waiting, ready and scheduled messages
# share one (due time, then seq): their cursors are interchangeable.
_ORDER = {None: "due", "ready": "due", "scheduled": "due", "active": "active", "dead": "dead"}


def _next_cursor(kind: str, page: Page, limit: int) -> str | None:
    """The cursor after the last message of ``page``, or None when the page is not
    full (the list ended) and its byte budget did not cut it."""
    messages = page.messages
    if len(messages) < limit and not page.cut:
        return None
    text = json.dumps([kind, *position(kind, messages[-1])], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _after(kind: str, cursor: str | None) -> tuple[int, ...] | None:
    """The position a ``cursor`` of the list ``kind`` names (422 ``invalid_cursor``
    for one that is not a cursor of that list)."""
    if cursor is None:
        return None
    size = 1 if kind == "dead" else 2
    try:
        decoded = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except ValueError:
        decoded = None
    if (
        not isinstance(decoded, list)
        or len(decoded) != size + 1
        or decoded[0] != kind
        or not all(type(part) is int and part >= 0 for part in decoded[1:])
    ):
        raise ApiError(
            422,
            "invalid_cursor",
            f"query.cursor: {cursor!r:.80} is not a cursor of this list (pass the "
            "next_cursor of its previous page, with the same state)",
        )
    return tuple(decoded[1:])


async def _all_stats(state: ServerState) -> dict[str, Stats]:
    """Stats of every queue that holds a message and of the callback queues, empty or
    not (names the server cannot serve are left out): the metrics' series."""
    queues = await _stored_queues(state, callback_queues=True)
    snapshots = await asyncio.gather(*(queue.stats() for queue in queues))
    return {queue.name: stats for queue, stats in zip(queues, snapshots, strict=True)}


async def _stored_queues(state: ServerState, *, callback_queues: bool) -> list[AsyncQueue]:
    queues: list[AsyncQueue] = []
    for name in await state.queue_names(callback_queues=callback_queues):
        with contextlib.suppress(TypeError, ValueError):
            queues.append(state.queue(name))
    return queues


@queues_router.get("/queues", response_model=QueueList)
async def list_queues(state: StateDep) -> dict[str, Any]:
    """Every queue that holds messages (a callback queue too, once it holds one),
    with its counts per state, next due time, lag and work lag."""
    queues = await _stored_queues(state, callback_queues=False)
    snapshots = await asyncio.gather(*(queue.stats() for queue in queues))
    return {"queues": await stats_json_many(queues, snapshots)}


@queues_router.get("/queues/{queue}/stats", response_model=QueueStats)
async def queue_stats(queue: QueueDep) -> dict[str, Any]:
    """Counts per state, the next due time (epoch ms), the lag and the work lag
    (seconds)."""
    with facade_errors():
        stats = await queue.stats()
        return await stats_json(queue, stats)


@queues_router.get("/queues/{queue}/messages", response_model=MessageList)
async def peek_messages(
    queue: QueueDep,
    request: Request,
    state: Annotated[StateName | None, Query(description="Only messages in this state.")] = None,
    limit: Limit = LIMIT_DEFAULT,
    cursor: Cursor = None,
) -> Response:
    """Messages of the queue without claiming them, a page at a time: waiting ones
    (no ``state``), ``ready`` or ``scheduled`` ones by due time then put order,
    ``active`` ones by lease expiry, ``dead`` ones as the dead list. A message moved
    (rescheduled, nacked, retried) may be seen again at its new place; one put
    before the cursor's place is not seen. A page holds at most 4 MiB of messages
    (at least one): past that it ends early, with its ``next_cursor``."""
    kind = _ORDER[state]
    start = _after(kind, cursor)
    chosen = None if state is None else State(state)

    async def fetch(count: int, last: Message | None) -> list[Message]:
        after = start if last is None else position(kind, last)
        return await queue.peek(state=chosen, limit=count, after=after)

    with facade_errors():
        page = await fetch_page(fetch, limit, per_message(state_of(request)))
    return messages_answer(page.parts, next_cursor=_next_cursor(kind, page, limit))


@queues_router.get("/queues/{queue}/due", response_model=DueResponse)
async def due_counts(
    queue: QueueDep,
    horizon: Annotated[
        float,
        Query(gt=0, le=SERVE_MAX_DUE_HORIZON, description="How far ahead to count, in seconds."),
    ] = 3600.0,
    buckets: Annotated[
        int,
        Query(ge=1, le=SERVE_MAX_DUE_BUCKETS, description="A count: the slices of the horizon."),
    ] = 60,
) -> dict[str, Any]:
    """How many scheduled messages fall due in each of ``buckets`` slices of
    ``bucket_ms`` from ``start`` (the backend's now, epoch ms) over the next
    ``horizon`` seconds; ready messages are not counted (see stats)."""
    with facade_errors():
        start, counts = await queue.due_counts(horizon=horizon, buckets=buckets)
    bucket_ms = math.ceil(seconds_to_ms(horizon) / buckets)
    return {"start": start, "bucket_ms": bucket_ms, "counts": list(counts)}


@queues_router.get("/queues/{queue}/dead", response_model=MessageList)
async def dead_messages(
    queue: QueueDep, request: Request, limit: Limit = LIMIT_DEFAULT, cursor: Cursor = None
) -> Response:
    """Dead messages (out of attempts, or nacked dead), oldest first, a page at a
    time (the same order and cursors as peek with ``state=dead``). A page holds at
    most 4 MiB of messages (at least one): past that it ends early, with its
    ``next_cursor``."""
    start = _after("dead", cursor)

    async def fetch(count: int, last: Message | None) -> list[Message]:
        after = start if last is None else position("dead", last)
        return await queue.dead(count, after_seq=None if after is None else after[0])

    with facade_errors():
        page = await fetch_page(fetch, limit, per_message(state_of(request)))
    return messages_answer(page.parts, next_cursor=_next_cursor("dead", page, limit))


@queues_router.post("/queues/{queue}/dead/retry", response_model=RetriedResponse)
async def retry_dead(
    queue: QueueDep, body: Annotated[DeadRetryRequest | None, Body()] = None
) -> dict[str, int]:
    """Make dead messages (those of ``ids``, or all) ready now, attempts reset to 0."""
    ids = None if body is None else body.ids
    with facade_errors():
        retried = await queue.retry_dead(ids)
    return {"retried": retried}


@queues_router.post("/queues/{queue}/purge", response_model=PurgeResponse, name="purge_queue")
async def purge(
    queue: QueueDep, body: Annotated[PurgeRequest | None, Body()] = None
) -> dict[str, int]:
    """Remove every message in ``state`` (null: every message, in flight included)."""
    state = None if body is None or body.state is None else State(body.state)
    with facade_errors():
        purged = await queue.purge(state)
    return {"purged": purged}


@ops_router.get(
    "/healthz",
    response_model=HealthResponse,
    name="get_health",
    responses={503: {"model": ErrorResponse, "description": "The backend does not answer."}},
)
async def healthz(state: StateDep) -> Any:
    """200 when the backend answers (no token needed), else 503. The answer names
    the kind of failure only; its detail (addresses, paths) goes to the log."""
    try:
        await within(state.queue(DEFAULT_QUEUE_NAME).stats(), SERVE_HEALTH_TIMEOUT)
    except Exception as exc:
        kind = error_kind(exc)
        log_event(logging.WARNING, "health.failed", error=kind, detail=str(exc))
        state.note_backend(kind)
        return error_response(
            503, "backend_unavailable", f"the backend does not answer ({kind}): see the log"
        )
    state.note_backend(None)
    return JSONResponse({"status": "ok"})


@ops_router.get(
    "/metrics",
    response_class=Response,
    name="get_metrics",
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition.",
        },
        **error_docs(),
    },
)
async def metrics(request: Request, state: StateDep) -> Response:
    """Prometheus metrics: messages per state per queue, put/ack/nack/dead counters,
    the lateness histogram, callback outcomes, the reserves waiting now
    (``delayq_long_polls``), and ``delayq_backend_up``. When the
    backend does not answer, ``delayq_backend_up`` is 0 and the per-queue message
    gauges are left out: the scrape still succeeds."""
    everything: dict[str, Stats] | None = None
    try:
        everything = await within(_all_stats(state), SERVE_HEALTH_TIMEOUT)
    except Exception as exc:
        if not isinstance(exc, request.app.state.delayq_outages):
            raise
        kind = error_kind(exc)
        log_event(logging.WARNING, "metrics.backend_unavailable", error=kind, detail=str(exc))
        state.note_backend(kind)
    else:
        state.note_backend(None)
    waiting = request.app.state.delayq_long_polls.waiting
    return Response(state.metrics.render(everything, waiting), media_type=METRICS_CONTENT_TYPE)
