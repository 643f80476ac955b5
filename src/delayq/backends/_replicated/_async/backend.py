"""The asyncio face of a replicated backend, written by hand: the source of the
generated sync face (:mod:`delayq.backends._replicated._sync.backend`).

Every operation is one request to the elected scheduler of its queue's shard, which
decides it on its state and logs it before replying (see :mod:`.._scheduler`); the
shard's link carries it (:mod:`.._link`: the caller's loop here; on the sync face the
caller's thread, and a private loop thread for what needs one). A namespace of one
shard has one link; one of ``shards=N`` has N, each a namespace of its own with its
own scheduler, and a queue's name picks its shard (:func:`~.._options.shard_of`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ....durable.message import Position, PutRequest, Record, State, Stats
from ....errors import QueueClosed
from .._codec import encode_requests
from .._constants import HELD_REPLY_AHEAD_MS
from .._link import LoopLink
from .._options import shard_of

__all__ = ["AsyncReplicatedBackend"]


class AsyncReplicatedBackend:
    """A face of a replicated backend (see :class:`~delayq.durable.backend.AsyncBackend`)."""

    def __init__(self, link: LoopLink, *shards: LoopLink) -> None:
        #: The link of each shard, in order (``link`` alone: a namespace of one shard).
        self._links = (link, *shards)
        self._link = link
        #: How long before its due time a message may be in flight to a waiting reserve
        #: (the held reply leaves then: docs/rabbitmq.md, "Fire ahead"); the claim and
        #: the hold are the scheduler's and the link's, not the facade's.
        self.fire_ahead_ms = HELD_REPLY_AHEAD_MS

    def _of(self, queue: str) -> LoopLink:
        """The link of ``queue``'s shard."""
        links = self._links
        return links[0] if len(links) == 1 else links[shard_of(queue, len(links))]

    async def put(
        self, queue: str, requests: Sequence[PutRequest], *, outcome: bool = True
    ) -> list[int]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.put`. With ``outcome=False``
        and ``on_conflict="ignore"`` requests, a fast put when the link allows one: it
        returns once the intake confirmed it, the scheduler folds it a moment later
        (docs/rabbitmq.md, "Fast put")."""
        link = self._of(queue)
        if (
            not outcome
            and link.fast
            and all(request.on_conflict == "ignore" for request in requests)
        ):
            await link.put_fast(queue, encode_requests(requests))
            return []
        kept: list[int] = await link.call("put", [queue, encode_requests(requests)])
        return kept

    async def reserve(
        self, queue: str, *, limit: int, lease_ms: int, wait: float | None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reserve`."""
        claimed: list[Record] = await self._of(queue).call(
            "reserve", [queue, limit, lease_ms], wait=wait
        )
        return claimed

    async def ack(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack`."""
        await self._of(queue).call("ack", [queue, id, token])

    async def ack_many(self, queue: str, items: Sequence[tuple[str, str]]) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.ack_many`."""
        if not items:
            if self._of(queue).closed:
                raise QueueClosed("the queue is closed")
            return []
        lost: list[str] = await self._of(queue).call(
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
        state: State = await self._of(queue).call("nack", [queue, id, token, delay_ms, error, dead])
        return state

    async def release(self, queue: str, id: str, token: str) -> None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.release`."""
        await self._of(queue).call("release", [queue, id, token])

    async def extend(self, queue: str, id: str, token: str, lease_ms: int) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.extend`."""
        until: int = await self._of(queue).call("extend", [queue, id, token, lease_ms])
        return until

    async def cancel(self, queue: str, id: str) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.cancel`."""
        done: bool = await self._of(queue).call("cancel", [queue, id])
        return done

    async def reschedule(
        self, queue: str, id: str, *, delay_ms: int | None, at_ms: int | None
    ) -> bool:
        """See :meth:`~delayq.durable.backend.AsyncBackend.reschedule`."""
        moved: bool = await self._of(queue).call("reschedule", [queue, id, delay_ms, at_ms])
        return moved

    async def get(self, queue: str, id: str) -> Record | None:
        """See :meth:`~delayq.durable.backend.AsyncBackend.get`."""
        record: Record | None = await self._of(queue).call("get", [queue, id])
        return record

    async def stats(self, queue: str) -> Stats:
        """See :meth:`~delayq.durable.backend.AsyncBackend.stats`."""
        stats: Stats = await self._of(queue).call("stats", [queue])
        return stats

    async def dead(self, queue: str, limit: int, *, after_seq: int | None = None) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.dead`."""
        records: list[Record] = await self._of(queue).call("dead", [queue, limit, after_seq])
        return records

    async def retry_dead(self, queue: str, ids: Sequence[str] | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.retry_dead`."""
        wanted = None if ids is None else list(ids)
        revived: int = await self._of(queue).call("retry_dead", [queue, wanted])
        return revived

    async def purge(self, queue: str, state: State | None) -> int:
        """See :meth:`~delayq.durable.backend.AsyncBackend.purge`."""
        which = None if state is None else state.value
        purged: int = await self._of(queue).call("purge", [queue, which])
        return purged

    async def queues(self) -> list[str]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.queues`: each shard's."""
        names: set[str] = set()
        for link in self._links:
            names.update(await link.call("queues", []))
        return sorted(names)

    async def peek(
        self, queue: str, *, state: State | None, limit: int, after: Position | None = None
    ) -> list[Record]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.peek`."""
        which = None if state is None else state.value
        position = None if after is None else list(after)
        records: list[Record] = await self._of(queue).call("peek", [queue, which, limit, position])
        return records

    async def due_counts(
        self, queue: str, *, horizon_ms: int, buckets: int
    ) -> tuple[int, list[int]]:
        """See :meth:`~delayq.durable.backend.AsyncBackend.due_counts`."""
        counts: tuple[int, list[int]] = await self._of(queue).call(
            "due_counts", [queue, horizon_ms, buckets]
        )
        return counts

    async def stand(self) -> None:
        """Connect to each shard this object stands for (``scheduler=on``; those of
        ``scheduler_shards``) and return once each has a scheduler that answers: this
        process's, elected, or another's while this one stands by (``delayq scheduler``
        starts so). Raises as a call does when a broker cannot be used."""
        for link in self._links:
            if link.candidacy != "off":
                await link.call("queues", [])

    async def close(self) -> None:
        """Fail this backend's calls in flight (waiting reserves raise QueueClosed) and
        close its connections; a scheduler hands over to the next candidate."""
        failed: list[Exception] = []
        for link in self._links:  # each, whatever another's close raised
            try:
                await link.close()
            except Exception as exc:
                failed.append(exc)
        if failed:
            raise failed[0]
