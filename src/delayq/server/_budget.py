"""What one answer may cost: messages are fetched a chunk at a time, as many as the
answer's byte budget (:data:`~._constants.SERVE_ANSWER_BUDGET`) leaves room for, and
an answer past its first 256 KiB is encoded in a worker thread, so that a list or a
reserve of large messages neither reads nor holds much more than it sends, and never
holds up the event loop while it encodes.

A chunk is sized by what the answer has seen: the first at the largest payload a put
may store (4 messages at 1 MiB), the next ones at the largest message seen so far in
this answer, but never below :data:`_SMALLEST` bytes each. So a page of small messages
takes a few fetches (a fetch each would make a 1,000-message list or reserve several
times slower), and a fetch reads at most ``budget / _SMALLEST`` messages.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from fastapi.responses import Response
from pydantic import TypeAdapter

from ..durable import Message
from ..durable.constants import DEFAULT_MAX_PAYLOAD
from ._constants import SERVE_ANSWER_BUDGET
from ._models import MessageOut
from ._state import ServerState, message_to_json

__all__ = [
    "Page",
    "chunk",
    "encode_messages",
    "fetch_page",
    "messages_answer",
    "per_message",
    "position",
    "take",
]

_MESSAGE_OUT: TypeAdapter[MessageOut] = TypeAdapter(MessageOut)
#: Bytes of an answer encoded on the event loop, past which it is encoded in a worker
#: thread: what the loop spends on one answer is this and one message at most
#: (milliseconds: a put's limits bound a message to 1 MiB and 100,000 values).
_ON_LOOP = 256 * 1024
#: The least a message is counted at when a chunk is sized by the messages seen (the
#: first chunk is sized by the largest payload a put may store).
_SMALLEST = 16 * 1024

#: ``fetch(count, after)``: up to ``count`` messages after ``after`` (None: the first).
Fetch = Callable[[int, Message | None], Awaitable[list[Message]]]


def per_message(state: ServerState) -> int:
    """The most bytes one stored payload of this server's queues may take: what a
    fetch is sized by."""
    limit = state.config.backend_options.get("max_payload", DEFAULT_MAX_PAYLOAD)
    return limit if type(limit) is int and limit > 0 else SERVE_ANSWER_BUDGET


def position(kind: str, message: Message) -> tuple[int, ...]:
    """The place of ``message`` in the order of the list ``kind``: ``due`` (waiting,
    ready, scheduled), ``active`` or ``dead``."""
    if kind == "dead":
        return (message.seq or 0,)
    if kind == "active":
        return (message.lease_expires_at or 0, message.seq or 0)
    return (message.due_at, message.seq or 0)


def _encode(messages: list[Message]) -> list[bytes]:
    return [
        _MESSAGE_OUT.dump_json(MessageOut.model_validate(message_to_json(message)))
        for message in messages
    ]


async def encode_messages(messages: list[Message], done: int) -> list[bytes]:
    """Each message as the API shows it (``MessageOut`` JSON). ``done`` is how many
    bytes of the answer are encoded already: the first :data:`_ON_LOOP` of an answer
    are encoded on the event loop (a thread's hand-off would cost small answers more
    than their encoding), the rest in a worker thread."""
    parts: list[bytes] = []
    for index, message in enumerate(messages):
        if done >= _ON_LOOP:
            return parts + await anyio.to_thread.run_sync(_encode, messages[index:])
        parts += _encode([message])
        done += len(parts[-1])
    return parts


@dataclass
class Page:
    """The messages of one answer and their JSON; ``cut`` when the budget ended it
    before its limit (more may follow)."""

    messages: list[Message]
    parts: list[bytes]
    cut: bool
    #: Messages fetched (or claimed) that the answer leaves out.
    left: list[Message] = field(default_factory=list)
    #: Bytes of the answer so far (the messages' JSON and their commas).
    used: int = 0
    #: The largest message's JSON seen so far (0: none yet).
    largest: int = 0


def take(page: Page, batch: list[Message], parts: list[bytes], budget: int) -> bool:
    """Add ``batch`` to ``page`` until the next message would pass ``budget`` (the
    first always fits); True when the budget is spent."""
    page.largest = max(page.largest, *map(len, parts), 0)
    for index, (message, part) in enumerate(zip(batch, parts, strict=True)):
        if page.messages and page.used + len(part) > budget:
            page.cut = True
            page.left.extend(batch[index:])
            return True
        page.messages.append(message)
        page.parts.append(part)
        page.used += len(part) + 1
    return page.used >= budget


def chunk(page: Page, limit: int, size: int, budget: int) -> int:
    """How many messages the next fetch may ask for: no more than the limit leaves,
    nor than the budget leaves room for (at least one), each counted at ``size``
    bytes before any is seen, then at the largest seen (at least :data:`_SMALLEST`)."""
    each = size if not page.largest else max(_SMALLEST, min(size, page.largest))
    return max(1, min(limit - len(page.messages), (budget - page.used) // each))


async def fetch_page(
    fetch: Fetch, limit: int, size: int, budget: int = SERVE_ANSWER_BUDGET
) -> Page:
    """Up to ``limit`` messages from ``fetch``, as many as fit ``budget`` bytes of
    JSON (at least one), fetched ``chunk`` at a time."""
    page = Page([], [], False)
    last: Message | None = None
    while len(page.messages) < limit:
        count = chunk(page, limit, size, budget)
        batch = await fetch(count, last)
        if take(page, batch, await encode_messages(batch, page.used), budget):
            page.cut = page.cut or len(page.messages) < limit
            break
        if len(batch) < count:
            break
        last = batch[-1]
    return page


def messages_answer(parts: list[bytes], **rest: Any) -> Response:
    """``{"messages": [...], **rest}`` from the messages' JSON, joined as bytes."""
    tail = b"".join(
        b"," + json.dumps(key).encode() + b":" + json.dumps(value).encode()
        for key, value in rest.items()
    )
    body = b'{"messages":[' + b",".join(parts) + b"]" + tail + b"}"
    return Response(body, media_type="application/json")
