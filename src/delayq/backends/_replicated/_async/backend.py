"""The asyncio face of a replicated backend, written by hand: the source of the
generated sync face (:mod:`delayq.backends._replicated._sync.backend`).

Every operation is one request to the namespace's elected scheduler, which decides it
on its state and logs it before replying (see :mod:`.._scheduler`); the link carries it
(:mod:`.._link`: the caller's loop here; on the sync face the caller's thread, and a
private loop thread for what needs one).
"""

from __future__ import annotations

from collections.abc import Sequence

from ....durable.message import Position, PutRequest, Record, State, Stats
from ....errors import QueueClosed
from .._codec import encode_requests
from .._constants import HELD_REPLY_AHEAD_MS
from .._link import LoopLink

__all__ = ["AsyncReplicatedBackend"]


class AsyncReplicatedBackend:
    """A face of a replicated backend (see :class:`~delayq.durable.backend.AsyncBackend`)."""

    def __init__(self, link: LoopLink) -> None:
        self._link = link
        #: How long before its due time a message may be in flight to a waiting reserve
        #: (the held reply leaves then: docs/rabbitmq.md, "Fire ahead"); the claim and
        #: the hold are the scheduler's and the link's, not the facade's.
        self.fire_ahead_ms = HELD_REPLY_AHEAD_MS

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.put`. With ``outcome=False``
        and ``on_conflict="ignore"`` requests, a fast put when the link allows one: it
        returns once the intake confirmed it, the scheduler folds it a moment later
        (docs/rabbitmq.md, "Fast put")."""
        if (
            not outcome
            and self._link.fast
            and all(request.on_conflict == "ignore" for request in requests)
        ):
            await self._link.put_fast(queue, encode_requests(requests))
            return []
        kept: list[int] = await self._link.call("put", [queue, encode_requests(requests)])
        return kept

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reserve`."""
        claimed: list[Record] = await self._link.call(
            "reserve", [queue, limit, lease_ms], wait=wait
        )
        return claimed

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack`."""
        await self._link.call("ack", [queue, id, token])

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack_many`."""
        if not items:
            if self._link.closed:
                raise QueueClosed("the queue is closed")
            return []
        lost: list[str] = await self._link.call(
            "ack_many", [queue, [[id, token] for id, token in items]]
        )
        return lost

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
        """See :meth:`~delayq.durable.backend.AsyncBackend.nack`."""
        state: State = await self._link.call("nack", [queue, id, token, delay_ms, error, dead])
        return state

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.release`."""
        await self._link.call("release", [queue, id, token])

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.extend`."""
        until: int = await self._link.call("extend", [queue, id, token, lease_ms])
        return until

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.cancel`."""
        done: bool = await self._link.call("cancel", [queue, id])
        return done

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reschedule`."""
        moved: bool = await self._link.call("reschedule", [queue, id, delay_ms, at_ms])
        return moved

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.get`."""
        record: Record | None = await self._link.call("get", [queue, id])
        return record

    async def stats(self, queue: str) -> Stats:
        """See :meth:`~delayq.durable.backend.AsyncBackend.stats`."""
        stats: Stats = await self._link.call("stats", [queue])
        return stats

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.dead`."""
        records: list[Record] = await self._link.call("dead", [queue, limit, after_seq])
        return records

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.retry_dead`."""
        wanted = None if ids is None else list(ids)
        revived: int = await self._link.call("retry_dead", [queue, wanted])
        return revived

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.purge`."""
        which = None if state is None else state.value
        purged: int = await self._link.call("purge", [queue, which])
        return purged

    async def queues(self) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.queues`."""
        names: list[str] = await self._link.call("queues", [])
        return names

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.peek`."""
        which = None if state is None else state.value
        position = None if after is None else list(after)
        records: list[Record] = await self._link.call("peek", [queue, which, limit, position])
        return records

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.due_counts`."""
        counts: tuple[int, list[int]] = await self._link.call(
            "due_counts", [queue, horizon_ms, buckets]
        )
        return counts

    async def close(self) -> None:
        """Fail this backend's calls in flight (waiting reserves raise QueueClosed) and
        close its connection; a scheduler hands over to the next candidate."""
        await self._link.close()
