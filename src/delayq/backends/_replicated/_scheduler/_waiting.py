"""Waiting reserves and their timers: a reserve that finds nothing due parks at the
scheduler, is served when something falls due (or takes what is due within
FIRE_AHEAD_MS ahead, its reply held until then), and is answered empty when its wait
is over."""

from __future__ import annotations

import asyncio
import math

from ....durable.message import Now, Record
from .._codec import decode_record, encode_outcome, pack, reserve_items
from .._constants import FIRE_AHEAD_MS, HELD_REPLY_AHEAD_MS
from ._journal import Journal, unclaim_each
from ._state import Parked, Reply, SchedulerState

__all__ = ["Waiting"]


class Waiting(SchedulerState):
    """Parked reserves, served at their time."""

    def _park(self, queue: str, waiter: Parked) -> None:
        self._parked.setdefault(queue, {})[waiter.request_id] = waiter
        self._wanted()
        self._arm(queue)

    def _forget(self, queue: str, request_id: str) -> None:
        """A reserve its caller gave up: dropped if parked (what was claimed ahead for
        it goes back); if it was answered, what it claimed goes back too, so that the
        client's next request finds those messages as if never claimed (the late
        answer's own releases then find them released)."""
        parked = self._parked.get(queue)
        waiter = None if parked is None else parked.pop(request_id, None)
        if waiter is not None:
            if waiter.ahead is not None:
                store = self._store(queue)
                now = self._now()
                self._drop_ahead(store, waiter, now)
                self._decided(store, "release", queue, "", now=now, reply=None)
                self._service(queue)
            return
        known = self._dedup.get(request_id)
        if known is None or known[0] not in ("ok", "held"):
            return
        items = reserve_items(known[0], known[1])
        if not isinstance(items, list) or not items:
            return
        store = self._store(queue)
        now = self._now()
        unclaim_each(store, [decode_record(item) for item in items])
        self._decided(store, "release", queue, "", now=now, reply=None)
        self._service(queue)

    def _drop_ahead(self, store: Journal, waiter: Parked, now: Now) -> None:
        """Give back what was claimed ahead for ``waiter`` (its reply not sent: it is
        dropped), keeping each message's due time and place; the caller logs it."""
        reply, waiter.ahead = waiter.ahead, None
        if reply is None:
            return
        reply.dropped = True
        unclaim_each(store, reply.claimed or [])
        # Nor is it the request's answer any more: a resend (here, or to the next
        # scheduler, which replays this entry) is served afresh, never with messages
        # given back (and perhaps cancelled since) from the dedup table.
        self._dedup.pop(reply.request_id, None)
        forgotten = ["release", reply.queue, reply.request_id, now.floor, store.last_seq]
        self._commit([*forgotten, [], [], "", b""], None)

    def _service(self, queue: str) -> None:
        """Serve the parked reserves of ``queue`` in arrival order with what is due, answer
        those whose wait is over, and arm the timer for the next event."""
        if self._stopped or not self._serving:
            return
        if queue in self._targets:
            if self._deliver_due(queue):
                self._arm(queue)
            return
        parked = self._parked.get(queue)
        if not parked:
            return
        store = self._store(queue)
        loop = asyncio.get_running_loop()
        for request_id, waiter in list(parked.items()):
            now = self._now()
            if waiter.ahead is not None:
                event = store.next_event()
                if event is None or event > now.floor:
                    continue  # its held reply leaves in time
                # Something fell due before the messages claimed ahead for it: those
                # go back (their due time unchanged), it takes what is due now.
                self._drop_ahead(store, waiter, now)
            claimed = store.claim(now, waiter.limit, waiter.lease_ms)
            if not claimed:
                ahead = self._claim_ahead(
                    queue, now, (waiter.limit, waiter.lease_ms, waiter.deadline)
                )
                if ahead:
                    reply = self._claimed(
                        waiter.reply_to, request_id, queue, ahead, ahead[0].due_at
                    )
                    reply.send_at = loop.time() + max(
                        (ahead[0].due_at - HELD_REPLY_AHEAD_MS) / 1000.0 - self._wall(), 0.0
                    )
                    waiter.ahead = reply
                    self._decided(store, "reserve", queue, request_id, now=now, reply=reply)
                    continue
            if claimed:
                del parked[request_id]
                reply = self._claimed(waiter.reply_to, request_id, queue, claimed, 0)
                self._decided(store, "reserve", queue, request_id, now=now, reply=reply)
            elif waiter.deadline is not None and waiter.deadline <= loop.time():
                # Its empty answer writes nothing: it is neither logged nor remembered
                # (the dedup table keeps room for the answers of writes). A resend that
                # comes after it is served afresh, which is harmless: this answer handed
                # out nothing, and a client that got it gives back a second answer's
                # messages (released, no attempt charged).
                del parked[request_id]
                self._decided(
                    store,
                    "reserve",
                    queue,
                    "",
                    now=now,
                    reply=Reply(waiter.reply_to, request_id, "ok", pack([])),
                )
            else:
                self._decided(store, "reserve", queue, "", now=now, reply=None)
        self._arm(queue)

    def _deadline_ms(self, deadline: float) -> int:
        """A waiter's deadline (the loop's time) as epoch ms by this clock, floored."""
        loop = asyncio.get_running_loop()
        return math.floor(self._wall() * 1000.0 + (deadline - loop.time()) * 1000.0)

    def _claim_ahead(
        self, queue: str, now: Now, waiter: tuple[int, int, float | None]
    ) -> list[Record]:
        """For a reserve that waits and finds nothing due: the messages due next, when
        that is within FIRE_AHEAD_MS and before the reserve's wait ends, claimed now
        (leased from their due time); their reply tells the client to hold them until
        then. Never for a queue delivered to a user's exchange (published at its time)."""
        if not FIRE_AHEAD_MS or queue in self._targets:
            return []
        limit, lease_ms, deadline = waiter
        horizon = now.floor + FIRE_AHEAD_MS
        if deadline is not None:
            horizon = min(horizon, self._deadline_ms(deadline))
        return self._store(queue).claim_ahead(now, horizon, limit, lease_ms)

    def _claimed(
        self, reply_to: str, request_id: str, queue: str, claimed: list[Record], hold_until: int
    ) -> Reply:
        """The reply that hands ``claimed`` to a reserve: ``held`` until ``hold_until``
        (epoch ms; 0: due already, a plain ``ok``)."""
        outcome = encode_outcome("reserve", claimed)
        kind, body = ("held", pack([hold_until, outcome])) if hold_until else ("ok", pack(outcome))
        return Reply(reply_to, request_id, kind, body, queue=queue, claimed=claimed)

    def _arm(self, queue: str) -> None:
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()
        parked = self._parked.get(queue) or {}
        if (not parked and queue not in self._targets) or self._stopped:
            return
        loop = asyncio.get_running_loop()
        at: float | None = None
        store = self._store(queue)
        event = store.next_event()
        if event is not None:
            due = store.next_due()
            if (
                due is not None
                and FIRE_AHEAD_MS
                and queue not in self._targets
                and any(
                    w.ahead is None and (w.deadline is None or self._deadline_ms(w.deadline) > due)
                    for w in parked.values()
                )
            ):
                # A waiter can take it ahead of its time (_claim_ahead).
                event = min(event, due - FIRE_AHEAD_MS)
            # The loop's time of that millisecond, plus a hair so that the floored now
            # has reached it (the service checks, and re-arms when it has not).
            at = loop.time() + max(event / 1000.0 - self._wall(), 0.0) + 5e-5
        for waiter in parked.values():
            if (
                waiter.ahead is None
                and waiter.deadline is not None
                and (at is None or waiter.deadline < at)
            ):
                at = waiter.deadline
        if at is not None:
            self._timers[queue] = loop.call_at(at, self._service, queue)
