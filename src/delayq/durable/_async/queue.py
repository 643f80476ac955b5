"""The durable queue as users see it, over any backend, written once as its asyncio face.

``_async/queue.py`` is the source; ``_sync/queue.py`` is generated from it by
``scripts/unasync.py`` (``async``/``await`` dropped, async names mapped to their sync
twins), and ``make lint`` fails when the generated file is stale: edit only the source.
Both faces validate every argument and serialize the payload before the backend is
called, then delegate the operation, as one atomic step, to the backend the URL names
(:mod:`delayq.durable.registry`). The logic lives in the backend and in the pure
transitions of :mod:`delayq.durable.message`; these classes are thin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from ...errors import DuplicateId
from ..constants import (
    DEFAULT_DEAD_LIMIT,
    DEFAULT_DUE_BUCKETS,
    DEFAULT_DUE_HORIZON,
    DEFAULT_LEASE,
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_PEEK_LIMIT,
    DEFAULT_QUEUE_NAME,
)
from ..facade import (
    QueueBase,
    check_address,
    check_position,
    check_seconds,
    check_seq,
    duplicate_item,
    reschedule_arguments,
    to_ms,
)
from ..message import Held, Message, OnConflict, PutResult, State, Stats
from ..registry import open_async_backend
from ..retry import RetryPolicy
from ..tracing import sending
from .backend import AsyncBackend, AsyncFiresAhead
from .hold import claim_held, reserve_held

__all__ = ["AsyncQueue"]


class AsyncQueue(QueueBase):
    """A durable delay queue, safe to share between threads (sync face) or between the
    tasks of one event loop (asyncio face).

    ``url`` picks the backend: ``"memory://"``, ``"sqlite:///path.db"``, ... (default:
    ``$DELAYQ_URL``, else ``sqlite:///delayq.db``). ``name`` is the queue within it.
    ``retry`` sets ``max_attempts`` and the backoff of ``nack``; ``serializer`` is
    any object with ``dumps``/``loads`` (JSON by default; bytes always pass through
    untouched); ``max_payload`` limits a serialized payload in bytes (None: no
    limit). Further keyword arguments go to the backend (``memory://`` takes
    ``clock=``). Delivery is at least once: a message is gone only once acked.

    Both faces take the same arguments and have the same methods; on the asyncio face
    they are awaited (all but :meth:`named`), the queue is used with ``async with``,
    and creating it does no I/O: the backend connects on first use.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        name: str = DEFAULT_QUEUE_NAME,
        retry: RetryPolicy | None = None,
        serializer: object = None,
        max_payload: int | None = DEFAULT_MAX_PAYLOAD,
        **options: Any,
    ) -> None:
        super().__init__(url, name, retry, serializer, max_payload)
        self._backend: AsyncBackend = open_async_backend(self._url, **options)
        #: The backend, when a waiting reserve may fire ahead on it (see reserve).
        self._ahead = _fires_ahead(self._backend)

    @property
    def backend(self) -> AsyncBackend:
        """The backend this queue talks to."""
        return self._backend

    def named(self, name: str) -> AsyncQueue:
        """The queue ``name`` on this queue's backend: same URL, retry policy and
        serializer, same connections. Closing it leaves the backend open; closing the
        queue that opened the backend closes it under both."""
        return self._sibling(name)

    async def put(
        self,
        payload: Any,
        *,
        delay: Any = None,
        at: Any = None,
        id: str | None = None,
        on_conflict: OnConflict = "ignore",
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Store a message due after ``delay`` or at ``at`` (neither: now); return its id.

        ``delay`` is seconds, a timedelta or a string like ``"30m"``; ``at`` an aware
        datetime or epoch seconds. With an ``id`` that exists, ``on_conflict`` decides:
        ``"ignore"`` keeps the stored message, ``"replace"`` overwrites it (not while in
        flight), ``"error"`` raises :class:`~delayq.DuplicateId`. ``max_attempts``
        overrides the retry policy's for this message. :meth:`put_outcome` says, in
        addition, whether the message was stored or an existing one kept.
        """
        self._check_writable()
        request = self._request(payload, delay, at, id, on_conflict, max_attempts, headers)
        with sending(self._name, (request,), batch=False):
            # Only the id is returned: a backend may take the hint (see the contract's put).
            await self._backend.put(self._name, [request], outcome=False)
        return request.id

    async def put_outcome(
        self,
        payload: Any,
        *,
        delay: Any = None,
        at: Any = None,
        id: str | None = None,
        on_conflict: OnConflict = "ignore",
        max_attempts: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PutResult:
        """:meth:`put`, returning what it did: a :class:`~delayq.PutResult` whose
        ``created`` is True when the message was stored (a new id, or one replaced) and
        False when an existing message was kept unchanged (``on_conflict="ignore"``).
        Decided in the put's own atomic step, so it is exact under concurrent puts.
        """
        self._check_writable()
        request = self._request(payload, delay, at, id, on_conflict, max_attempts, headers)
        with sending(self._name, (request,), batch=False):
            kept = await self._backend.put(self._name, [request])
        return PutResult(request.id, not kept)

    async def put_many(self, items: Iterable[Mapping[str, Any]]) -> list[str]:
        """Store many messages in one atomic step: all of them or, on any error, none.

        Each item is a dict of :meth:`put`'s arguments, e.g. ``{"payload": ...,
        "delay": "5m", "id": "order-1"}``. Returns the ids in order.
        :meth:`put_many_outcomes` says, in addition, what each put did.
        """
        self._check_writable()
        requests = self._requests(items)
        if requests:
            try:
                with sending(self._name, requests, batch=True):
                    await self._backend.put(self._name, requests)
            except DuplicateId as exc:
                raise duplicate_item(requests, exc) from None
        return [request.id for request in requests]

    async def put_many_outcomes(self, items: Iterable[Mapping[str, Any]]) -> list[PutResult]:
        """:meth:`put_many`, returning a :class:`~delayq.PutResult` per item, in order:
        ``created`` False for each item that kept an existing message (its id was
        stored, or stored by an earlier item of the batch, and it has
        ``on_conflict="ignore"``), True for the others."""
        self._check_writable()
        requests = self._requests(items)
        try:
            if requests:
                with sending(self._name, requests, batch=True):
                    kept = await self._backend.put(self._name, requests)
            else:
                kept = []
        except DuplicateId as exc:
            raise duplicate_item(requests, exc) from None
        results = [PutResult(request.id, True) for request in requests]
        for position in kept:
            results[position] = PutResult(requests[position].id, False)
        return results

    async def reserve(
        self, *, wait: Any = None, lease: Any = DEFAULT_LEASE, max: int = 1
    ) -> list[Message]:
        """Claim up to ``max`` due messages, earliest due first, each under a lease.

        Blocks up to ``wait`` seconds (None: until a message is due; 0: not at all) and
        returns ``[]`` if none came. A message not acked or nacked within ``lease``
        seconds (see :meth:`extend`) becomes ready again, its attempt counted. A
        waiting reserve may claim a message a moment before its due time and hold it
        until then (the backend's ``fire_ahead_ms``: "Fire ahead" in
        :mod:`delayq.durable.backend`); it never returns one before its due time.
        """
        self._check_open()
        wait_s, lease_ms, limit = self._reserve_arguments(wait, lease, max)
        if wait_s != 0 and self._ahead is not None:
            records = await reserve_held(
                self._ahead, self._name, limit=limit, lease_ms=lease_ms, wait=wait_s
            )
        else:
            records = await self._backend.reserve(
                self._name, limit=limit, lease_ms=lease_ms, wait=wait_s
            )
        return [self._message(record) for record in records]

    async def reserve_ahead(
        self, *, wait: Any = None, lease: Any = DEFAULT_LEASE, max: int = 1
    ) -> Held:
        """:meth:`reserve` for a consumer that holds a message claimed ahead itself: the
        messages at once, with ``not_before``, the ``time.monotonic()`` instant before
        which none may be handed over (0.0: all are due). The caller must not run one
        before it, and gives them back (:meth:`release`) if it gives up meanwhile. The
        Worker's threads of sync handlers hold them that way, each on its own timer, so
        that nothing stands between the due time and the handler."""
        self._check_open()
        wait_s, lease_ms, limit = self._reserve_arguments(wait, lease, max)
        if wait_s != 0 and self._ahead is not None:
            records, not_before = await claim_held(
                self._ahead, self._name, limit=limit, lease_ms=lease_ms, wait=wait_s
            )
        else:
            records, not_before = (
                await self._backend.reserve(
                    self._name, limit=limit, lease_ms=lease_ms, wait=wait_s
                ),
                0.0,
            )
        return Held([self._message(record) for record in records], not_before)

    async def ack(self, msg: Message) -> None:
        """Done with ``msg``: remove it. :class:`~delayq.LeaseLost` if its lease is
        no longer held (nothing changes then)."""
        self._check_open()
        id, token = self._held(msg)
        await self._backend.ack(self._name, id, token)

    async def ack_many(self, msgs: Iterable[Message]) -> list[str]:
        """Done with every message of ``msgs`` (at most 10,000, from :meth:`reserve` on
        this queue): remove those whose lease is still held, in one round trip (one
        per shard of a sharded queue). Returns the ids whose lease was lost (expired,
        reserved again, acked, cancelled...): those change nothing; ``[]`` means all
        were acked. A message given twice counts as lost the second time. Every message
        is checked before anything is sent; an empty list sends nothing."""
        self._check_open()
        items = self._held_many(msgs)
        return await self._backend.ack_many(self._name, items) if items else []

    async def nack(
        self, msg: Message, *, delay: Any = None, error: Any = None, dead: bool = False
    ) -> State:
        """``msg`` failed: retry it after ``delay`` (default: the retry policy's backoff),
        or make it dead once it has had ``max_attempts``; with ``dead=True`` (and no
        ``delay``) make it dead at once, whatever its attempts. ``error`` (a str or an
        exception) is kept as its ``last_error``. Returns its new state
        (SCHEDULED or DEAD); :class:`~delayq.LeaseLost` if the lease is no longer held.
        """
        self._check_open()
        id, token = self._held(msg)
        delay_ms, text, to_dead = self._nack_arguments(msg, delay, error, dead)
        return await self._backend.nack(
            self._name, id, token, delay_ms=delay_ms, error=text, dead=to_dead
        )

    async def release(self, msg: Message) -> None:
        """Give ``msg`` back without charging the attempt (e.g. a consumer shutting
        down): it is due again where it was, before messages put after it, with
        ``attempts`` as before its reserve. :class:`~delayq.LeaseLost` if the lease is
        no longer held (nothing changes then)."""
        self._check_open()
        id, token = self._held(msg)
        await self._backend.release(self._name, id, token)

    async def extend(self, msg: Message, lease: Any = DEFAULT_LEASE) -> int:
        """Renew ``msg``'s lease to ``lease`` seconds from now; return the new expiry
        (epoch ms). :class:`~delayq.LeaseLost` if the lease is no longer held."""
        self._check_open()
        id, token = self._held(msg)
        lease_ms = to_ms(check_seconds("lease", lease, positive=True), "lease")
        return await self._backend.extend(self._name, id, token, lease_ms)

    async def cancel(self, id: str) -> bool:
        """Remove a message that is not in flight (scheduled, ready or dead): True;
        False when it is unknown or in flight."""
        self._check_open()
        return await self._backend.cancel(self._name, check_address(id))

    async def reschedule(self, id: str, *, delay: Any = None, at: Any = None) -> bool:
        """Move a scheduled or ready message to a new due time, ``delay`` or ``at`` (one
        of them: ``delay=0`` makes it due now); False when it is unknown, in flight or
        dead."""
        self._check_open()
        message_id = check_address(id)
        delay_ms, at_ms = reschedule_arguments(delay, at)
        return await self._backend.reschedule(
            self._name, message_id, delay_ms=delay_ms, at_ms=at_ms
        )

    async def get(self, id: str) -> Message | None:
        """The message with this id (state, due time, attempts, last error), never
        with a lease token; None if there is none."""
        self._check_open()
        record = await self._backend.get(self._name, check_address(id))
        return None if record is None else self._message(record)

    async def stats(self) -> Stats:
        """Counts per state, the next due time (epoch ms) and the lag (seconds)."""
        self._check_open()
        return await self._backend.stats(self._name)

    async def dead(
        self, limit: int = DEFAULT_DEAD_LIMIT, *, after_seq: int | None = None
    ) -> list[Message]:
        """Up to ``limit`` dead messages, oldest first; with ``after_seq`` (the ``seq``
        of the last message of the previous page), the next page."""
        self._check_open()
        after = None if after_seq is None else check_seq(after_seq)
        records = await self._backend.dead(self._name, self._limit(limit), after_seq=after)
        return [self._message(record) for record in records]

    async def retry_dead(self, ids: Iterable[str] | None = None) -> int:
        """Make dead messages (all, or those of ``ids``) ready now with attempts reset
        to 0; return how many."""
        self._check_open()
        return await self._backend.retry_dead(self._name, self._ids(ids))

    async def purge(self, state: State | None = None) -> int:
        """Remove every message in ``state`` (None: all of this queue, in flight
        included); return how many."""
        self._check_open()
        return await self._backend.purge(self._name, self._state(state))

    async def queues(self) -> list[str]:
        """The sorted names of the queues of this queue's store (its URL) that hold
        at least one message, in any state; this one included when it does."""
        self._check_open()
        return await self._backend.queues()

    async def peek(
        self,
        state: State | str | None = None,
        limit: int = DEFAULT_PEEK_LIMIT,
        *,
        after: tuple[int, ...] | None = None,
    ) -> list[Message]:
        """Up to ``limit`` (1 to 10000) messages of this queue, changing nothing and
        without lease tokens (as :meth:`get`). ``state`` None: the waiting ones (ready
        and scheduled) in the order :meth:`reserve` takes them (due time, then put
        order); ``"ready"``/``"scheduled"``: those, in that order; ``"active"``: those
        in flight, by lease expiry; ``"dead"``: as :meth:`dead`. ``after`` pages: the
        place of the last message of the previous page in that order, ``(due_at,
        seq)``, ``(lease_expires_at, seq)`` for ``"active"``, ``(seq,)`` for ``"dead"``."""
        self._check_open()
        checked, count = self._peek_arguments(state, limit)
        position = None if after is None else check_position(checked, after)
        records = await self._backend.peek(self._name, state=checked, limit=count, after=position)
        return [self._message(record) for record in records]

    async def due_counts(
        self, horizon: Any = DEFAULT_DUE_HORIZON, buckets: int = DEFAULT_DUE_BUCKETS
    ) -> tuple[int, list[int]]:
        """What falls due next, as ``(start_ms, counts)``: ``start_ms`` is the backend's
        now (epoch ms) and ``counts[i]`` the number of scheduled messages due in
        ``[start_ms + i*w, start_ms + (i+1)*w)`` with ``w = ceil(horizon_ms /
        buckets)``. ``horizon`` (seconds, timedelta or ``"1h"``; > 0, at most 366
        days) is split into ``buckets`` (1 to 1000). Ready messages are not counted
        (see :meth:`stats`)."""
        self._check_open()
        horizon_ms, count = self._due_count_arguments(horizon, buckets)
        return await self._backend.due_counts(self._name, horizon_ms=horizon_ms, buckets=count)

    async def close(self) -> None:
        """Close the backend; a waiting :meth:`reserve` raises :class:`~delayq.QueueClosed`,
        as does every later call. Idempotent."""
        if not self._closed:
            self._closed = True
            if self._owns_backend:
                await self._backend.close()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _fires_ahead(backend: AsyncBackend) -> AsyncFiresAhead | None:
    """``backend`` when it fires ahead (a positive ``fire_ahead_ms``), else None."""
    if isinstance(backend, AsyncFiresAhead) and backend.fire_ahead_ms > 0:
        return backend
    return None
