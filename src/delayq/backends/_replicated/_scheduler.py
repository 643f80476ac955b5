"""The elected scheduler: the namespace's whole state in memory, rebuilt from the log,
deciding every request with the pure transitions and appending what each one changed
before it replies (docs/rabbitmq.md).

An entry of the log is a msgpack array of operations, each
``[op, queue, request_id, now_floor, last_seq, images, deletes, reply_kind, reply]``:
the records the operation wrote (whole), the ids it deleted, the queue's last sequence
number, and the reply it earned (so that a request resent after a failover is answered
from the log, not applied twice). Replay is a fold with no clock and no decision.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..._log import log_event
from ...durable._records import Records
from ...durable.message import Now, Record, State
from ...errors import DuplicateId, LeaseLost
from ._codec import (
    decode_record,
    decode_requests,
    encode_outcome,
    encode_record,
    error_reply,
    pack,
    unpack,
)
from ._constants import (
    DEDUP_SIZE,
    DELIVER_BACKOFF_MAX_MS,
    DELIVER_BACKOFF_MS,
    DELIVER_IN_FLIGHT,
    DELIVER_LEASE_MS,
    MAX_GROUP_BYTES,
    RENEW_EVERY,
)
from ._transport import Delivery, Transport

__all__ = ["Scheduler"]

#: What an operation of the log is made of, before packing.
Op = list[Any]


class _Journal(Records):
    """One queue's records that note every change, for the log."""

    def __init__(self) -> None:
        super().__init__()
        self.changed: dict[str, Record | None] = {}

    def write(self, record: Record) -> None:
        super().write(record)
        self.changed[record.id] = record

    def delete(self, id: str) -> None:
        super().delete(id)
        self.changed[id] = None

    def restore(self, images: list[Any], deletes: list[str], last_seq: int) -> None:
        """Apply a logged operation (replay: nothing is noted)."""
        for image in images:
            Records.write(self, decode_record(image))
        for id in deletes:
            self.records.pop(id, None)
        self.last_seq = max(self.last_seq, last_seq)

    def take_changes(self) -> tuple[list[Any], list[str]]:
        images = [encode_record(r) for r in self.changed.values() if r is not None]
        deletes = [id for id, r in self.changed.items() if r is None]
        self.changed.clear()
        return images, deletes


class _Parked:
    """A reserve waiting at the scheduler for something to fall due."""

    __slots__ = ("deadline", "lease_ms", "limit", "reply_to", "request_id")

    def __init__(
        self, request_id: str, reply_to: str, limit: int, lease_ms: int, deadline: float | None
    ) -> None:
        self.request_id = request_id
        self.reply_to = reply_to
        self.limit = limit
        self.lease_ms = lease_ms
        self.deadline = deadline  # the loop's time, None: no limit


class _Reply:
    __slots__ = ("body", "claimed", "kind", "queue", "reply_to", "request_id")

    def __init__(
        self,
        reply_to: str,
        request_id: str,
        kind: str,
        body: bytes,
        *,
        queue: str = "",
        claimed: list[Record] | None = None,
    ) -> None:
        self.reply_to = reply_to
        self.request_id = request_id
        self.kind = kind
        self.body = body
        self.queue = queue
        self.claimed = claimed


