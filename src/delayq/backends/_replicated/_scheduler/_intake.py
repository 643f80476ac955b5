"""The intake's fold (docs/rabbitmq.md, "Fast put"): clients append puts to the intake
themselves; the scheduler tails it and decides each put as a request of its own (its
request id in the dedup table, so a put appended twice, or folded again by a successor,
is stored once), then logs an ``intake`` operation ``[offset, client, seq]``: the
intake is folded up to there (a new scheduler resumes after it) and that client's
messages up to ``seq``. A request that starts with an ``after`` part (its client's last
confirmed intake message) waits until that message is folded, with the client's later
requests behind it (read-your-writes); while it waits, its client is told every
FOLDING_EVERY s in which the fold advanced, so that a long fold (a burst of fast puts,
a slow broker) does not make it give up at its request timeout. Nudges (copies of a
put due soon) and the sweeps that release the requests of a client not known yet are
here too."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...._log import log_event
from ....durable.message import Now
from .._codec import decode_requests, encode_outcome, pack, unpack
from .._constants import (
    CLIENTS_KEPT,
    FOLDING_EVERY,
    FULL_EVERY,
    QUIET_AFTER,
    QUIET_EVERY,
)
from ._state import INTAKE, SchedulerState

__all__ = ["Intake"]


def _intake_message(body: bytes) -> tuple[str, int, int, int, list[list[Any]]]:
    """An intake message's ``client, seq, floor, ceil, puts``, each put a ``[request id,
    queue, requests]``; ValueError when ``body`` is not one."""
    message = unpack(body)
    if not isinstance(message, list) or len(message) != 5:
        raise ValueError("not an intake message")
    client, seq, floor, ceil, puts = message
    if not (
        isinstance(client, str)
        and all(isinstance(n, int) for n in (seq, floor, ceil))
        and isinstance(puts, list)
        and all(
            isinstance(put, list)
            and len(put) == 3
            and isinstance(put[0], str)
            and isinstance(put[1], str)
            for put in puts
        )
    ):
        raise ValueError("not an intake message")
    return client, seq, floor, ceil, puts


class Intake(SchedulerState):
    """Folding the intake's puts, and the requests that wait for them."""

    def _sweep(self, client: str) -> None:
        """A request of a client this scheduler does not know waits behind its intake
        message (not folded yet, or folded so long ago that the client was forgotten,
        CLIENTS_KEPT): a marker appended to the intake after the request came lands
        after that message, so once the marker is read the request is released."""
        self._unknown.add(client)
        if self._sweeping is None:
            self._sweeping, self._unknown = self._unknown, set()
            body = pack([self._reign, sorted(self._sweeping)])
            self._spawn(self._transport.mark_intake(body))

    def _holding(self) -> None:
        """A request is held behind its client's intake message: tell the clients of
        the held requests about the fold, every FOLDING_EVERY s while any is held."""
        if self._folding_timer is None and not self._stopped:
            self._folding_from = self._intake_next
            loop = asyncio.get_running_loop()
            self._folding_timer = loop.call_later(FOLDING_EVERY, self._tell_folding)

    def _tell_folding(self) -> None:
        """When the fold advanced since the last time (the intake's next offset moved),
        send each client with held requests a FOLDING reply with no request id, their
        ids its body: the client waits a request timeout more from it. A fold that
        does not advance says nothing: its clients give up at their request timeout,
        as for any request that gets no answer."""
        self._folding_timer = None
        if self._stopped or not self._held:
            return
        if self._intake_next != self._folding_from:
            self._folding_from = self._intake_next
            waiting: dict[str, list[str]] = {}
            for held in self._held.values():
                for _, reply_to, parts in held:
                    ids = waiting.setdefault(reply_to, [])
                    ids += [request_id for _, request_id, _ in parts if request_id]
            for reply_to, ids in waiting.items():
                if ids:
                    self._tell_at_work(reply_to, ids)
        loop = asyncio.get_running_loop()
        self._folding_timer = loop.call_later(FOLDING_EVERY, self._tell_folding)

    def _on_marker(self, body: bytes) -> None:
        """A sweep's marker was read: release its clients' held requests."""
        try:
            marker = unpack(body)
            if isinstance(marker, list) and len(marker) == 3 and marker[1] == "dedup":
                self._on_dedup_marker(marker[0], marker[2])  # a prune's (_dedup.py)
                return
            reign, clients = marker
        except Exception:  # not a sweep's (a new scheduler's end marker)
            return
        if self._stopped or reign != self._reign or clients != sorted(self._sweeping or ()):
            return
        if self._sweeping is None:
            return
        swept, self._sweeping = self._sweeping, None
        for client in swept:
            held = self._held.get(client)
            if held:
                self._clients[client] = max(self._clients.get(client, 0), held[-1][0])
                self._release(client)
        if self._unknown:
            self._sweep(self._unknown.pop())

    def _release(self, client: str) -> None:
        """Take the held requests of ``client`` whose intake message is folded."""
        held = self._held.get(client)
        while held and held[0][0] <= self._clients.get(client, 0):
            _, reply_to, parts = held.popleft()
            self._take_parts(reply_to, parts)
        if held is not None and not held:
            del self._held[client]

    def _folded(self, offset: int, client: str, seq: int) -> None:
        """The intake is folded up to ``offset``, ``client``'s messages up to ``seq``."""
        self._intake_next = offset + 1
        self._clients[client] = max(seq, self._clients.pop(client, 0))
        if len(self._clients) > CLIENTS_KEPT:
            self._clients.popitem(last=False)

    def _on_intake_gap(self, expected: int, found: int) -> None:
        """The intake's retention dropped its messages from offset ``expected`` before
        they were folded (no scheduler ran for that long): the puts they held are lost.
        Said loudly; the fold goes on from ``found``."""
        self._intake_lost += found - expected
        log_event(
            logging.ERROR,
            "intake_lost",
            reign=self._reign,
            expected=expected,
            found=found,
            offsets=found - expected,
            intake_lost=self._intake_lost,
            why="the intake's retention dropped fast puts no scheduler had folded "
            "(each offset at most one intake message, of one put or more): they are lost",
        )

    def _on_intake(self, offset: int, body: bytes) -> None:
        """Fold an intake message: each put as if it had come as a request (dedup by its
        id), then the ``intake`` operation; then the requests its client's waited."""
        if self._stopped:
            return
        try:
            client, seq, floor, ceil, puts = _intake_message(body)
        except Exception as exc:  # bytes no client of delayq appends: said and skipped
            log_event(
                logging.ERROR, "intake_bad", reign=self._reign, offset=offset, error=repr(exc)
            )
            return
        self._fold_puts(puts, floor, ceil)
        self._folded(offset, client, seq)
        note = pack([offset, client, seq])
        self._commit([INTAKE, "", "", self._last_now, 0, [], [], "", note], None, folded=True)
        self._release(client)

    def _on_nudge(self, body: bytes) -> None:
        """A copy of an intake message that puts something due within FIRE_AHEAD_MS,
        routed here by the publish that appended it: it comes before the intake's tail
        brings the message, by up to a few ms. Its puts are folded now, once every
        earlier message of that client is folded (their order kept), and logged as
        the intake's would be; the intake's copy then finds them in the dedup table
        and only notes its ``intake`` operation (the log stays replay's only input).
        A copy that is no intake message raises (said as ``request_bad``)."""
        client, seq, floor, ceil, puts = _intake_message(body)
        self._weigh_nudge()
        if self._clients.get(client, 0) != seq - 1:
            return  # an earlier message is not folded yet, or this one already is
        self._fold_puts(puts, floor, ceil)

    def _weigh_nudge(self) -> None:
        """A nudge came: when no reserve has waited for QUIET_AFTER s and no queue is
        delivered to an exchange, it helped no one (the intake's tail brings its puts
        a few ms later), so the clients are told ``quiet`` (at most every QUIET_EVERY
        s), and copy no puts to the scheduler until a reserve parks (_wanted)."""
        now = asyncio.get_running_loop().time()
        if (
            self._targets
            or now - self._waited < QUIET_AFTER
            or now - self._quiet_told < QUIET_EVERY
            or any(self._parked.values())
        ):
            return
        self._quiet_told = now
        self._nudged = False
        self._spawn(self._transport.tell_nudges(False))

    def _wanted(self) -> None:
        """A reserve parks or a queue is delivered to an exchange: nudges help again."""
        self._waited = asyncio.get_running_loop().time()
        if not self._nudged:
            self._nudged = True
            self._spawn(self._transport.tell_nudges(True))

    def _fold_puts(self, puts: list[Any], floor: int, ceil: int) -> None:
        """Decide the puts of an intake message (sent at ``floor``/``ceil`` by its
        client's clock), each once (its request id in the dedup table)."""
        for request_id, queue, requests in puts:
            if request_id in self._dedup:
                continue  # appended twice, nudged, or folded by a scheduler before
            store = self._store(queue)
            now = self._now()
            if floor < now.floor:
                # Decided as of its call (its delay counts from there, as the plain
                # put's from its arrival), never later than now: the client's clock.
                now = Now(floor, ceil)
            try:
                if self._max_live:
                    self._weigh_fast(queue, requests)
                kept = store.put(decode_requests(requests), now)
            except Exception as exc:  # not a put a client could send: dropped, and said
                store.take_changes()
                log_event(
                    logging.ERROR,
                    "fast_put_dropped",
                    reign=self._reign,
                    queue=queue,
                    request_id=request_id,
                    error=repr(exc),
                )
                continue
            reply = pack(encode_outcome("put", kept))
            entry = self._entry(
                store, "put", queue, request_id, now=now, kind="ok", body=reply, always=True
            )
            self._commit(entry, None, folded=True)
            if self._parked.get(queue) or queue in self._targets:
                self._service(queue)

    def _weigh_fast(self, queue: str, requests: list[list[Any]]) -> None:
        """A fast put cannot be refused (its client has its confirm): past the limit it
        is taken and logged, and the clients are told (at most every FULL_EVERY s) to
        put through the scheduler, which refuses with LogFull, until one is taken."""
        why = self._overweight(requests)
        if not why:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._full_told >= FULL_EVERY:
            self._full_told = loop.time()
            why = f"a fast put was taken past the limit (its client had its confirm): {why}"
            log_event(logging.WARNING, "put_over_limit", reign=self._reign, queue=queue, why=why)
            self._spawn(self._transport.warn_full())
