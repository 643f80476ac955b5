"""The ``/v1`` routes of the HTTP API: put, get, cancel, reschedule by id; reserve
(with long-poll), ack, nack, extend, release by lease token.

Every route validates its whole request before it writes (a 4xx changes nothing) and
answers errors in the ``{"error": {"code", "message"}}`` shape of :mod:`._errors`.
Queue-wide routes (stats, peek, dead letters, purge) are in :mod:`._api_queues`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.convertors import Convertor, register_url_convertor

from .._names import MAX_ID_LENGTH
from ..durable import AsyncQueue, Message, State
from ._budget import Page, chunk, encode_messages, messages_answer, per_message, take
from ._constants import SERVE_ANSWER_BUDGET
from ._convert import due_time, put_arguments, request_trace
from ._errors import ApiError, facade_errors
from ._limits import JsonRoute
from ._models import (
    AckRequest,
    AckResponse,
    BatchPutRequest,
    BatchPutResponse,
    CancelResponse,
    ErrorResponse,
    ExtendRequest,
    ExtendResponse,
    MessageOut,
    NackRequest,
    NackResponse,
    PutRequestBody,
    PutResponse,
    ReleaseResponse,
    RescheduleRequest,
    ReservedList,
    ReserveRequest,
)
from ._state import ServerState, message_to_json

__all__ = [
    "KNOWN_QUERY",
    "QueueDep",
    "StateDep",
    "error_docs",
    "put_one",
    "put_status",
    "queue_named",
    "router",
    "server_state",
    "state_of",
]

_ERROR_TEXT = {
    400: "Malformed JSON.",
    404: "No such message.",
    409: "Conflict: the message is in flight, its id exists, or the lease is lost.",
    413: "The request body or the payload is too large.",
    415: "The request body is not application/json.",
    429: "Too many requests from this address; try again after Retry-After seconds.",
    422: "Invalid request: a field, the queue name, the id, a time or the callback.",
    503: "The server is stopping or the backend does not answer.",
}
_COMMON = (400, 413, 415, 422, 503)


def error_docs(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of error answers: the common ones plus ``statuses``."""
    return {
        status: {"model": ErrorResponse, "description": _ERROR_TEXT[status]}
        for status in sorted({*_COMMON, *statuses})
    }


