"""The broker contract every durable backend implements, in a sync and an async face.

:class:`~delayq.Queue` and :class:`~delayq.AsyncQueue` validate arguments, serialize
payloads and apply the retry policy; then they call a backend, which stores
:class:`~delayq.durable.message.Record` objects (payload as bytes) and runs the state
machine of :mod:`delayq.durable.message`. A backend never sees user objects and
never validates user input (the facade did); it must guarantee:

* **Atomicity per operation.** Each call below is one atomic step on the server (one
  SQL transaction, one Lua script, one lock hold): ``put`` of a whole batch, a claim
  of up to ``limit`` messages, an ack, an ``ack_many`` batch (per shard of a sharded
  queue), a nack, a cancel, a reschedule, a lease expiry. Nothing is decided by a read
  in one round trip and a write in another. A call that raises has changed nothing.
* **The server's clock decides "now".** Due times, lease expiries and "is it due"
  use the clock of the store (Redis ``TIME``, ``clock_timestamp()``, the SQLite
  process's wall clock, the memory backend's clock), in epoch milliseconds; a
  :class:`PutRequest` carries ``delay_ms`` *relative* to that now, or an absolute
  ``at_ms``. A past ``at_ms`` or a delay <= 0 means "due now".
* **Never early.** A message is never reserved before its delay has passed, to the
  microsecond. The facade rounds ``delay_ms``/``at_ms``/``lease_ms`` *up* to the
  millisecond; the backend reads its clock once per operation and uses that one
  reading both ways (:class:`~delayq.durable.message.Now`): a time it *computes* as
  now plus a positive duration (``delay_ms`` of put/nack/reschedule, the lease
  expiry ``now + lease_ms`` of reserve/extend) starts from the **ceiling** of now
  in ms, while every *check* ("is it due": ``due_at <= now``; "has the lease
  expired": ``lease_until <= now``; the lag) and "due now" itself (no delay or a
  delay of 0, a past ``at_ms``, retry_dead) use the **floor**. A message put at
  1000.3 ms with ``delay=0.005`` is due at 1006 and reserved at 1006.0 at the
  earliest (never at 1005.x); one put at 1000.3 without a delay is due at 1000, so
  a reserve right after the put finds it; a lease never ends before ``lease_ms``.
* **Order.** Among due messages, earliest ``due_at`` first; among equal due times,
  the order of their ``seq``, an increasing sequence given on every put, nack,
  reschedule and retry_dead: that is, put order. A lease expiry keeps the
  message's ``seq`` (:func:`~delayq.durable.message.settle`).
* **Lease fencing.** ``reserve`` counts an attempt and gives each message a new,
  unique lease token, valid until ``lease_until``. ``ack``/``nack``/``extend``/
  ``release`` succeed only while that token holds an unexpired lease; otherwise
  (expired, reserved again, acked, nacked, released, cancelled, purged, dead) they
  raise :class:`~delayq.LeaseLost` and change nothing.
* **Lease expiry.** An expired lease makes the message scheduled again, due at its
  ``lease_until`` and with the attempt counted, and ``last_error`` set to
  ``"lease expired"``; or dead once ``attempts`` has reached ``max_attempts``
  (:func:`~delayq.durable.message.settle`). It may be applied lazily, but every
  operation must observe it as if it had happened at ``lease_until``.
* **Observed states.** Returned records carry the state at the server's now:
  ``READY`` for a scheduled message that is due (:func:`~delayq.durable.message.observe`).
* **Waiting.** ``reserve(wait=...)`` sleeps until the earliest due time (or lease
  expiry), or until a put/nack/release/reschedule/retry_dead makes something due
  earlier,
  or ``wait`` seconds pass; no busy polling. A put through the same backend object
  must wake a waiter at once. ``close()`` wakes every waiter of this backend
  object, which then raises :class:`~delayq.QueueClosed`.
* **Threads and tasks.** A sync backend is safe to call from many threads at once;
  an async backend from many tasks of one event loop, and never blocks the loop.
* **Isolation.** Queues are namespaces: ``queue`` is part of every key. The same
  id may exist in two queues.

A backend module (``delayq.backends.<name>``) exposes two openers, found through
the scheme registry of :mod:`delayq.durable.registry`::

    def open_backend(url: str, **options: Any) -> Backend: ...
    def open_async_backend(url: str, **options: Any) -> AsyncBackend: ...

``url`` is the full URL as the user gave it; ``options`` are the extra keyword
arguments of ``Queue``/``AsyncQueue`` (an unknown option raises ``TypeError``).
Opening must not block for long: async backends connect lazily on first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .message import Position, PutRequest, Record, State, Stats

__all__ = ["AsyncBackend", "Backend"]


@runtime_checkable
class Backend(Protocol):
    """The sync face of a durable backend (see the module docstring for its guarantees)."""

    def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """Store every request in one atomic step, in order; return the positions of
        the requests that kept an existing message.

        Per request (:func:`~delayq.durable.message.apply_put`): a new id is stored
        with ``attempts=0``, due at ``resolve_due(delay_ms, at_ms, now)``; an existing
        id with ``on_conflict="ignore"`` keeps the stored message (``apply_put``
        returns None: the request is *kept*); ``"replace"`` overwrites it as a fresh
        message (new payload, headers, due time, ``max_attempts``, ``attempts=0``,
        ``last_error`` cleared); ``"error"`` raises :class:`~delayq.DuplicateId`.
        ``"replace"`` of a message in flight (unexpired lease) raises
        :class:`~delayq.DuplicateId`. Requests of one batch see the effect of earlier
        requests of that batch (an ``"ignore"`` of an id an earlier request stored is
        kept). Any raise stores nothing of the batch. ``requests`` is never empty.

        The result is decided in the same atomic step as the writes (never by a read
        before them): the 0-based positions into ``requests``, ascending, of the kept
        requests; ``[]`` when every request stored its message (created or replaced),
        the common case, which costs nothing to report.
        """
        ...

    def reserve(self, queue: str, *, limit: int, lease_ms: int, wait: float | None) -> list[Record]:
        """Claim up to ``limit`` due messages, earliest due first, FIFO among equals.

        Each claimed record comes back ``ACTIVE`` with ``attempts`` incremented, a new
        unique ``lease`` token and ``lease_until = now + lease_ms`` (now's ceiling). Messages whose
        lease expired are due again (or dead) first. If nothing is due, block up to
        ``wait`` seconds (None: forever, 0: return at once) and claim as soon as
        something falls due; return ``[]`` when the wait ran out. ``limit >= 1``,
        ``lease_ms >= 1``. Raises :class:`~delayq.QueueClosed` once closed.
        """
        ...

    def ack(self, queue: str, id: str, token: str) -> None:
        """Delete the message if ``token`` holds its unexpired lease; otherwise raise
        :class:`~delayq.LeaseLost` and change nothing."""
        ...

    def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """:meth:`ack` for every ``(id, token)`` pair, in one atomic step per store
        shard (one transaction, one script, one lock hold), in order
        (:func:`~delayq.durable.message.apply_ack_many`). Returns, in input order, the ids
        whose token did not hold an unexpired lease (those change nothing); ``[]`` when
        every message was acked. An id that comes twice counts as lost the second time
        (the first ack removed it). ``items`` is never empty; the facade caps its length.
        """
        ...

    def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """Give the message back if ``token`` holds its unexpired lease, else raise
        :class:`~delayq.LeaseLost` and change nothing.

        With ``dead`` it becomes ``DEAD`` at once, whatever its attempts. Otherwise,
        with ``attempts < max_attempts`` it becomes ``SCHEDULED``, due at
        ``resolve_due(delay_ms, None, now)``; else ``DEAD`` (due time kept). Either
        way a new ``seq``, ``last_error = error`` and the lease is dropped
        (:func:`~delayq.durable.message.apply_nack`). Returns the new state; a
        ``SCHEDULED`` one wakes waiting consumers.
        """
        ...

    def release(self, queue: str, id: str, token: str) -> None:
        """Give the message back *without* charging its attempt, if ``token`` holds
        its unexpired lease; else raise :class:`~delayq.LeaseLost` and change nothing.

        It becomes ``SCHEDULED`` with ``attempts - 1`` and no lease; ``due_at``,
        ``seq`` and ``last_error`` are unchanged, so it keeps its place: it is the
        record as it was before its claim
        (:func:`~delayq.durable.message.apply_release`). Waiting consumers are woken.
        """
        ...

    def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """Renew a held lease to expire at ``now + lease_ms`` (now's ceiling); return
        that epoch ms. A stale token raises :class:`~delayq.LeaseLost` and changes
        nothing."""
        ...

    def cancel(self, queue: str, id: str) -> bool:
        """Delete a message that is not in flight (scheduled, ready or dead): True.
        False when it is unknown or holds an unexpired lease (nothing changes)."""
        ...

    def reschedule(self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None) -> bool:
        """Move a scheduled or ready message to ``resolve_due(delay_ms, at_ms, now)``
        with a new ``seq``; True. False when unknown, in flight or dead."""
        ...

    def get(self, queue: str, id: str) -> Record | None:
        """The message with this id in its observed state, or None. The record never
        carries a lease token (``lease``/``lease_until`` are None)."""
        ...

    def stats(self, queue: str) -> Stats:
        """Counts per observed state, ``next_due_at`` (earliest ``due_at`` of a
        scheduled or ready message, None when none) and ``lag`` (seconds the oldest
        ready message is overdue, 0.0 when none)
        (:func:`~delayq.durable.message.compute_stats`)."""
        ...

    def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """Up to ``limit`` dead messages, oldest ``seq`` first (about the order they
        died), without lease; with ``after_seq``, only those whose ``seq`` is greater
        (the next page after a record of that ``seq``: a stable order, so paging shows
        no message twice while others come and go)."""
        ...

    def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """Make dead messages (all of them when ``ids`` is None, else those of
        ``ids`` that are dead) scheduled, due now (the floor), ``attempts=0``, a new ``seq``;
        ``last_error`` is kept. Return how many were revived."""
        ...

    def purge(self, queue: str, state: State | None) -> int:
        """Delete every message of the queue in the observed ``state`` (None: all,
        in flight included); return how many. Purged leases become stale."""
        ...

    def queues(self) -> list[str]:
        """The sorted names of this store's queues that hold at least one message, in
        any state (a queue whose last message was acked, cancelled or purged is gone).
        Read only."""
        ...

    def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """Up to ``limit`` messages of the queue, changing nothing, in their observed
        state and without lease token (as :meth:`get`).

        ``state`` None: the waiting ones (``READY`` and ``SCHEDULED``) in due order
        ``(due_at, seq)``, the order ``reserve`` would take them; ``READY``: the due
        ones, in due order; ``SCHEDULED``: those not yet due, in due order; ``ACTIVE``:
        those in flight, by lease expiry (then ``seq``); ``DEAD``: as :meth:`dead`.
        An expired lease is observed settled (:func:`~delayq.durable.message.settle`)
        whether or not it was stored so. ``1 <= limit``. With ``after`` (the
        :func:`~delayq.durable.inspection.peek_order` key of the last record of the
        previous page), only the records whose key is greater: the next page.
        """
        ...

    def due_counts(self, queue: str, *, horizon_ms: int, buckets: int) -> tuple[int, list[int]]:
        """A histogram of what falls due next: ``(start_ms, counts)``.

        ``start_ms`` is the backend's now (the floor, its own clock); with ``w =
        ceil(horizon_ms / buckets)``, ``counts[i]`` is the number of scheduled messages
        (not yet due: ``due_at > start_ms``) whose ``due_at`` is in ``[start_ms + i*w,
        start_ms + (i+1)*w)``; ``len(counts) == buckets``. Due (ready) messages are not
        counted (:meth:`stats` has them). Cheap on large queues (index range counts,
        no message is loaded). Read only; ``horizon_ms >= 1``, ``buckets >= 1``.
        """
        ...

    def close(self) -> None:
        """Release connections and wake waiting ``reserve`` calls (they raise
        :class:`~delayq.QueueClosed`). Idempotent; later calls raise ``QueueClosed``."""
        ...


@runtime_checkable
class AsyncBackend(Protocol):
    """The async face of a durable backend: :class:`Backend`'s operations, awaited.

    Same arguments, results, errors and guarantees; a waiting ``reserve`` must not
    block the event loop, and cancelling it leaves nothing claimed.
    """

    async def put(self, queue: str, requests: Sequence[PutRequest]) -> list[int]:
        """See :meth:`Backend.put`."""
        ...

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`Backend.reserve`."""
        ...

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.ack`."""
        ...

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`Backend.ack_many`."""
        ...

    async def nack(
        self,
        queue: str,
        id: str,
        token: str,
        *,
        delay_ms: int,
        error: str | None,
        dead: bool = False,
    ) -> State:
        """See :meth:`Backend.nack`."""
        ...

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`Backend.release`."""
        ...

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`Backend.extend`."""
        ...

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`Backend.cancel`."""
        ...

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`Backend.reschedule`."""
        ...

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`Backend.get`."""
        ...

    async def stats(self, queue: str) -> Stats:
        """See :meth:`Backend.stats`."""
        ...

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`Backend.dead`."""
        ...

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`Backend.retry_dead`."""
        ...

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`Backend.purge`."""
        ...

    async def queues(self) -> list[str]:
        """See :meth:`Backend.queues`."""
        ...

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`Backend.peek`."""
        ...

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`Backend.due_counts`."""
        ...

    async def close(self) -> None:
        """See :meth:`Backend.close`."""
        ...
