"""The backend contract as protocols, written once as the asyncio face: the source of the
generated :mod:`delayq.durable._sync.backend`. The guarantees are the docstring of
:mod:`delayq.durable.backend`, where both protocols are imported from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..message import Claimed, Position, PutRequest, Record, State, Stats

__all__ = ["AsyncBackend", "AsyncFiresAhead"]


@runtime_checkable
class AsyncBackend(Protocol):
    """A durable backend (its guarantees: :mod:`delayq.durable.backend`).

    Both faces take the same arguments and give the same results, errors and
    guarantees. On the asyncio face every operation is awaited, a waiting ``reserve``
    never blocks the event loop, and cancelling it leaves nothing claimed.
    """

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
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

        ``outcome=False`` is a hint from a caller that drops the result (the facade's
        ``put``, never ``put_outcome`` or ``put_many``): a backend may ignore it (every
        one but ``amqp://`` does). A backend that takes it may, for a batch of
        ``on_conflict="ignore"`` requests only (which can neither raise DuplicateId nor
        return anything the caller reads), return ``[]`` once the requests are durably
        accepted and before they are decided, provided that every later call of the
        same backend object sees them (read-your-writes); another process sees them
        once decided, a moment later. Their delays then count from the moment they are
        decided, never earlier than the call.
        """
        ...

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """Claim up to ``limit`` due messages, earliest due first, FIFO among equals.

        Each claimed record comes back ``ACTIVE`` with ``attempts`` incremented, a new
        unique ``lease`` token and ``lease_until = now + lease_ms`` (now's ceiling). Messages whose
        lease expired are due again (or dead) first. If nothing is due, block up to
        ``wait`` seconds (None: forever, 0: return at once) and claim as soon as
        something falls due; return ``[]`` when the wait ran out. ``limit >= 1``,
        ``lease_ms >= 1``. Raises :class:`~delayq.QueueClosed` once closed.
        """
        ...

    async def ack(self, queue: str, id: str, token: str) -> None:
        """Delete the message if ``token`` holds its unexpired lease; otherwise raise
        :class:`~delayq.LeaseLost` and change nothing."""
        ...

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """:meth:`ack` for every ``(id, token)`` pair, in one atomic step per store
        shard (one transaction, one script, one lock hold), in order
        (:func:`~delayq.durable.message.apply_ack_many`). Returns, in input order, the ids
        whose token did not hold an unexpired lease (those change nothing); ``[]`` when
        every message was acked. An id that comes twice counts as lost the second time
        (the first ack removed it). ``items`` is never empty; the facade caps its length.
        """
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

    async def release(self, queue: str, id: str, token: str) -> None:
        """Give the message back *without* charging its attempt, if ``token`` holds
        its unexpired lease; else raise :class:`~delayq.LeaseLost` and change nothing.

        It becomes ``SCHEDULED`` with ``attempts - 1`` and no lease; ``due_at``,
        ``seq`` and ``last_error`` are unchanged, so it keeps its place: it is the
        record as it was before its claim
        (:func:`~delayq.durable.message.apply_release`). Waiting consumers are woken.
        """
        ...

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """Renew a held lease to expire at ``now + lease_ms`` (now's ceiling); return
        that epoch ms. A stale token raises :class:`~delayq.LeaseLost` and changes
        nothing."""
        ...

    async def cancel(self, queue: str, id: str) -> bool:
        """Delete a message that is not in flight (scheduled, ready or dead): True.
        False when it is unknown or holds an unexpired lease (nothing changes)."""
        ...

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """Move a scheduled or ready message to ``resolve_due(delay_ms, at_ms, now)``
        with a new ``seq``; True. False when unknown, in flight or dead."""
        ...

    async def get(self, queue: str, id: str) -> Record | None:
        """The message with this id in its observed state, or None. The record never
        carries a lease token (``lease``/``lease_until`` are None)."""
        ...

    async def stats(self, queue: str) -> Stats:
        """Counts per observed state, ``next_due_at`` (earliest ``due_at`` of a
        scheduled or ready message, None when none) and ``lag`` (seconds the oldest
        ready message is overdue, 0.0 when none)
        (:func:`~delayq.durable.message.compute_stats`)."""
        ...

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """Up to ``limit`` dead messages, oldest ``seq`` first (about the order they
        died), without lease; with ``after_seq``, only those whose ``seq`` is greater
        (the next page after a record of that ``seq``: a stable order, so paging shows
        no message twice while others come and go)."""
        ...

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """Make dead messages (all of them when ``ids`` is None, else those of
        ``ids`` that are dead) scheduled, due now (the floor), ``attempts=0``, a new ``seq``;
        ``last_error`` is kept. Return how many were revived."""
        ...

    async def purge(self, queue: str, state: State | None) -> int:
        """Delete every message of the queue in the observed ``state`` (None: all,
        in flight included); return how many. Purged leases become stale."""
        ...

    async def queues(self) -> list[str]:
        """The sorted names of this store's queues that hold at least one message, in
        any state (a queue whose last message was acked, cancelled or purged is gone).
        Read only."""
        ...

    async def peek(
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

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """A histogram of what falls due next: ``(start_ms, counts)``.

        ``start_ms`` is the backend's now (the floor, its own clock); with ``w =
        ceil(horizon_ms / buckets)``, ``counts[i]`` is the number of scheduled messages
        (not yet due: ``due_at > start_ms``) whose ``due_at`` is in ``[start_ms + i*w,
        start_ms + (i+1)*w)``; ``len(counts) == buckets``. Due (ready) messages are not
        counted (:meth:`stats` has them). Cheap on large queues (index range counts,
        no message is loaded). Read only; ``horizon_ms >= 1``, ``buckets >= 1``.
        """
        ...

    async def close(self) -> None:
        """Release connections and wake waiting ``reserve`` calls (they raise
        :class:`~delayq.QueueClosed`). Idempotent; later calls raise ``QueueClosed``."""
        ...


@runtime_checkable
class AsyncFiresAhead(AsyncBackend, Protocol):
    """A backend whose waiting reserve may claim a message shortly before its due time,
    for a holder that hands it over no earlier than that (see "Fire ahead" in
    :mod:`delayq.durable.backend`). The facade's waiting ``reserve`` uses it when the
    backend has it; ``reserve(wait=0)`` never does."""

    #: How long before its due time, at most, a message may be claimed (0: never).
    fire_ahead_ms: int

    async def reserve_ahead(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> Claimed:
        """:meth:`AsyncBackend.reserve`, waiting, that may fire ahead: when nothing is
        due, the messages of the earliest due time, if it is at most
        :attr:`fire_ahead_ms` after the store's now (its floor), up to ``limit`` of them,
        are claimed at once, each leased until ``due_at + lease_ms`` (so the caller's
        lease is whole); a waiting claim wakes ``fire_ahead_ms`` before the next due
        time (a lease expiry: at it). Returns the records with the store's now in
        epoch microseconds (:class:`~delayq.durable.message.Claimed`), which the
        holder waits out (:func:`~delayq.durable.message.hold_seconds`) before it
        hands the records over. ``wait`` as for ``reserve`` but never 0."""
        ...
