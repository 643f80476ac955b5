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
from .._codec import decode_requests, encode_outcome, error_reply, pack, unpack
from .._transport import Delivery, LogFull
from ._journal import Journal
from ._state import Parked, Reply, SchedulerState

__all__ = ["Requests"]

#: Operations that see a message by its id, and those that see the whole queue: a
#: message claimed ahead whose held reply has not left is given back before them
#: (_retract), so that they find it as if it had not been claimed.
_BY_ID = frozenset({"cancel", "reschedule", "get", "put"})
_WHOLE_QUEUE = frozenset({"stats", "peek", "purge", "due_counts"})


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
