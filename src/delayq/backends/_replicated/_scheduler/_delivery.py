"""Delivering to a user's exchange: a configured queue's messages are claimed when due
and published to its target by the scheduler itself; each publish's outcome settles
its message."""

from __future__ import annotations

import asyncio

from ....durable.message import Now, Record
from ....errors import LeaseLost
from .._codec import pack
from .._constants import (
    DELIVER_BACKOFF_MAX_MS,
    DELIVER_BACKOFF_MS,
    DELIVER_IN_FLIGHT,
    DELIVER_LEASE_MS,
)
from ._state import Reply, SchedulerState

__all__ = ["Delivering"]


class Delivering(SchedulerState):
    """Publishing due messages to a queue's target."""

    def _configure(self, queue: str, target: list[str]) -> None:
        exchange, routing_key = target
        self._targets[queue] = (exchange, routing_key or queue)

    def _configure_request(
        self, queue: str, target: list[str], request_id: str, reply_to: str, now: Now
    ) -> None:
        """Deliver ``queue``'s messages to ``target`` from now on (logged when it
        changes what was configured)."""
        exchange, routing_key = target
        wanted = (exchange, routing_key or queue)
        reply = Reply(reply_to, request_id, "ok", pack(None))
        if self._targets.get(queue) == wanted:
            self._commit(None, reply)
            return
        self._configure(queue, target)
        self._wanted()
        store = self._store(queue)
        body = pack(target)
        entry = ["configure", queue, "", now.floor, store.last_seq, [], [], "ok", body]
        self._commit(entry, reply)
        self._service(queue)

    def _deliver_due(self, queue: str) -> bool:
        """Claim what is due (logged, as a reserve is) and publish it to the queue's
        target in (due_at, seq) order; the outcome of each publish settles it. False
        when DELIVER_IN_FLIGHT publishes are out: the next outcome serves the queue."""
        in_flight = self._delivering.get(queue, 0)
        room = DELIVER_IN_FLIGHT - in_flight
        if room <= 0 or self._stepping_down:
            return False
        store = self._store(queue)
        now = self._now()
        claimed = store.claim(now, room, DELIVER_LEASE_MS)
        self._decided(store, "reserve", queue, "", now=now, reply=None)
        self._delivering[queue] = in_flight + len(claimed)
        exchange, routing_key = self._targets[queue]
        for record in claimed:
            task = self._spawn(self._deliver_one(queue, exchange, routing_key, record))
            self._publishes.add(task)
            task.add_done_callback(self._publishes.discard)
        return len(claimed) < room

    async def step_down(self, seconds: float) -> None:
        """Before :meth:`stop`, when this process closes (a restart; not a connection
        lost): publish nothing more, let the publishes in flight end and their outcomes
        be logged, for up to ``seconds``. A message being published is leased
        (DELIVER_LEASE_MS) in the log: cut short, its successor would publish it only
        once that lease ran out, and one whose confirm came before its ``fired`` was
        logged a second time then."""
        if self._stopped or not self._serving or not self._targets:
            return
        self._stepping_down = True
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        if self._publishes:
            await asyncio.wait(set(self._publishes), timeout=seconds)
        rest = until - loop.time()
        if self._stopped or rest <= 0:
            return
        # Resolved once everything decided before it is in the log (_group_commit.py).
        logged: asyncio.Future[None] = loop.create_future()
        self._commit(None, Reply("", "", "", b"", done=logged))
        await asyncio.wait({logged}, timeout=rest)

    async def _deliver_one(
        self, queue: str, exchange: str, routing_key: str, record: Record
    ) -> None:
        try:
            problem = await self._transport.deliver(exchange, routing_key, queue, record)
        finally:
            self._delivering[queue] = self._delivering.get(queue, 1) - 1
        if self._stopped:
            return
        store = self._store(queue)
        now = self._now()
        try:
            if problem is None:
                store.ack(record.id, record.lease or "", now)
            else:
                delay_ms = min(
                    DELIVER_BACKOFF_MS * 2 ** max(record.attempts - 1, 0), DELIVER_BACKOFF_MAX_MS
                )
                store.nack(
                    record.id, record.lease or "", now, delay_ms=delay_ms, error=problem, dead=False
                )
        except LeaseLost:
            pass  # its lease ran out meanwhile: settled as any expired lease
        self._decided(store, "fired" if problem is None else "nack", queue, "", now=now, reply=None)
        self._service(queue)