class Scheduler:
    """Elected once :meth:`run` is called: replays the log, then serves requests until
    :meth:`stop` (or an append fails: it then stops and calls ``on_stopped``)."""

    def __init__(
        self,
        transport: Transport,
        on_stopped: Callable[[], None],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._transport = transport
        self._on_stopped = on_stopped
        self._wall = wall
        self._reign = uuid.uuid4().hex
        self._queues: dict[str, _Journal] = {}
        self._last_now = 0
        self._dedup: collections.OrderedDict[str, tuple[str, bytes]] = collections.OrderedDict()
        self._parked: dict[str, dict[str, _Parked]] = {}
        # queue -> (exchange, routing key): the queues whose messages the scheduler
        # itself publishes at their time (configure), and how many it has in flight
        self._targets: dict[str, tuple[str, str]] = {}
        self._delivering: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._group: list[Op] = []
        self._group_bytes = 0
        self._replies: list[_Reply] = []
        self._flushing = False
        self._serving = False
        self._stopped = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewal: asyncio.TimerHandle | None = None

    # -- election, replay, stop --------------------------------------------------------

    async def run(self) -> None:
        """Take over: mark the reign in the log, fold the log up to that mark, then
        take requests and tell the clients."""
        started = time.monotonic()
        await self._transport.append("reign", self._reign, b"")
        entries = await self._replay()
        await self._transport.serve(self._on_request)
        self._serving = True
        await self._transport.announce(self._reign)
        self._schedule_renewal()
        for queue in list(self._queues):
            self._service(queue)
        for queue in list(self._targets):
            self._service(queue)
        log_event(
            logging.INFO,
            "scheduler_elected",
            reign=self._reign,
            entries=entries,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _replay(self) -> int:
        current = ""
        entries = 0
        async for kind, reign, body in self._transport.read_log():
            if kind == "reign":
                current = reign
                if reign == self._reign:
                    break
                continue
            if reign != current:  # written by a deposed scheduler after its successor began
                continue
            entries += 1
            for op in unpack(body):
                self._fold(op)
        return entries

    def _fold(self, op: Op) -> None:
        name, queue, request_id, floor, last_seq, images, deletes, kind, reply = op
        if name == "configure":
            self._configure(queue, unpack(reply))
        self._store(queue).restore(images, deletes, last_seq)
        self._last_now = max(self._last_now, floor)
        if request_id:
            self._remember(request_id, kind, reply)

    def stop(self) -> None:
        """Stop serving: timers, the renewal and pending replies are dropped (the
        clients resend to the next scheduler)."""
        if self._stopped:
            return
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._renewal is not None:
            self._renewal.cancel()
        for task in self._tasks:
            task.cancel()
        self._on_stopped()

    def _schedule_renewal(self) -> None:
        loop = asyncio.get_running_loop()
        self._renewal = loop.call_later(RENEW_EVERY, lambda: self._spawn(self._renew()))

    async def _renew(self) -> None:
        await self._transport.renew()
        self._schedule_renewal()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._stopped:
            log_event(logging.WARNING, "scheduler_stopped", reign=self._reign, error=repr(exc))
            self.stop()

    # -- state -----------------------------------------------------------------------

    def _store(self, queue: str) -> _Journal:
        store = self._queues.get(queue)
        if store is None:
            store = self._queues[queue] = _Journal()
        return store

    def _now(self) -> Now:
        # AMQP has no server time: the scheduler's wall clock, never behind any time
        # already in the log (a failover never makes "now" go back).
        now = Now.of_seconds(self._wall())
        floor = max(now.floor, self._last_now)
        self._last_now = floor
        return Now(floor, max(now.ceil, floor))

    def _remember(self, request_id: str, kind: str, reply: bytes) -> None:
        self._dedup[request_id] = (kind, reply)
        if len(self._dedup) > DEDUP_SIZE:
            self._dedup.popitem(last=False)

    # -- requests ----------------------------------------------------------------------

    def _on_request(self, delivery: Delivery) -> None:
        if self._stopped:
            return
        op, request_id, reply_to = delivery.op, delivery.request_id, delivery.reply_to
        known = self._dedup.get(request_id)
        if known is not None:
            self._commit(None, _Reply(reply_to, request_id, known[0], known[1]))
            return
        args = unpack(delivery.body)
        if op == "forget":
            self._forget(args[0], args[1])
            return
        if op == "queues":
            names = sorted(name for name, store in self._queues.items() if store.records)
            self._commit(None, _Reply(reply_to, request_id, "ok", pack(names)))
            return
        queue = args[0]
        store = self._store(queue)
        now = self._now()
        if op == "configure":
            self._configure_request(queue, args[1], request_id, reply_to, now)
            return
        try:
            outcome = self._apply(store, op, args[1:], now)
        except (DuplicateId, LeaseLost) as exc:
            kind, body = error_reply(exc)
            self._decided(
                store, op, queue, "", now=now, reply=_Reply(reply_to, request_id, kind, pack(body))
            )
            return
        if op == "reserve" and not outcome:
            limit, lease_ms, wait = args[1:4]
            if wait is None or wait > 0:
                deadline = None if wait is None else asyncio.get_running_loop().time() + wait
                self._park(queue, _Parked(request_id, reply_to, limit, lease_ms, deadline))
                self._decided(store, op, queue, "", now=now, reply=None)
                return
        reply = _Reply(
            reply_to,
            request_id,
            "ok",
            pack(encode_outcome(op, outcome)),
            queue=queue,
            claimed=outcome if op == "reserve" else None,
        )
        self._decided(store, op, queue, request_id, now=now, reply=reply)
        if store.records and (self._parked.get(queue) or queue in self._targets):
            self._service(queue)

    def _apply(self, store: _Journal, op: str, args: list[Any], now: Now) -> Any:
        if op == "put":
            return store.put(decode_requests(args[0]), now)
        if op == "reserve":
            return store.claim(now, args[0], args[1])
        if op == "ack":
            return store.ack(args[0], args[1], now)
        if op == "ack_many":
            return store.ack_many([(id, token) for id, token in args[0]], now)
        if op == "nack":
            id, token, delay_ms, error, dead = args
            return store.nack(id, token, now, delay_ms=delay_ms, error=error, dead=dead)
        if op == "release":
            return store.release(args[0], args[1], now)
        if op == "extend":
            return store.extend(args[0], args[1], now, args[2])
        if op == "cancel":
            return store.cancel(args[0], now)
        if op == "reschedule":
            return store.reschedule(args[0], now, delay_ms=args[1], at_ms=args[2])
        if op == "get":
            return store.get(args[0], now)
        if op == "stats":
            return store.stats(now)
        if op == "dead":
            return store.dead(args[0], args[1], now)
        if op == "retry_dead":
            return store.retry_dead(args[0], now)
        if op == "purge":
            return store.purge(None if args[0] is None else State(args[0]), now)
        if op == "peek":
            state, limit, after = args
            position = None if after is None else tuple(after)
            return store.peek(None if state is None else State(state), limit, position, now)
        if op == "due_counts":
            return store.due_counts(args[0], args[1], now)
        raise ValueError(f"unknown operation {op!r}")

    def _decided(
        self,
        store: _Journal,
        op: str,
        queue: str,
        request_id: str,
        *,
        now: Now,
        reply: _Reply | None,
    ) -> None:
        """Log what ``op`` changed (nothing: no entry), then send ``reply`` once it is
        in the log. A request id is logged only with a write, with its reply."""
        images, deletes = store.take_changes()
        entry: Op | None = None
        if images or deletes:
            kind, body = ("", b"") if reply is None else (reply.kind, reply.body)
            logged_id = request_id if reply is not None else ""
            entry = [op, queue, logged_id, now.floor, store.last_seq, images, deletes, kind, body]
            if logged_id:
                self._remember(logged_id, kind, body)
        self._commit(entry, reply)

    # -- group commit ----------------------------------------------------------------

    def _commit(self, entry: Op | None, reply: _Reply | None) -> None:
        if entry is not None:
            self._group.append(entry)
            self._group_bytes += sum(len(image[1]) + 128 for image in entry[5]) + 64
        if reply is not None:
            if not self._flushing and not self._group:
                self._spawn(self._send([reply]))
                return
            self._replies.append(reply)
        if not self._flushing and self._group:
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        try:
            while self._group or self._replies:
                group, replies = self._take_group()
                if group:
                    await self._transport.append("entry", self._reign, pack(group))
                await self._send(replies)
        finally:
            self._flushing = False

    def _take_group(self) -> tuple[list[Op], list[_Reply]]:
        """Everything decided so far, up to MAX_GROUP_BYTES of entries (one larger
        operation goes alone), with the replies that were decided before the rest."""
        if self._group_bytes <= MAX_GROUP_BYTES:
            group, replies = self._group, self._replies
            self._group, self._replies, self._group_bytes = [], [], 0
            return group, replies
        # Too much for one entry: the first half of the operations, and the replies
        # queued before the first operation left behind stay with what follows.
        half = max(1, len(self._group) // 2)
        group, self._group = self._group[:half], self._group[half:]
        self._group_bytes = sum(
            sum(len(image[1]) + 128 for image in entry[5]) + 64 for entry in self._group
        )
        # Replies keep their order; those of operations still pending wait for them.
        logged = {entry[2] for entry in self._group if entry[2]}
        cut = next(
            (i for i, reply in enumerate(self._replies) if reply.request_id in logged),
            len(self._replies),
        )
        replies, self._replies = self._replies[:cut], self._replies[cut:]
        return group, replies

    async def _send(self, replies: list[_Reply]) -> None:
        """Send ``replies`` in order. Only a reply that carries claimed messages waits
        for the broker's word (did its client get it?); the others are sent and left."""
        for reply in replies:
            if reply.claimed:
                self._spawn(self._reply(reply))
            else:
                await self._transport.reply(
                    reply.reply_to, reply.request_id, reply.kind, reply.body, confirm=False
                )

    async def _reply(self, reply: _Reply) -> None:
        delivered = await self._transport.reply(
            reply.reply_to, reply.request_id, reply.kind, reply.body, confirm=True
        )
        if not delivered and reply.claimed:
            # Its client is gone: give back what was claimed for it at once, rather than
            # letting it wait out a lease nobody holds.
            self._give_back(reply.queue, reply.claimed)

    def _give_back(self, queue: str, claimed: list[Record]) -> None:
        if self._stopped:
            return
        store = self._store(queue)
        now = self._now()
        for record in claimed:
            try:
                store.release(record.id, record.lease or "", now)
            except LeaseLost:
                continue
        self._decided(store, "release", queue, "", now=now, reply=None)
        self._service(queue)

    # -- waiting reserves and timers ---------------------------------------------------

    def _park(self, queue: str, waiter: _Parked) -> None:
        parked = self._parked.setdefault(queue, {})
        if waiter.request_id not in parked:  # a resend of a parked reserve waits once
            parked[waiter.request_id] = waiter
            self._arm(queue)

    def _forget(self, queue: str, request_id: str) -> None:
        parked = self._parked.get(queue)
        if parked is not None:
            parked.pop(request_id, None)

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
            claimed = store.claim(now, waiter.limit, waiter.lease_ms)
            if claimed:
                del parked[request_id]
                body = pack(encode_outcome("reserve", claimed))
                reply = _Reply(
                    waiter.reply_to, request_id, "ok", body, queue=queue, claimed=claimed
                )
                self._decided(store, "reserve", queue, request_id, now=now, reply=reply)
            elif waiter.deadline is not None and waiter.deadline <= loop.time():
                del parked[request_id]
                self._decided(
                    store,
                    "reserve",
                    queue,
                    "",
                    now=now,
                    reply=_Reply(waiter.reply_to, request_id, "ok", pack([])),
                )
            else:
                self._decided(store, "reserve", queue, "", now=now, reply=None)
        self._arm(queue)

    def _arm(self, queue: str) -> None:
        timer = self._timers.pop(queue, None)
        if timer is not None:
            timer.cancel()
        parked = self._parked.get(queue) or {}
        if (not parked and queue not in self._targets) or self._stopped:
            return
        loop = asyncio.get_running_loop()
        at: float | None = None
        event = self._store(queue).next_event()
        if event is not None:
            # The loop's time of the due millisecond, plus a hair so that the floored
            # now has reached it (the service checks, and re-arms when it has not).
            at = loop.time() + max(event / 1000.0 - self._wall(), 0.0) + 5e-5
        for waiter in parked.values():
            if waiter.deadline is not None and (at is None or waiter.deadline < at):
                at = waiter.deadline
        if at is not None:
            self._timers[queue] = loop.call_at(at, self._service, queue)

    # -- delivering to a user's exchange -------------------------------------------------

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
        reply = _Reply(reply_to, request_id, "ok", pack(None))
        if self._targets.get(queue) == wanted:
            self._commit(None, reply)
            return
        self._configure(queue, target)
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
        if room <= 0:
            return False
        store = self._store(queue)
        now = self._now()
        claimed = store.claim(now, room, DELIVER_LEASE_MS)
        self._decided(store, "reserve", queue, "", now=now, reply=None)
        self._delivering[queue] = in_flight + len(claimed)
        exchange, routing_key = self._targets[queue]
        for record in claimed:
            self._spawn(self._deliver_one(queue, exchange, routing_key, record))
        return len(claimed) < room

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
