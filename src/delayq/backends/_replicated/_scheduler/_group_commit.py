"""Group commit and replies: the operations decided meanwhile leave as one append
(lingering a little when they are only intake folds), and each reply is sent once what
it answers is in the log."""

from __future__ import annotations

import asyncio

from ....durable.message import Record
from .._codec import pack, unpack
from .._constants import LINGER_ENTRIES, LINGER_MS, MAX_GROUP_BYTES
from ._journal import unclaim_each
from ._state import BEGIN, CHECKPOINT_OPS, END, Op, Reply, SchedulerState, entry_bytes

__all__ = ["GroupCommit"]

#: Seconds a client holds messages claimed ahead beyond their due time as this clock
#: counted it when the reply left (its timer and the two clocks' rates may differ by
#: a few microseconds over a hold of a few milliseconds).
_HOLD_MARGIN = 1e-4


class GroupCommit(SchedulerState):
    """Appending what was decided, then sending its replies."""

    def _commit(self, entry: Op | None, reply: Reply | None, *, folded: bool = False) -> None:
        """Add ``entry`` to the group and ``reply`` to what is sent once it is logged;
        ``folded``: an operation folded from the intake, which may linger (LINGER_MS)."""
        if entry is not None:
            if not self._group:
                self._group_since = asyncio.get_running_loop().time()
            self._group.append(entry)
            size = entry_bytes(entry)
            self._group_bytes += size
            if entry[0] not in CHECKPOINT_OPS:  # a checkpoint's own bytes do not count
                self._grown_bytes += size
        if reply is not None:
            # Sent by the flush task, once the callback that decided it (a batch of
            # requests: all of them) is over, so that replies to one client leave as one.
            self._replies.append(reply)
            if reply.claimed and reply.request_id:
                # Known as its request's answer from now until it is sent: a resend
                # answered from the dedup table before then holds its claim too (_reply).
                self._claiming[reply.request_id] = reply
        if reply is not None or (entry is not None and not folded):
            self._urgent = True
        if self._wake is not None and (
            self._urgent
            or len(self._group) >= LINGER_ENTRIES
            or self._group_bytes >= MAX_GROUP_BYTES
        ):
            self._end_linger()
        if not self._flushing and (self._group or self._replies):
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        try:
            while self._group or self._replies:
                if not self._urgent:
                    await self._linger()
                group, replies = self._take_group()
                if group:
                    body = pack(group)
                    mark = next((op[2] for op in group if op[0] in (BEGIN, END)), "")
                    self._appended += 1
                    if mark.startswith("begin:"):
                        self._begins[mark[6:]] = self._appended
                    await self._transport.append("entry", self._reign, body, mark)
                    if any(op[0] not in CHECKPOINT_OPS for op in group):
                        self._grown_entries += 1
                self._send(replies)
                if replies:
                    # One turn of the loop: the replies' tasks put their publishes on
                    # the wire before the next append's.
                    await asyncio.sleep(0)
                self._maybe_checkpoint()
        finally:
            self._flushing = False

    async def _linger(self) -> None:
        """Wait until the group's first operation is LINGER_MS old, or it holds
        LINGER_ENTRIES operations, or something that may not wait joins it (_commit):
        only intake folds are in it, durable in the intake already (a scheduler that
        dies meanwhile leaves their ``intake`` operation unlogged, so its successor
        folds them again), so puts that come one at a time share an append."""
        loop = asyncio.get_running_loop()
        rest = self._group_since + LINGER_MS / 1000.0 - loop.time()
        if rest <= 0 or len(self._group) >= LINGER_ENTRIES:
            return
        self._wake = loop.create_future()
        timer = loop.call_later(rest, self._end_linger)
        try:
            await self._wake
        finally:
            timer.cancel()
            self._wake = None

    def _end_linger(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _take_group(self) -> tuple[list[Op], list[Reply]]:
        """Everything decided so far, up to MAX_GROUP_BYTES of entries (one larger
        operation goes alone), with the replies that were decided before the rest."""
        if self._group_bytes <= MAX_GROUP_BYTES:
            group, replies = self._group, self._replies
            self._group, self._replies, self._group_bytes = [], [], 0
            self._urgent = False
            return group, replies
        # Too much for one entry: the operations that fit in MAX_GROUP_BYTES (at least
        # one: a purge's pieces pile up in one group), and the replies queued before the
        # first operation left behind stay with what follows.
        size = cut = 0
        for entry in self._group:
            weight = entry_bytes(entry)
            if cut and size + weight > MAX_GROUP_BYTES:
                break
            size += weight
            cut += 1
        group, self._group = self._group[:cut], self._group[cut:]
        self._group_bytes -= size
        # Replies keep their order; those of operations still pending wait for them.
        logged = {entry[2] for entry in self._group if entry[2]}
        cut = next(
            (i for i, reply in enumerate(self._replies) if reply.request_id in logged),
            len(self._replies),
        )
        replies, self._replies = self._replies[:cut], self._replies[cut:]
        return group, replies

    def _on_wire(self, kind: str, body: bytes) -> bytes:
        """A reply's body as it leaves: a ``held`` one (messages claimed before their
        due time) says how long its client must still hold them, counted from now by
        this clock, rather than when (the client's clock may differ): it arrives after
        it left, so the client hands them on no earlier than their due time by this
        clock. A hair more, for the client's timer and clock rates."""
        if kind != "held":
            return body
        until, outcome = unpack(body)
        return pack([max(until / 1000.0 - self._wall(), 0.0) + _HOLD_MARGIN, outcome])

    def _send(self, replies: list[Reply]) -> None:
        """Send ``replies`` (their operations are in the log). Only a reply that carries
        claimed messages waits for the broker's word (did its client get it?); the
        others are sent and left, those to one client as one ``batch`` message (in
        order, up to MAX_GROUP_BYTES each). Each claimed one is published by a task of
        its own, the plain ones by one task started after them: the claimed ones (the
        firing path's last hop) wait for no other reply's publish, and the flush's next
        append for none of them (a client matches replies by request id)."""
        plain: dict[str, list[Reply]] = {}
        for reply in replies:
            if reply.done is not None:
                if not reply.done.done():
                    reply.done.set_result(None)
            elif reply.claimed:
                self._spawn(self._reply(reply))
            else:
                plain.setdefault(reply.reply_to, []).append(reply)
        if plain:
            self._spawn(self._send_plain(plain))

    async def _send_plain(self, plain: dict[str, list[Reply]]) -> None:
        for reply_to, group in plain.items():
            left = group
            while left:
                size = len(left[0].body)
                cut = 1
                while cut < len(left) and size + len(left[cut].body) <= MAX_GROUP_BYTES:
                    size += len(left[cut].body)
                    cut += 1
                part, left = left[:cut], left[cut:]
                if len(part) == 1:
                    one = part[0]
                    body = self._on_wire(one.kind, one.body)
                    await self._transport.reply(
                        reply_to, one.request_id, one.kind, body, confirm=False
                    )
                else:
                    body = pack(
                        [[r.request_id, r.kind, self._on_wire(r.kind, r.body)] for r in part]
                    )
                    await self._transport.reply(reply_to, "", "batch", body, confirm=False)

    async def _reply(self, reply: Reply) -> None:
        try:
            delivered = await self._deliver_reply(reply)
        finally:
            if self._claiming.get(reply.request_id) is reply:
                del self._claiming[reply.request_id]
        if not delivered and reply.claimed and not reply.resent:
            # Its client is gone: give back what was claimed for it at once, rather than
            # letting it wait out a lease nobody holds (unless a resend from its new
            # connection was answered with it meanwhile: then that answer holds them).
            self._give_back(reply.queue, reply.claimed, reply.request_id)

    async def _deliver_reply(self, reply: Reply) -> bool:
        """Publish ``reply`` (held until its time, if it was claimed ahead): False when
        its client's inbox was gone."""
        if reply.send_at is not None:
            # Claimed ahead: sent a little before the due time, its waiter parked until
            # then (something due meanwhile drops it, _service).
            rest = reply.send_at - asyncio.get_running_loop().time()
            if rest > 0 and not reply.dropped:
                await asyncio.sleep(rest)
            if reply.dropped:
                return True  # not sent: whoever dropped it released its claim
            parked = self._parked.get(reply.queue) or {}
            waiter = parked.get(reply.request_id)
            if waiter is not None and waiter.ahead is reply:
                del parked[reply.request_id]
                reply.reply_to = waiter.reply_to  # resent from a new connection meanwhile
        body = self._on_wire(reply.kind, reply.body)
        return await self._transport.reply(
            reply.reply_to, reply.request_id, reply.kind, body, confirm=True
        )

    def _give_back(self, queue: str, claimed: list[Record], request_id: str = "") -> None:
        """Release ``claimed``; and when they were reserve ``request_id``'s answer,
        forget it as the answer (logged, as a held reply dropped is): its client, on a
        new connection, resends the reserve, which must be served afresh, not with the
        leases just released (it would hold messages another consumer gets)."""
        if self._stopped:
            return
        store = self._store(queue)
        now = self._now()
        unclaim_each(store, claimed)
        if request_id and self._dedup.pop(request_id, None) is not None:
            forgotten = ["release", queue, request_id, now.floor, store.last_seq]
            self._commit([*forgotten, [], [], "", b""], None)
        self._decided(store, "release", queue, "", now=now, reply=None)
        self._service(queue)
