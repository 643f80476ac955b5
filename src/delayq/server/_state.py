"""What every request handler of one server shares: the configuration, the metrics,
one backend, and a queue object per queue name on top of it.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from collections import OrderedDict
from typing import Any

from pydantic import ValidationError

from ..durable import AsyncQueue, Message
from ..durable.traceback import short_error
from ._coalesce import PutCoalescer
from ._config import ServeConfig, check_queue_name
from ._constants import CALLBACK_HEADER, SERVE_COALESCE_MAX_BATCH, SERVE_QUEUE_CACHE
from ._metrics import Metrics
from ._models import CallbackSpec

__all__ = ["ServerState", "message_to_json"]


def _iso(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    return (
        dt.datetime.fromtimestamp(epoch_ms / 1000.0, dt.timezone.utc)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _callback(text: str | None) -> dict[str, Any] | str | None:
    """The callback a message's header holds (None without one), or why it cannot be
    shown: JSON the server did not write (put below its checks) may be anything."""
    if not text:
        return None
    try:
        callback = json.loads(text)
    except (RecursionError, ValueError):
        return "the callback header is not JSON the server can read: it cannot be shown"
    try:
        CallbackSpec.model_validate(callback)
    except ValidationError:
        return "the callback header is not a callback: it cannot be shown"
    result: dict[str, Any] = callback
    return result


def message_to_json(msg: Message) -> dict[str, Any]:
    """A message as the HTTP API and the dashboard show it.

    A payload that was put as bytes comes out as ``payload_base64`` (``payload`` is
    then null); any other payload is the JSON value itself. A payload the server
    cannot give back (written with another serializer, or nested deeper than the
    limit before there was one) is null with ``payload_error`` saying why: that one
    message, never the answer around it; so are headers it cannot give back
    (``headers`` empty and ``headers_error``). ``callback`` is the message's callback
    (or null); ``lease`` (the token) only on messages from ``reserve``, ``lease_expires_at``
    on every message in flight.
    """
    headers = dict(msg.headers)
    headers_error = msg.headers_error
    callback = _callback(headers.pop(CALLBACK_HEADER, None))
    if isinstance(callback, str):
        headers_error, callback = callback, None
    body: dict[str, Any] = {
        "id": msg.id,
        "queue": msg.queue,
        "state": msg.state.value,
        "due_at": msg.due_at,
        "due_at_iso": _iso(msg.due_at),
        "attempts": msg.attempts,
        "max_attempts": msg.max_attempts,
        "headers": headers,
        "last_error": msg.last_error,
        "error_summary": None if msg.last_error is None else short_error(msg.last_error),
        "callback": callback,
    }
    if headers_error is not None:
        body["headers_error"] = headers_error
    if msg.payload_error is not None:
        body["payload"] = None
        body["payload_error"] = msg.payload_error
    elif isinstance(msg.payload, (bytes, bytearray)):
        body["payload"] = None
        body["payload_base64"] = base64.b64encode(msg.payload).decode("ascii")
    else:
        body["payload"] = msg.payload
    if msg.lease is not None:
        body["lease"] = msg.lease
    if msg.lease_expires_at is not None:
        body["lease_expires_at"] = msg.lease_expires_at
    return body


class ServerState:
    """One backend (opened from ``config.url``) and a queue per name over it.

    Creating it does no I/O. :meth:`queue` validates the name (so a bad one is a
    ``ValueError`` before anything is stored) and caches the queue object. The cache
    keeps the :data:`SERVE_QUEUE_CACHE` most recently used queues (and idle put
    batchers): a queue object named from the root shares its backend and holds
    nothing of its own, so dropping one closes nothing and loses nothing, and
    requests naming ever new queues cannot grow the cache past its cap.
    """

    def __init__(self, config: ServeConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics()
        options: dict[str, Any] = dict(config.backend_options)
        self._root = AsyncQueue(config.url, **options)
        self._queues: OrderedDict[str, AsyncQueue] = OrderedDict()
        self._putters: OrderedDict[str, PutCoalescer] = OrderedDict()
        #: The kind of error (a class name, or ``timeout``: never its text, which
        #: holds addresses) of the backend's last failed call, None while it answers.
        self.backend_error: str | None = None
        #: When the backend stopped answering (epoch seconds), None while it answers.
        self.backend_down_since: float | None = None

    @property
    def backend_up(self) -> bool:
        """Whether the backend answered the last call that says so: the dispatcher's
        reserves, ``/healthz``, ``/metrics`` (True until one fails)."""
        return self.backend_error is None

    def note_backend(self, error: str | None) -> None:
        """Record a call's outcome: ``error`` the kind of a failure (see
        :attr:`backend_error`), or None when the backend answered."""
        if error is None:
            self.backend_down_since = None
        elif self.backend_error is None:
            self.backend_down_since = time.time()
            self.metrics.outages.inc()
        self.backend_error = error

    def queue(self, name: str) -> AsyncQueue:
        """The queue ``name`` (see :func:`~._config.check_queue_name`)."""
        queues = self._queues
        queue = queues.get(name)
        if queue is not None:
            queues.move_to_end(name)
            return queue
        if name == self._root.name:
            return self._root
        check_queue_name(name)
        queue = queues[name] = self._root.named(name)
        if len(queues) > SERVE_QUEUE_CACHE:
            queues.popitem(last=False)  # a sibling: dropped, not closed (shared backend)
        return queue

    def putter(self, queue: AsyncQueue) -> PutCoalescer:
        """The :class:`PutCoalescer` of ``queue`` (one of :meth:`queue`'s)."""
        putters = self._putters
        putter = putters.get(queue.name)
        if putter is not None:
            putters.move_to_end(queue.name)
            return putter
        putter = putters[queue.name] = PutCoalescer(queue, SERVE_COALESCE_MAX_BATCH)
        if len(putters) > SERVE_QUEUE_CACHE:
            # Drop the least recently used idle batchers; one with puts in flight stays
            # until a later call finds it idle.
            excess = len(putters) - SERVE_QUEUE_CACHE
            stale: list[str] = []
            for name, old in putters.items():
                if old.idle and old is not putter:
                    stale.append(name)
                    if len(stale) == excess:
                        break
            for name in stale:
                del putters[name]
        return putter

    @property
    def cached(self) -> int:
        """How many queue objects and put batchers are kept for reuse (the root
        queue aside): at most about twice :data:`SERVE_QUEUE_CACHE`."""
        return len(self._queues) + len(self._putters)

    async def queue_names(self, *, callback_queues: bool = False) -> list[str]:
        """Every queue that holds a message, sorted; with ``callback_queues``, the
        callback queues too, empty or not."""
        names = set(await self._root.queues())
        if callback_queues:
            names.update(self.config.callback_queues)
        return sorted(names)

    async def close(self) -> None:
        """Close the backend (every queue object with it), once the batched puts
        sent so far are stored."""
        for putter in list(self._putters.values()):
            await putter.wait_idle()
        for queue in list(self._queues.values()):
            await queue.close()
        await self._root.close()
