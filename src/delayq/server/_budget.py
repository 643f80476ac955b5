"""What one answer may cost: messages are fetched a few at a time, as many as the
answer's byte budget (:data:`~._constants.SERVE_ANSWER_BUDGET`) leaves room for at
the queue's largest payload, and encoded in a worker thread, so that a list or a
reserve of large messages neither reads nor holds much more than it sends, and never
holds up the event loop while it encodes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from fastapi.responses import Response
from pydantic import TypeAdapter

from ..durable import Message
from ..durable._constants import DEFAULT_MAX_PAYLOAD
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


async def encode_messages(messages: list[Message]) -> list[bytes]:
    """Each message as the API shows it (``MessageOut`` JSON), encoded in a worker
    thread."""
    if not messages:
        return []
    return await anyio.to_thread.run_sync(_encode, messages)


@dataclass
class Page:
    """The messages of one answer and their JSON; ``cut`` when the budget ended it
    before its limit (more may follow)."""

    messages: list[Message]
    parts: list[bytes]
    cut: bool
    #: Messages fetched (or claimed) that the answer leaves out.
    left: list[Message]


def take(page: Page, batch: list[Message], parts: list[bytes], budget: int) -> bool:
    """Add ``batch`` to ``page`` until the next message would pass ``budget`` (the
    first always fits); True when the budget is spent."""
    used = sum(len(part) + 1 for part in page.parts)
    for index, (message, part) in enumerate(zip(batch, parts, strict=True)):
        if page.messages and used + len(part) > budget:
            page.cut = True
            page.left.extend(batch[index:])
            return True
        page.messages.append(message)
        page.parts.append(part)
        used += len(part) + 1
    return used >= budget


def chunk(page: Page, limit: int, size: int, budget: int) -> int:
    """How many messages the next fetch may ask for: no more than the limit leaves,
    nor than the budget leaves room for at ``size`` bytes each (at least one)."""
    used = sum(len(part) + 1 for part in page.parts)
    return max(1, min(limit - len(page.messages), (budget - used) // size))


async def fetch_page(
    fetch: Fetch, limit: int, size: int, budget: int = SERVE_ANSWER_BUDGET
) -> Page:
    """Up to ``limit`` messages from ``fetch``, as many as fit ``budget`` bytes of
    JSON (at least one), fetched ``chunk`` at a time."""
    page = Page([], [], False, [])
    last: Message | None = None
    while len(page.messages) < limit:
        count = chunk(page, limit, size, budget)
        batch = await fetch(count, last)
        if take(page, batch, await encode_messages(batch), budget):
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
