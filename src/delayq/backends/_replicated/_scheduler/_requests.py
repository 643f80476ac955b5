"""The requests a client sends (alone, or as parts of a ``batch``): each decided by
the pure transitions on the queue's journal, and logged with its reply (_group_commit.py)."""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from ...._log import log_event
from ....durable.message import Now, State
from ....errors import DuplicateId, LeaseLost
from ..._far import Far
from .._codec import decode_requests, encode_outcome, error_reply, pack, unpack
from .._constants import FOLDING_EVERY
from .._transport import Delivery, LogFull
from ._journal import Journal
from ._state import ID_BYTES, PIECE_BYTES, Parked, Reply, SchedulerState

__all__ = ["Requests"]

#: Operations that see a message by its id, and those that see the whole queue: a
#: message claimed ahead whose held reply has not left is given back before them
#: (_retract), so that they find it as if it had not been claimed.
_BY_ID = frozenset({"cancel", "reschedule", "get", "put"})
_WHOLE_QUEUE = frozenset({"stats", "peek", "purge", "due_counts"})
#: The reply kind a purge's request id is remembered with while the deletions of the
#: far records it took are logged a piece at a time, its body ``[through, count]``:
#: the queue's last sequence number when it was decided and its answer. A resend that
#: finds it (after a failover) purges only what the purge took and had not logged.
_PURGING = "purging"
#: The most ids read at a time from the far records a purge took, and what an id is
#: taken to weigh in a piece until some are read (a uuid's hex, ID_BYTES).
_IDS_AT_ONCE = 1000
_ID_GUESS = 34