def state_of(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request``."""
    state: ServerState = request.app.state.delayq
    return state


async def server_state(request: Request) -> ServerState:
    """:func:`state_of` as a dependency.

    ``async`` (like :func:`open_queue`) so FastAPI calls it on the loop: a plain
    ``def`` dependency runs on the thread pool, a hand-off per request."""
    return state_of(request)


StateDep = Annotated[ServerState, Depends(server_state)]
# No length or pattern here: the one rule of delayq._names decides, with the same words
# on every face (the schema still shows the length).
_LENGTH = {"minLength": 1, "maxLength": MAX_ID_LENGTH}
QueueName = Annotated[
    str,
    Path(
        description="The queue: 1 to 255 characters; a put needs a name without control "
        "characters, '{', '}' or '/', not '.' or '..', and no space at either end.",
        json_schema_extra=_LENGTH,
    ),
]
MessageId = Annotated[
    str,
    Path(
        description="The message id (percent-encoded): 1 to 255 characters.",
        json_schema_extra=_LENGTH,
    ),
]


def queue_named(state: ServerState, name: str) -> AsyncQueue:
    """The queue ``name`` of ``state`` (422 ``invalid_queue`` for a bad name)."""
    try:
        return state.queue(name)
    except (TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_queue", str(exc)) from None


async def open_queue(queue: QueueName, request: Request) -> AsyncQueue:
    """The queue named in the path (422 for a bad name)."""
    # The state straight from the request, not through StateDep: a dependency less
    # to solve on every request.
    return queue_named(state_of(request), queue)


QueueDep = Annotated[AsyncQueue, Depends(open_queue)]


class _MessageIdConvertor(Convertor[str]):
    """A message id in a route's path: the rest of the path up to the route's own
    suffix (``/ack``...), slashes (``/`` or ``%2F``) and any character included, so
    every id a queue holds can be named."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("message_id", _MessageIdConvertor())


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route (its dependencies included) takes."""
    names = {param.alias for param in dependant.query_params}
    for dependency in dependant.dependencies:
        names |= _query_names(dependency)
    return names


async def known_query(request: Request) -> None:
    """Refuse query parameters the route does not take (422 naming them), as unknown
    body fields are: ``?limt=5`` must not silently mean the default."""
    if not request.scope.get("query_string"):
        return
    route = request.scope.get("route")
    taken = _query_names(route.dependant) if isinstance(route, APIRoute) else set()
    unknown = sorted(set(request.query_params) - taken)
    if unknown:
        takes = ", ".join(sorted(taken)) or "none"
        raise ApiError(
            422,
            "invalid_request",
            f"query: unknown parameter {', '.join(repr(name) for name in unknown)} "
            f"(this operation takes: {takes})",
        )


#: Every route of the API refuses unknown query parameters.
KNOWN_QUERY = [Depends(known_query)]

router = APIRouter(
    prefix="/v1",
    tags=["messages"],
    responses=error_docs(),
    dependencies=KNOWN_QUERY,
    route_class=JsonRoute,
)


# -- by id -----------------------------------------------------------------------------


def _put_docs(model: type[PutResponse | BatchPutResponse], kept: str) -> dict[int | str, Any]:
    """A put route's answers besides its 201 (the message stored): 200, an existing
    message kept (``kept`` says how), and its errors."""
    docs: dict[int | str, Any] = {200: {"model": model, "description": kept}}
    docs.update(error_docs(409))
    return docs


@router.post(
    "/queues/{queue}/messages",
    status_code=201,
    response_model=PutResponse,
    response_description="The message was stored: a new id, or a replace (created is true).",
    responses=_put_docs(
        PutResponse,
        "The id existed and on_conflict is ignore: that message was kept unchanged "
        "(created is false).",
    ),
)
async def put_message(queue: QueueDep, request: Request, body: PutRequestBody) -> Response:
    """Store one message, due after ``delay`` or at ``at`` (neither: now).

    201 when the message was stored (a new id, or ``on_conflict`` ``"replace"``); 200
    with ``"created": false`` when the id exists and ``on_conflict`` is ``"ignore"``
    (the default): the existing message is kept unchanged. 409 ``duplicate_id`` when
    the id exists and ``on_conflict`` is ``"error"`` (or the message is in flight and
    ``on_conflict`` is ``"replace"``)."""
    # A valid put sent as application/json is answered by FastPut (_fastput.py)
    # with put_one before it gets here; this route answers the others the same way,
    # and every fault. The answer is not validated against PutResponse (which still
    # documents it).
    answer = await put_one(state_of(request), queue, body, request_trace(request.headers.raw))
    return JSONResponse(answer, status_code=put_status(answer["created"]))


def put_status(created: bool) -> int:
    """A put's success status: 201 when it stored a message, 200 when it kept one."""
    return 201 if created else 200


async def put_one(
    state: ServerState, queue: AsyncQueue, body: PutRequestBody, trace: dict[str, str]
) -> dict[str, Any]:
    """Store the message of a valid put request; the answer's body (``PutResponse``).
    ``trace`` is the request's trace context (:func:`~._convert.request_trace`).

    The puts of concurrent requests are batched (:class:`~._coalesce.PutCoalescer`),
    each still told what its own put did."""
    arguments = put_arguments(body, queue.name, state.config, trace)
    with facade_errors():
        result = await state.putter(queue).put(arguments)
    state.metrics.puts.labels(queue.name).inc()
    return {"id": result.id, "queue": queue.name, "created": result.created}


@router.post(
    "/queues/{queue}/messages/batch",
    status_code=201,
    response_model=BatchPutResponse,
    response_description="At least one item stored its message (created is true for it).",
    responses=_put_docs(
        BatchPutResponse,
        "Every item kept an existing message (on_conflict ignore): nothing was changed "
        "(created is false for each).",
    ),
    name="put_messages",
)
async def put_batch(
    queue: QueueDep, state: StateDep, body: BatchPutRequest, request: Request
) -> Response:
    """Store up to 1000 messages in one atomic step: all of them, or none.

    ``created`` says, per item, whether it stored its message (true) or kept an
    existing one (false); the status is 201 when at least one item stored its
    message, 200 when none did."""
    items = []
    trace = request_trace(request.headers.raw)
    for index, item in enumerate(body.messages):
        try:
            items.append(put_arguments(item, queue.name, state.config, trace))
        except ApiError as exc:
            raise ApiError(exc.status, exc.code, f"item {index}: {exc.message}") from None
    with facade_errors():
        results = await queue.put_many_outcomes(items)
    state.metrics.puts.labels(queue.name).inc(len(results))
    created = [result.created for result in results]
    answer = {"ids": [result.id for result in results], "created": created}
    return JSONResponse(answer, status_code=put_status(any(created)))


async def _existing(queue: AsyncQueue, message_id: str) -> Message:
    with facade_errors():
        message = await queue.get(message_id)
    if message is None:
        raise ApiError(404, "not_found", f"no message {message_id!r} in queue {queue.name!r}")
    return message


@router.get(
    "/queues/{queue}/messages/{id:message_id}", response_model=MessageOut, responses=error_docs(404)
)
async def get_message(queue: QueueDep, id: MessageId) -> dict[str, Any]:
    """A message: its state, due time, attempts, last error, payload."""
    return message_to_json(await _existing(queue, id))


async def _refusal(queue: AsyncQueue, message_id: str) -> ApiError:
    """Why an operation by id changed nothing: unknown, in flight or dead."""
    message = await _existing(queue, message_id)
    if message.state is State.DEAD:
        return ApiError(409, "dead", f"message {message_id!r} is dead: retry it instead")
    return ApiError(409, "in_flight", f"message {message_id!r} is in flight (reserved)")


@router.delete(
    "/queues/{queue}/messages/{id:message_id}",
    response_model=CancelResponse,
    responses=error_docs(404, 409),
)
async def cancel_message(queue: QueueDep, id: MessageId) -> dict[str, bool]:
    """Remove a message that is not in flight (scheduled, ready or dead).

    409 ``in_flight`` while it is reserved."""
    with facade_errors():
        cancelled = await queue.cancel(id)
    if not cancelled:
        refusal = await _refusal(queue, id)
        if refusal.code == "dead":  # cancel removes dead messages; a race brought it back
            refusal = ApiError(409, "in_flight", refusal.message)
        raise refusal
    return {"cancelled": True}


@router.post(
    "/queues/{queue}/messages/{id:message_id}/reschedule",
    response_model=MessageOut,
    responses=error_docs(404, 409),
)
async def reschedule_message(
    queue: QueueDep, id: MessageId, body: RescheduleRequest
) -> dict[str, Any]:
    """Move a scheduled or ready message to a new due time: ``delay``, ``at`` or
    ``at_ms`` (one of them; ``{"delay": 0}`` makes it due now, ``{}`` is a 422).

    409 ``in_flight`` while it is reserved, 409 ``dead`` for a dead one."""
    if body.delay is None and body.at is None and body.at_ms is None:
        raise ApiError(
            422,
            "invalid_request",
            "reschedule needs the new due time: delay, at or at_ms (a delay of 0 means now)",
        )
    delay, at = body.delay, due_time(body.at, body.at_ms)
    with facade_errors():
        moved = await queue.reschedule(id, delay=delay, at=at)
    if not moved:
        raise await _refusal(queue, id)
    return message_to_json(await _existing(queue, id))


# -- consuming -------------------------------------------------------------------------


def _stopping(request: Request) -> asyncio.Event:
    event: asyncio.Event = request.app.state.delayq_stopping
    return event


async def _client_gone(request: Request) -> None:
    """Return once the client disconnects (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _long_poll(
    queue: AsyncQueue, request: Request, body: ReserveRequest, count: int
) -> list[Message]:
    """``reserve`` of up to ``count`` that waits on the event loop and ends early, with
    nothing, when the client goes away or the server stops."""
    claim = asyncio.ensure_future(
        queue.reserve(wait=body.wait, lease=body.lease_seconds, max=count)
    )
    gone = asyncio.ensure_future(_client_gone(request))
    stop = asyncio.ensure_future(_stopping(request).wait())
    try:
        await asyncio.wait({claim, gone, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (claim, gone, stop):
            task.cancel()
        outcomes = await asyncio.gather(claim, gone, stop, return_exceptions=True)
    claimed = outcomes[0]
    if isinstance(claimed, BaseException):
        if isinstance(claimed, asyncio.CancelledError):
            return []
        raise claimed
    if gone.done() and not gone.cancelled():
        # The claim finished as the client left: give the messages back at once.
        for message in claimed:
            with contextlib.suppress(Exception):
                await queue.release(message)
        return []
    return claimed


@router.post(
    "/queues/{queue}/reserve",
    response_model=ReservedList,
    responses=error_docs(429),
    tags=["consuming"],
    name="reserve_messages",
)
async def reserve(
    queue: QueueDep,
    state: StateDep,
    request: Request,
    body: Annotated[ReserveRequest | None, Body()] = None,
) -> Response:
    """Claim up to ``max`` due messages, earliest due first, each under a lease of
    ``lease_seconds`` (``lease``, its former name, is still accepted); wait up to
    ``wait`` seconds (long-poll) for one to fall due. ``{"messages": []}`` when none
    came. Ack, nack, extend or release each with its ``lease`` token. An answer holds
    at most 4 MiB of messages (at least one): past that it returns fewer than
    ``max``, and claims no more than it returns."""
    body = body or ReserveRequest()
    size = per_message(state)
    page = Page([], [], False)
    count = chunk(page, body.max, size, SERVE_ANSWER_BUDGET)
    with facade_errors():
        if body.wait > 0:
            with request.app.state.delayq_long_polls.slot(request.scope):
                batch = await _long_poll(queue, request, body, count)
        else:
            batch = await queue.reserve(wait=0, lease=body.lease_seconds, max=count)
        # Claimed a budget's worth at a time: more only while the answer has room.
        while not take(page, batch, await encode_messages(batch, page.used), SERVE_ANSWER_BUDGET):
            if len(batch) < count or len(page.messages) >= body.max:
                break
            count = chunk(page, body.max, size, SERVE_ANSWER_BUDGET)
            batch = await queue.reserve(wait=0, lease=body.lease_seconds, max=count)
    for message in page.left:  # claimed, but past the budget: back at once, uncharged
        with contextlib.suppress(Exception):
            await queue.release(message)
    now_ms = time.time() * 1000.0
    for message in page.messages:
        state.metrics.observe_lateness(queue.name, message.due_at, now_ms)
    return messages_answer(page.parts)


def _held(
    queue: AsyncQueue, message_id: str, token: str, current: Message | None = None
) -> Message:
    """A message as ``reserve`` returned it: the id, the lease token, and (for nack's
    backoff) its attempts."""
    return Message(
        id=message_id,
        queue=queue.name,
        payload=None,
        due_at=0 if current is None else current.due_at,
        attempts=0 if current is None else current.attempts,
        max_attempts=1 if current is None else current.max_attempts,
        state=State.ACTIVE,
        lease=token,
    )


@contextlib.asynccontextmanager
async def _lease_errors(queue: AsyncQueue, message_id: str) -> AsyncIterator[None]:
    """:func:`facade_errors` for an operation by lease token: a lost lease of an id
    the queue does not hold is 404 ``not_found`` (as for every operation by id), of
    one it holds 409 ``lease_lost`` (the token is not, or no longer, its lease)."""
    try:
        with facade_errors():
            yield
    except ApiError as exc:
        if exc.code == "lease_lost":
            await _existing(queue, message_id)  # 404 when the queue does not hold it
        raise


@router.post(
    "/queues/{queue}/messages/{id:message_id}/ack",
    response_model=AckResponse,
    responses=error_docs(404, 409),
    tags=["consuming"],
)
async def ack_message(
    queue: QueueDep, state: StateDep, id: MessageId, body: AckRequest
) -> dict[str, bool]:
    """Done: remove the message. 404 ``not_found`` when the queue does not hold the
    id, 409 ``lease_lost`` when it does but the lease is not this token (expired, or
    the message was reserved again)."""
    async with _lease_errors(queue, id):
        await queue.ack(_held(queue, id, body.lease))
    state.metrics.acks.labels(queue.name).inc()
    return {"acked": True}


@router.post(
    "/queues/{queue}/messages/{id:message_id}/nack",
    response_model=NackResponse,
    responses=error_docs(404, 409),
    tags=["consuming"],
)
async def nack_message(
    queue: QueueDep, state: StateDep, id: MessageId, body: NackRequest
) -> dict[str, str]:
    """Failed: retry after ``delay`` (default: the queue's backoff for this attempt),
    or dead once out of attempts; ``dead: true`` makes it dead at once. Returns the
    new state. 404 ``not_found`` when the queue does not hold the id, 409
    ``lease_lost`` when the lease is not this token."""
    delay = body.delay
    current = await _existing(queue, id)
    async with _lease_errors(queue, id):
        new_state = await queue.nack(
            _held(queue, id, body.lease, current), delay=delay, error=body.error, dead=body.dead
        )
    state.metrics.nacks.labels(queue.name).inc()
    if new_state is State.DEAD:
        state.metrics.dead.labels(queue.name).inc()
    return {"state": new_state.value}


@router.post(
    "/queues/{queue}/messages/{id:message_id}/extend",
    response_model=ExtendResponse,
    responses=error_docs(404, 409),
    tags=["consuming"],
)
async def extend_lease(queue: QueueDep, id: MessageId, body: ExtendRequest) -> dict[str, int]:
    """Renew the lease to ``lease_seconds`` from now (a heartbeat); returns the new
    expiry. 404 ``not_found`` when the queue does not hold the id, 409 ``lease_lost``
    when the lease is not this token."""
    async with _lease_errors(queue, id):
        expiry = await queue.extend(_held(queue, id, body.lease), body.lease_seconds)
    return {"lease_expires_at": expiry}


@router.post(
    "/queues/{queue}/messages/{id:message_id}/release",
    response_model=ReleaseResponse,
    responses=error_docs(404, 409),
    tags=["consuming"],
)
async def release_message(queue: QueueDep, id: MessageId, body: AckRequest) -> dict[str, bool]:
    """Give the message back without counting the attempt: due where it was, first
    in line. 404 ``not_found`` when the queue does not hold the id, 409
    ``lease_lost`` when the lease is not this token."""
    async with _lease_errors(queue, id):
        await queue.release(_held(queue, id, body.lease))
    return {"released": True}
