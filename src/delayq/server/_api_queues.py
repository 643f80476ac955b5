"""Queue-wide routes of the HTTP API (``/v1/queues...``: list, stats, peek, due
counts, dead letters, purge) and the operational ones (``/healthz``, ``/metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import JSONResponse, Response

from .._constants import (
    DEFAULT_QUEUE_NAME,
    SERVE_HEALTH_TIMEOUT,
    SERVE_MAX_DUE_BUCKETS,
    SERVE_MAX_DUE_HORIZON,
    SERVE_MAX_LIMIT,
)
from .._duration import seconds_to_ms
from .._outage import error_kind, is_outage
from .._runtime import log_event
from ..durable import AsyncQueue, State, Stats
from ._api import KNOWN_QUERY, QueueDep, StateDep, error_docs
from ._errors import error_response, facade_errors
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
from ._state import ServerState, message_to_json

__all__ = ["ops_router", "queues_router"]

#: The content type of the Prometheus text exposition.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

queues_router = APIRouter(
    prefix="/v1", tags=["queues"], responses=error_docs(), dependencies=KNOWN_QUERY
)
# Not /v1: uptime checkers and scrapers may add parameters of their own.
ops_router = APIRouter(tags=["operations"])

Limit = Annotated[int, Query(ge=1, le=SERVE_MAX_LIMIT, description="At most this many.")]


def _stats_json(name: str, stats: Stats) -> dict[str, Any]:
    return {
        "name": name,
        "scheduled": stats.scheduled,
        "ready": stats.ready,
        "active": stats.active,
        "dead": stats.dead,
        "next_due_at": stats.next_due_at,
        "lag": stats.lag,
    }


async def _all_stats(state: ServerState) -> dict[str, Stats]:
    """Stats of every queue the backend knows (names it cannot serve are left out)."""
    queues: list[AsyncQueue] = []
    for name in await state.queue_names():
        with contextlib.suppress(TypeError, ValueError):
            queues.append(state.queue(name))
    snapshots = await asyncio.gather(*(queue.stats() for queue in queues))
    return {queue.name: stats for queue, stats in zip(queues, snapshots, strict=True)}


@queues_router.get("/queues", response_model=QueueList)
async def list_queues(state: StateDep) -> dict[str, Any]:
    """Every queue that holds messages (and the callback queues), with its counts
    per state, next due time and lag."""
    everything = await _all_stats(state)
    return {"queues": [_stats_json(name, stats) for name, stats in everything.items()]}


@queues_router.get("/queues/{queue}/stats", response_model=QueueStats)
async def queue_stats(queue: QueueDep) -> dict[str, Any]:
    """Counts per state, the next due time (epoch ms) and the lag (seconds)."""
    with facade_errors():
        stats = await queue.stats()
    return _stats_json(queue.name, stats)


@queues_router.get("/queues/{queue}/messages", response_model=MessageList)
async def peek_messages(
    queue: QueueDep,
    state: Annotated[StateName | None, Query(description="Only messages in this state.")] = None,
    limit: Limit = LIMIT_DEFAULT,
) -> dict[str, Any]:
    """Messages of the queue without claiming them, next due first."""
    with facade_errors():
        messages = await queue.peek(state=None if state is None else State(state), limit=limit)
    return {"messages": [message_to_json(message) for message in messages]}


@queues_router.get("/queues/{queue}/due", response_model=DueResponse)
async def due_counts(
    queue: QueueDep,
    horizon: Annotated[
        float, Query(gt=0, le=SERVE_MAX_DUE_HORIZON, description="Seconds ahead.")
    ] = 3600.0,
    buckets: Annotated[int, Query(ge=1, le=SERVE_MAX_DUE_BUCKETS)] = 60,
) -> dict[str, Any]:
    """How many scheduled messages fall due in each of ``buckets`` slices of
    ``bucket_ms`` from ``start`` (the backend's now, epoch ms) over the next
    ``horizon`` seconds; ready messages are not counted (see stats)."""
    with facade_errors():
        start, counts = await queue.due_counts(horizon=horizon, buckets=buckets)
    bucket_ms = math.ceil(seconds_to_ms(horizon) / buckets)
    return {"start": start, "bucket_ms": bucket_ms, "counts": list(counts)}


@queues_router.get("/queues/{queue}/dead", response_model=MessageList)
async def dead_messages(queue: QueueDep, limit: Limit = LIMIT_DEFAULT) -> dict[str, Any]:
    """Dead messages (out of attempts, or nacked dead), oldest first."""
    with facade_errors():
        messages = await queue.dead(limit)
    return {"messages": [message_to_json(message) for message in messages]}


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
        await asyncio.wait_for(state.queue(DEFAULT_QUEUE_NAME).stats(), SERVE_HEALTH_TIMEOUT)
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
async def metrics(state: StateDep) -> Response:
    """Prometheus metrics: messages per state per queue, put/ack/nack/dead counters,
    the lateness histogram, callback outcomes, and ``delayq_backend_up``. When the
    backend does not answer, ``delayq_backend_up`` is 0 and the per-queue message
    gauges are left out: the scrape still succeeds."""
    everything: dict[str, Stats] | None = None
    try:
        everything = await asyncio.wait_for(_all_stats(state), SERVE_HEALTH_TIMEOUT)
    except Exception as exc:
        if not is_outage(exc):
            raise
        kind = error_kind(exc)
        log_event(logging.WARNING, "metrics.backend_unavailable", error=kind, detail=str(exc))
        state.note_backend(kind)
    else:
        state.note_backend(None)
    return Response(state.metrics.render(everything), media_type=METRICS_CONTENT_TYPE)
