"""Sharded queues, the parts without I/O: routing by id, the consumer's view of the
shards, and the merging of per-shard results.

Routing: message ``id`` lives in shard ``crc32(id as UTF-8) % shards`` (:func:`shard_of`,
zlib's CRC-32, the same in every process and every version of delayq: changing it would
strand stored messages, so it never changes). Every operation by id goes straight to that
one shard, in one script on one hash tag.

Consumers: each backend object keeps, per queue, a :class:`ShardView` holding the
earliest due time or lease expiry of every shard (its *head*) as last reported by a
reserve script, and the offset from the local monotonic clock to the server's clock. A
claim goes to the shard with the earliest head, bounded to messages due no later than
the next shard's head (and of its seq), then tops up from the next shards in head order
until ``max`` is reached or no head is due; the batch is returned sorted by ``(due_at,
seq)``, with ``seq`` taken from one queue-wide counter. So no message is handed out
ahead of an earlier due message of another shard, as far as the view is fresh. A head
that turned unknown since it was last seen (news came in while the claim was being
chosen) still bounds the claim by its last seen value: news only adds messages due from
now on, which a claim of messages already due does not pass, while the messages that
shard had are still there or were taken by someone else (then the bound is tighter than
needed, and the next look fixes it). A head is marked unknown (looked at again, with a
claim of 0) when that shard's wake-up marker arrives, when a local write makes it
earlier, every :data:`REFRESH_SECONDS`, and for every shard at the start of a reserve
whose listeners were not running. An empty shard is thus not visited again until it has
news.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections.abc import Sequence

from ...durable.message import PutRequest, Record, Stats
from ._scripts import Claim

__all__ = [
    "REFRESH_SECONDS",
    "ShardView",
    "by_shard",
    "merge_dead",
    "merge_due_counts",
    "merge_stats",
    "shard_of",
    "sort_claimed",
]

#: Every this many seconds a consumer looks at every shard again (bounds a missed marker).
REFRESH_SECONDS = 5.0

_UNKNOWN = -math.inf
_EMPTY = math.inf


def shard_of(id: str, shards: int) -> int:
    """The shard of message ``id``: ``crc32(id.encode("utf-8")) % shards`` (stable)."""
    if shards == 1:
        return 0
    return zlib.crc32(id.encode("utf-8", "surrogatepass")) % shards


def by_shard(requests: Sequence[PutRequest], shards: int) -> dict[int, list[int]]:
    """The indexes of ``requests`` per shard, in order (one id stays in one shard, so a
    batch's later requests still see its earlier ones)."""
    groups: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        groups.setdefault(shard_of(request.id, shards), []).append(index)
    return groups


def merge_stats(parts: Sequence[Stats]) -> Stats:
    """One queue's stats from its shards' stats."""
    dues = [part.next_due_at for part in parts if part.next_due_at is not None]
    return Stats(
        scheduled=sum(part.scheduled for part in parts),
        ready=sum(part.ready for part in parts),
        active=sum(part.active for part in parts),
        dead=sum(part.dead for part in parts),
        next_due_at=min(dues) if dues else None,
        lag=max((part.lag for part in parts), default=0.0),
    )


def merge_dead(parts: Sequence[list[Record]], limit: int) -> list[Record]:
    """The ``limit`` oldest (by seq) dead records of several shards."""
    merged = [record for part in parts for record in part]
    merged.sort(key=lambda record: record.seq)
    return merged[:limit]


def merge_due_counts(parts: Sequence[tuple[int, list[int]]]) -> tuple[int, list[int]]:
    """One queue's due counts from its shards', each counted from the same now (the
    first shard's, given to the others): the counts summed per bucket."""
    return parts[0][0], [sum(column) for column in zip(*(c for _, c in parts), strict=True)]


class ShardView:
    """One consumer's idea of every shard's head (see the module docstring)."""

    def __init__(self, shards: int) -> None:
        self.heads: list[float] = [_UNKNOWN] * shards
        #: Each shard's head as last seen, kept while the head is unknown.
        self.seen: list[float] = [_EMPTY] * shards
        self.seqs = [0] * shards
        self.epochs = [0] * shards
        self._offset: float | None = None
        self._refreshed = time.monotonic()
        self._lock = threading.Lock()

    def mark(self, shard: int) -> None:
        """Shard ``shard`` had news: look at it again."""
        with self._lock:
            self.heads[shard] = _UNKNOWN
            self.epochs[shard] += 1

    def mark_all(self) -> None:
        """Look at every shard again."""
        with self._lock:
            self.heads = [_UNKNOWN] * len(self.heads)
            self.epochs = [epoch + 1 for epoch in self.epochs]
            self._refreshed = time.monotonic()

    def unknown(self) -> list[int]:
        """The shards to look at before claiming (all of them now and then)."""
        if time.monotonic() - self._refreshed > REFRESH_SECONDS:
            self.mark_all()
        return [shard for shard, head in enumerate(self.heads) if head == _UNKNOWN]

    def learn(self, shard: int, claim: Claim, epoch: int) -> None:
        """Take in what a reserve script of ``shard`` reported; ``epoch``: the shard's
        epoch when the script was sent (news since then keep the head unknown)."""
        head = _EMPTY if claim.next_ms is None else float(claim.next_ms)
        with self._lock:
            # Seen even when news since keep the head unknown: the freshest bound.
            self.seen[shard] = head
            self.seqs[shard] = claim.next_seq
            if self.epochs[shard] == epoch:
                self.heads[shard] = head
            self._offset = claim.now_ms + claim.now_us / 1000.0 - time.monotonic() * 1000.0

    def server_now(self) -> float:
        """The server's clock now (epoch ms), as estimated from the last reply."""
        if self._offset is None:
            return _EMPTY
        return time.monotonic() * 1000.0 + self._offset

    def pick(self, ahead_ms: int = 0) -> tuple[int, tuple[int, int] | None] | None:
        """The shard to claim from next and the latest due time to claim there (None:
        no bound), or None when no shard has anything due; with ``ahead_ms`` (a claim
        that fires ahead, once nothing is due), the shard whose head is a due time at
        most that far away."""
        order = sorted(range(len(self.heads)), key=lambda k: (self.heads[k], self.seqs[k]))
        first = order[0]
        if ahead_ms and not self.seqs[first]:  # a lease expiry: waited for itself
            return None
        if self.heads[first] > self.server_now() + ahead_ms:
            return None
        # Heads change under us (news from listeners): an unknown one bounds the claim by
        # its last seen value (see the module docstring).
        bounds = [
            (self.seen[k] if self.heads[k] == _UNKNOWN else self.heads[k], self.seqs[k])
            for k in order[1:]
        ]
        bounds = [bound for bound in bounds if math.isfinite(bound[0])]
        if not bounds:
            return first, None
        head, seq = min(bounds)
        return first, (int(head), seq)

    def seconds_until_next(self, ahead_ms: int = 0) -> float:
        """Seconds until the earliest head (at most :data:`REFRESH_SECONDS`), or until
        ``ahead_ms`` before it when it is a due time (a reserve that fires ahead)."""
        head = min(h - (ahead_ms if s else 0) for h, s in zip(self.heads, self.seqs, strict=True))
        if head == _EMPTY:
            return REFRESH_SECONDS
        return min(REFRESH_SECONDS, max(0.0, (head - self.server_now()) / 1000.0))


def sort_claimed(records: list[Record]) -> list[Record]:
    """A claim's records in delivery order: due time, then the queue-wide seq."""
    records.sort(key=lambda record: (record.due_at, record.seq))
    return records
