"""What both faces of a sharded Redis queue share (see :mod:`.sharded`): the settings,
one :class:`~._ops.Operations` per shard, and the routing of ids and batches to shards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...durable.message import Now, PutRequest, resolve_due
from ...errors import QueueClosed
from ._hub import AsyncHub, Hub
from ._ops import Operations
from ._shards import by_shard, shard_of
from ._url import parse_url

__all__ = ["ShardedBase"]


class ShardedBase:
    """What both faces share: settings, one :class:`Operations` per shard, routing."""

    _hubs: Mapping[str, Hub | AsyncHub]  # per queue: the shard heads and their listeners

    def __init__(self, url: str, **options: Any) -> None:
        self._settings = parse_url(url, **options)
        self.shards = self._settings.shards
        self._ops = [Operations(self._settings.prefix, k) for k in range(self.shards)]
        self._closed = False

    @property
    def prefix(self) -> str:
        """The key prefix of this backend's queues."""
        return self._settings.prefix

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed("the queue is closed")

    def _news(self, queue: str, shard: int) -> None:
        hub = self._hubs.get(queue)
        if hub is not None:
            hub.news(shard)

    def _at(self, id: str) -> Operations:
        return self._ops[shard_of(id, self.shards)]

    def _put_plan(
        self, requests: Sequence[PutRequest], taken: tuple[int, Now] | None
    ) -> list[tuple[int, list[int], list[PutRequest], list[int] | None, list[int] | None]]:
        """Per shard: the positions of its requests in ``requests``, those requests,
        their queue-wide seqs and their exact due times.

        ``taken``: the seq before the batch's first and shard 0's now, read together
        (``take_seqs.lua``; None with one shard: the script resolves its own). Every due
        time of the batch is resolved against that one now, so parts put on different
        shards (one script each, one after another, each with its own ``TIME``) keep
        put order among equal delays and "due now" (order is ``(due_at, seq)``).
        """
        plan: list[tuple[int, list[int], list[PutRequest], list[int] | None, list[int] | None]]
        plan = []
        for shard, indexes in by_shard(requests, self.shards).items():
            part = [requests[i] for i in indexes]
            if taken is None:
                plan.append((shard, indexes, part, None, None))
                continue
            base, now = taken
            dues = [resolve_due(r.delay_ms, r.at_ms, now) for r in part]
            plan.append((shard, indexes, part, [base + i + 1 for i in indexes], dues))
        return plan

    def _ack_plan(self, items: Sequence[tuple[str, str]]) -> list[tuple[int, list[int]]]:
        """Per shard: the indexes into ``items`` of its pairs, in input order."""
        plan: dict[int, list[int]] = {}
        for index, (id, _) in enumerate(items):
            plan.setdefault(shard_of(id, self.shards), []).append(index)
        return list(plan.items())

    @staticmethod
    def _lost_ids(
        items: Sequence[tuple[str, str]],
        plan: Sequence[tuple[int, list[int]]],
        lost_per_shard: Sequence[list[int]],
    ) -> list[str]:
        """The ids of the lost pairs (positions within each shard's part), in input order."""
        lost = sorted(
            indexes[position]
            for (_, indexes), positions in zip(plan, lost_per_shard, strict=True)
            for position in positions
        )
        return [items[index][0] for index in lost]

    @staticmethod
    def _needs_check(plan: Sequence[tuple[int, Any, list[PutRequest], Any, Any]]) -> bool:
        return len(plan) > 1 and any(
            request.on_conflict != "ignore" for _, _, part, _, _ in plan for request in part
        )