class Requests(SchedulerState):
    """Deciding each request a client sends."""

    def _on_request(self, delivery: Delivery) -> None:
        if self._stopped:
            return
        try:
            self._take_request(delivery)
        except Exception as exc:
            # Bytes no client of delayq sends (anyone who may publish to the namespace
            # can send them): said, and the scheduler goes on serving.
            log_event(
                logging.ERROR,
                "request_bad",
                reign=self._reign,
                op=delivery.op,
                request_id=delivery.request_id,
                error=repr(exc),
            )

    def _take_request(self, delivery: Delivery) -> None:
        op, request_id, reply_to = delivery.op, delivery.request_id, delivery.reply_to
        if op == "batch":
            # Requests of one client coalesced (its outbox): each is taken as if it had
            # come alone, in order; their replies leave together (_send).
            self._take_parts(reply_to, unpack(delivery.body))
            return
        if op == "puts":  # a copy of an intake message (append_intake's nudge)
            self._on_nudge(delivery.body)
            return
        args = unpack(delivery.body)
        if op == "reserve":
            waiter = self._parked.get(args[0], {}).get(request_id)
            if waiter is not None:
                # A resend of a reserve still parked (its client resent after an
                # election, or on a new connection) joins it: one answer for one
                # request id, sent where the resend came from, since its client may
                # have given up the old connection's inbox. It is served with what is
                # due now, if anything is, as the parked one would be.
                waiter.reply_to = reply_to
                self._service(args[0])
                return
        known = self._dedup.get(request_id)
        if known is not None and known[0] == _PURGING:
            self._purge_again(request_id, reply_to, args, known[1])
            return
        if known is not None:
            claiming = self._claiming.get(request_id)
            if claiming is not None:
                claiming.resent = True  # one that does not reach its client gives back nothing
            self._commit(None, Reply(reply_to, request_id, known[0], known[1]))
            return
        if op == "forget":
            self._forget(args[0], args[1])
            return
        if op == "sync":  # a client waited behind its fast puts (the ``after`` part)
            self._commit(None, Reply(reply_to, request_id, "ok", pack(None)))
            return
        if op == "queues":
            names = sorted(name for name, store in self._queues.items() if len(store))
            self._commit(None, Reply(reply_to, request_id, "ok", pack(names)))
            return
        queue = args[0]
        store = self._store(queue)
        now = self._now()
        if op == "configure":
            self._configure_request(queue, args[1], request_id, reply_to, now)
            return
        retracted = self._retract(store, queue, op, args, now)
        aside = len(store.aside)
        try:
            if op == "put" and self._max_live:
                self._weigh(queue, args[1])
            outcome = self._apply(store, op, args[1:], now)
        except (DuplicateId, LeaseLost, LogFull) as exc:
            kind, body = error_reply(exc)
            self._decided(
                store, op, queue, "", now=now, reply=Reply(reply_to, request_id, kind, pack(body))
            )
            if retracted:
                self._service(queue)
            return
        except Exception:
            # Arguments no client sends: what was changed before they failed (a
            # retraction, say) is logged all the same, so the state stays the log's.
            self._decided(store, op, queue, "", now=now, reply=None)
            if retracted:
                self._service(queue)
            raise
        if op == "purge" and len(store.aside) > aside:
            self._purge_in_steps(
                store, queue, request_id, reply_to, now=now, through=store.last_seq, count=outcome
            )
            if retracted:
                self._service(queue)
            return
        if op == "reserve" and not outcome:
            limit, lease_ms, wait = args[1:4]
            if wait is None or wait > 0:
                deadline = None if wait is None else asyncio.get_running_loop().time() + wait
                self._park(queue, Parked(request_id, reply_to, limit, lease_ms, deadline))
                self._decided(store, op, queue, "", now=now, reply=None)
                if len(store):
                    self._service(queue)  # something due soon is claimed ahead for it
                return
        reply = Reply(
            reply_to,
            request_id,
            "ok",
            pack(encode_outcome(op, outcome)),
            queue=queue,
            claimed=outcome if op == "reserve" else None,
        )
        self._decided(store, op, queue, request_id, now=now, reply=reply)
        if retracted or (len(store) and (self._parked.get(queue) or queue in self._targets)):
            self._service(queue)

    def _purge_in_steps(
        self,
        store: Journal,
        queue: str,
        request_id: str,
        reply_to: str,
        *,
        now: Now,
        through: int,
        count: int,
    ) -> None:
        """Log what a purge changed in memory now, and the deletion of the far records it
        took (set aside: ``store.aside[-1]``, out of every read already) a piece at a
        time, letting the loop turn between pieces: a purge of millions holds it for
        milliseconds at a time, not for the whole queue (RabbitMQ would reset a
        connection that misses its heartbeats meanwhile). Its reply leaves with the
        last piece."""
        marker = pack([through, count])
        entry = self._entry(
            store, "purge", queue, request_id, now=now, kind=_PURGING, body=marker, always=True
        )
        self._commit(entry, None)
        if request_id:
            self._purges[request_id] = reply_to
        purged = store.aside[-1]
        self._spawn(
            self._log_purged(
                store, queue, purged, request_id=request_id, reply_to=reply_to, count=count
            )
        )

    async def _log_purged(
        self, store: Journal, queue: str, purged: Far, *, request_id: str, reply_to: str, count: int
    ) -> None:
        loop = asyncio.get_running_loop()
        on_their_way: collections.deque[asyncio.Future[None]] = collections.deque()
        after, told, started, pieces, far = "", loop.time(), loop.time(), 0, purged.count
        try:
            while True:
                if request_id and loop.time() - told >= FOLDING_EVERY:
                    # Its client waits a request timeout more from this word (as for a
                    # request held behind a fold): a purge of millions outlasts one.
                    told = loop.time()
                    self._tell_at_work(self._purges.get(request_id, reply_to), [request_id])
                # One piece, read and committed with no turn of the loop between: an id
                # put again meanwhile (Journal.put) is either logged deleted before its
                # new image or not at all.
                ids: list[str] = []
                size, page, each = 0, [after], _ID_GUESS
                while page and size < PIECE_BYTES:
                    most = min(_IDS_AT_ONCE, (PIECE_BYTES - size) // each + 1)
                    page = purged.ids_after(after, most)
                    if page:
                        after = page[-1]
                        ids += page
                        size += sum(map(len, page)) + ID_BYTES * len(page)
                        each = max(each, size // len(ids))
                if not page:
                    break
                done = loop.create_future()
                piece = ["purge", queue, "", self._now().floor, store.last_seq, [], ids, "", b""]
                self._commit(piece, Reply("", "", "", b"", done=done))
                pieces += 1
                on_their_way.append(done)
                if len(on_their_way) > 1:  # at most two pieces wait for their append
                    await on_their_way.popleft()
                else:
                    await asyncio.sleep(0)
            body = pack(encode_outcome("purge", count))
            if request_id:
                reply_to = self._purges.pop(request_id, reply_to)
                self._remember(request_id, "ok", body)
            last = ["purge", queue, request_id, self._now().floor, store.last_seq, [], ids]
            store.aside.remove(purged)  # nothing reads it any more
            self._commit([*last, "ok", body], Reply(reply_to, request_id, "ok", body))
            log_event(
                logging.INFO,
                "purge_logged",
                reign=self._reign,
                queue=queue,
                purged=count,
                far=far,
                pieces=pieces + 1,
                seconds=round(loop.time() - started, 3),
            )
            # Its database gives its file back (a purge of millions: a file of gigabytes,
            # which the kernel frees in tenths of a second) away from the loop.
            await asyncio.to_thread(purged.close)
        finally:
            purged.close()
            if purged in store.aside:
                store.aside.remove(purged)

    def _purge_again(self, request_id: str, reply_to: str, args: list[Any], marker: bytes) -> None:
        """A purge resent while its far records' deletions are logged: here (its reply
        goes where the resend came from), or by a scheduler that stopped before the
        last (after a failover: what it took and had not logged is purged now)."""
        if request_id in self._purges:
            self._purges[request_id] = reply_to
            return
        through, count = unpack(marker)
        queue, state = args[0], None if args[1] is None else State(args[1])
        store = self._store(queue)
        now = self._now()
        retracted = self._retract(store, queue, "purge", args, now)
        aside = len(store.aside)
        store.purge(state, now, through)
        if len(store.aside) > aside:
            self._purge_in_steps(
                store, queue, request_id, reply_to, now=now, through=through, count=count
            )
        else:
            body = pack(encode_outcome("purge", count))
            reply = Reply(reply_to, request_id, "ok", body)
            self._decided(store, "purge", queue, request_id, now=now, reply=reply)
        if retracted:
            self._service(queue)

    def _take_parts(self, reply_to: str, parts: list[Any]) -> None:
        """Take a batch's requests in order; from an ``after`` part on, they wait until
        its client's intake message is folded, behind that client's earlier waiting
        requests."""
        for at, (op, request_id, body) in enumerate(parts):
            if op == "after":
                client, seq = unpack(body)
                held = self._held.get(client)
                if held or self._clients.get(client, 0) < seq:
                    if held is None:
                        held = self._held[client] = collections.deque()
                    held.append((seq, reply_to, parts[at + 1 :]))
                    self._holding()
                    if client not in self._clients:
                        self._sweep(client)
                    return
                continue
            self._on_request(Delivery(op, request_id, reply_to, body))

    def _retract(self, store: Journal, queue: str, op: str, args: list[Any], now: Now) -> bool:
        """Before ``op``: give back the messages claimed ahead for a parked reserve whose
        held reply has not left yet (_drop_ahead: due time and place kept, no attempt
        charged, logged with ``op``) when ``op`` sees them (by id: cancel, reschedule,
        get, a put that replaces; or the whole queue: stats, peek, purge, due counts),
        so that it finds them as if they had not been claimed. The reserve stays parked
        and may claim ahead again (_service, after ``op``). True when it gave any back."""
        parked = self._parked.get(queue)
        if not parked or (op not in _BY_ID and op not in _WHOLE_QUEUE):
            return False
        ids: set[str] | None = None
        if op == "put":
            ids = {request[0] for request in args[1] if request[7] == "replace"}
        elif op in _BY_ID:
            ids = {args[1]}
        retracted = False
        for waiter in parked.values():
            claimed = waiter.ahead.claimed if waiter.ahead is not None else None
            if claimed and (ids is None or any(record.id in ids for record in claimed)):
                self._drop_ahead(store, waiter, now)
                retracted = True
        return retracted

    def _weigh(self, queue: str, requests: list[list[Any]]) -> None:
        """LogFull when a put of ``requests`` (encoded) would make the live images
        outgrow a quarter of the log's retention: retention keeps two checkpoints'
        worth of log, so it never drops the last image of a live message."""
        why = self._overweight(requests)
        if not why:
            return
        log_event(logging.WARNING, "put_refused", reign=self._reign, queue=queue, why=why)
        raise LogFull(f"put refused: {why}")

    def _apply(self, store: Journal, op: str, args: list[Any], now: Now) -> Any:
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
            if len(args) > 2 and args[2]:
                # A link gives back what a reserve claimed for a caller that did not
                # receive it (``unclaim`` set; a scheduler before it ignores the flag):
                # undone as if never claimed, even once the caller's lease ran out.
                store.unclaim(args[0], args[1])
                return None
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
