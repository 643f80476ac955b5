"""Election and replay: the reign's mark in the log, the fold of the log from the last
checkpoint's pointer up to it (a fold with no clock and no decision), then serving;
the renewal of the election while the reign lasts. A hot standby starts that same fold
while it waits (:meth:`Reign.stand_by`): it follows the log as it grows, so that once
elected it folds only the entries after where it is, up to its mark."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from ...._log import log_event
from .._codec import pack, unpack
from .._constants import FOLLOW_STALL, RENEW_EVERY, STANDBY_IDLE, STANDBY_SWEEP_BYTES
from .._transport import LogEntry
from ._state import BEGIN, DEDUP, END, IMAGES, INTAKE, PRUNE, Op, SchedulerState

__all__ = ["Reign"]


class _Gone(Exception):
    """The log no longer holds where a replay was to start."""


class Reign(SchedulerState):
    """Taking over (:meth:`run`): replay, then requests, the intake's tail and the
    timers; the replay started ahead by a hot standby (:meth:`stand_by`)."""

    @property
    def elected(self) -> bool:
        """Whether :meth:`run` was called (before: a standby, if it folds at all)."""
        return self._elected

    def stand_by(self) -> None:
        """Start the fold of the log now (a hot standby: before this process is
        elected, the fold follows the log as it grows, and stops at this reign's mark
        once :meth:`run` appends it). Its failure before the election stops this
        scheduler (the link then elects a new one cold)."""
        if self._replaying is not None:
            return
        task = asyncio.get_running_loop().create_task(self._replay())
        self._replaying = task
        self._tasks.add(task)
        task.add_done_callback(self._followed)

    def _followed(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or self._elected or self._stopped:
            return  # once elected, run() awaits it and raises what it raised
        log_event(
            logging.WARNING, "standby_stopped", reign=self._reign, error=repr(task.exception())
        )
        self.stop()

    def _sweep_idle(self) -> None:
        """Once a hot standby's log went quiet (STANDBY_IDLE) after it folded entries:
        ``standby_caught_up`` (at DEBUG; INFO with a collection), and a full garbage
        collection when it folded STANDBY_SWEEP_BYTES since its last one and a quarter
        of what it folded before (the collector's own rule for a full collection: as
        many as it would make, not one per pause of the reader). Left to the collector,
        the full one its fold calls for comes at a moment of its own, perhaps the
        election (seconds at a million records)."""
        self._sweeping_timer = None
        if self._elected or self._stopped:
            return
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._read_at
        if quiet < STANDBY_IDLE:
            self._sweeping_timer = loop.call_later(STANDBY_IDLE - quiet, self._sweep_idle)
            return
        collected = None
        if self._unswept >= max(STANDBY_SWEEP_BYTES, self._swept // 4):
            self._swept += self._unswept
            self._unswept = 0
            started = time.monotonic()
            gc.collect()
            collected = round(time.monotonic() - started, 3)
        log_event(
            logging.DEBUG if collected is None else logging.INFO,
            "standby_caught_up",
            reign=self._reign,
            entries=self._entries,
            messages=sum(len(store) for store in self._queues.values()),
            collected_in=collected,
        )

    async def run(self) -> None:
        """Take over: mark the reign in the log, fold the log up to that mark (from the
        last checkpoint, or from where a hot standby's fold is), then take requests and
        tell the clients."""
        started = time.monotonic()
        self._elected = True
        hot = self._replaying is not None
        self.stand_by()
        await self._transport.append("reign", self._reign, b"")
        folded = self._entries
        log, start, entries = await self._reached(hot)
        await log.aclose()  # type: ignore[attr-defined]
        # The puts confirmed by the intake before this election are folded before any
        # request is served (a put that returned is seen by every request after it).
        await self._transport.tail_intake(
            self._intake_next, self._on_intake, self._on_marker, self._on_intake_gap
        )
        await self._transport.serve(self._on_request)
        self._serving = True
        await self._transport.announce(self._reign)
        self._schedule_renewal()
        self._start_pruning()
        for queue in list(self._queues):
            self._service(queue)
        for queue in list(self._targets):
            self._service(queue)
        log_event(
            logging.INFO,
            "scheduler_elected",
            reign=self._reign,
            namespace=self._transport.namespace,
            standby="hot" if hot else "cold",
            start=start,
            entries=entries,
            at_election=entries - folded,
            intake_lost=self._intake_lost,
            seconds=round(time.monotonic() - started, 3),
        )
        self._maybe_checkpoint()

    async def _reached(self, hot: bool) -> tuple[AsyncIterator[LogEntry], int | None, int]:
        """What :meth:`_replay` returns, once the fold reached this reign's mark. A hot
        standby's reader has been open for long (the broker may have dropped its
        consumer without a word): one that brings nothing for FOLLOW_STALL s raises
        ConnectionError (this scheduler stops; the next election replays)."""
        task = self._replaying
        assert task is not None
        loop = asyncio.get_running_loop()
        marked = loop.time()
        watched = hot and self._read_at > 0
        while watched and not task.done():
            await asyncio.wait({task}, timeout=FOLLOW_STALL)
            if not task.done() and loop.time() - max(self._read_at, marked) >= FOLLOW_STALL:
                task.cancel()
                raise ConnectionError(
                    f"the standby's reader of the log brought nothing for {FOLLOW_STALL:g} s"
                )
        return await task

    async def _replay(self) -> tuple[AsyncIterator[LogEntry], int | None, int]:
        """Fold the log up to this reign's mark, from the last checkpoint's pointer
        (none: from the log's first entry). Returns the reader, left at the mark (the
        scheduler goes on tailing its own log), where the fold began (None: the first
        entry) and how many entries it folded. Started before the mark (a hot
        standby), it follows the log until the mark comes."""
        transport = self._transport
        pointer = await transport.read_pointer()
        if pointer is not None:
            if not self._elected:
                # Again, after the marker read_pointer left, for a replay meanwhile.
                await transport.point(pointer)
            reign, offset, checkpoint = unpack(pointer)
            log = transport.read_log(offset)
            try:
                entries = await self._fold_log(log, offset, reign, checkpoint)
                # Again, after the marker read_pointer left: the next reader finds it
                # (or the newer one the fold read, whose checkpoint is complete).
                await transport.point(self._pointed or pointer)
                return log, offset, entries
            except _Gone as gone:
                await log.aclose()  # type: ignore[attr-defined]
                self._gone(offset, gone, "the log no longer holds what the last pointer names")
        log = transport.read_log(None)
        if pointer is None:
            try:
                entries = await self._fold_log(log, 0, "", "")
                if self._pointed is not None:
                    await transport.point(self._pointed)
                return log, None, entries
            except _Gone as gone:  # the log's head was dropped: it does not start at 0
                await log.aclose()  # type: ignore[attr-defined]
                self._gone(None, gone, "no pointer was found and the log dropped its head")
        found = await self._find_checkpoint(transport.read_log(None))
        if found is None:
            raise RuntimeError(
                "the log dropped its first entries (retention) and holds no complete "
                "checkpoint: the state cannot be rebuilt without losing messages, so this "
                "scheduler does not take over"
            )
        reign, offset, checkpoint = found
        log = transport.read_log(offset)
        entries = await self._fold_log(log, offset, reign, checkpoint)
        await transport.point(self._pointed or pack([reign, offset, checkpoint]))
        return log, offset, entries

    def _gone(self, pointer: int | None, gone: _Gone, what: str) -> None:
        log_event(
            logging.WARNING,
            "checkpoint_gone",
            reign=self._reign,
            pointer=pointer,
            first=gone.args[0],
            why=f"{what} (its retention): looking for the latest complete checkpoint "
            f"the log still holds",
        )

    async def _fold_log(
        self, log: AsyncIterator[LogEntry], start: int, reign: str, checkpoint: str
    ) -> int:
        """Fold ``log`` (read from ``start``, where ``checkpoint`` of ``reign`` began;
        "": the log's first entry) up to this reign's mark; :class:`_Gone` when the log
        no longer begins at ``start``. The last complete checkpoint it reads becomes
        the pointer to publish (``_pointed``), and the log's growth counts from it."""
        current = reign
        entries = 0
        first = True
        self._pointed = None
        waiting = bool(checkpoint)  # ops before the checkpoint's begin are skipped
        loop = asyncio.get_running_loop()
        # A checkpoint begun in the current reign: its pointer, and the growth before it.
        begun: tuple[bytes, int, int] | None = None
        async for entry in log:
            self._read_at = loop.time()
            if first and entry.offset != start:
                raise _Gone(entry.offset)
            first = False
            if entry.kind == "reign":
                current = entry.reign
                begun = None  # a checkpoint cut by a new reign is incomplete
                if entry.reign == self._reign:
                    if waiting:  # the pointer's checkpoint is not there: look for one
                        raise _Gone(start)
                    self._reign_offset = entry.offset
                    return entries
                continue
            if entry.reign != current:  # written by a deposed scheduler after its successor
                continue
            what, _, mark = entry.mark.partition(":")
            if what == "begin":
                where = pack([entry.reign, entry.offset, mark])
                begun = (where, self._grown_bytes, self._grown_entries)
            entries += 1
            self._entries += 1
            if not self._elected:
                self._unswept += len(entry.body)
                if self._sweeping_timer is None:
                    self._sweeping_timer = loop.call_later(STANDBY_IDLE, self._sweep_idle)
            self._grown_bytes += len(entry.body)  # rolled images too: a new reign
            self._grown_entries += 1  # checkpoints soon after a long replay
            for op in unpack(entry.body):
                if waiting:
                    if op[0] == BEGIN and op[2] == f"begin:{checkpoint}":
                        waiting = False
                        self._restart(unpack(op[8]))
                    continue
                self._fold(op)
            if what == "end" and begun is not None and unpack(begun[0])[2] == mark:
                self._pointed, bytes_before, entries_before = begun
                self._grown_bytes -= bytes_before
                self._grown_entries -= entries_before
                begun = None
        raise ConnectionError("the log ended before this scheduler's reign entry")

    async def _find_checkpoint(self, log: AsyncIterator[LogEntry]) -> tuple[str, int, str] | None:
        """``(reign, offset of begin, id)`` of the last complete checkpoint in ``log``
        (read from its first entry up to this reign's mark), None if there is none."""
        found: tuple[str, int, str] | None = None
        begun: tuple[str, int, str] | None = None
        loop = asyncio.get_running_loop()
        try:
            async for entry in log:
                self._read_at = loop.time()
                if entry.kind == "reign":
                    begun = None  # a checkpoint cut by a new reign is incomplete
                    if entry.reign == self._reign:
                        return found
                    continue
                what, _, checkpoint = entry.mark.partition(":")
                if what == "begin":
                    begun = (entry.reign, entry.offset, checkpoint)
                elif what == "end" and begun is not None and begun[2] == checkpoint:
                    found, begun = begun, None
        finally:
            await log.aclose()  # type: ignore[attr-defined]
        return found

    def _restart(self, begin: list[Any]) -> None:
        """The state a checkpoint's begin operation carries (replay starts there)."""
        _, last_now, seqs, targets, dedup = begin[:5]
        if len(begin) > 5:  # the intake's state (a log written before fast puts has none)
            self._intake_next, clients = begin[5]
            for client, seq in clients:
                self._clients[client] = seq
        self._last_now = max(self._last_now, last_now)
        for queue, last_seq in seqs.items():
            store = self._store(queue)
            store.last_seq = max(store.last_seq, last_seq)
        for queue, target in targets.items():
            self._configure(queue, target)
        # Decided at the time each carries; a checkpoint written before the entries
        # carried one (three fields): at the begin's (this reign keeps them all for its
        # first DEDUP_WINDOW s in any case). Newer checkpoints carry them after the
        # begin, in DEDUP operations.
        for request_id, kind, reply, *at in dedup:
            self._remember(request_id, kind, reply, at[0] if at else last_now)

    def _fold(self, op: Op) -> None:
        name, queue, request_id, floor, last_seq, images, deletes, kind, reply = op
        if name in (BEGIN, END):
            return  # a checkpoint's bounds matter only where a replay starts
        if name == PRUNE:  # entries the scheduler dropped (_dedup.py)
            self._prune(unpack(reply))
            return
        if name == DEDUP:  # a chunk of the dedup table as it stood (_checkpoints.py)
            for entry_id, entry_kind, entry_reply, at in unpack(reply):
                self._remember(entry_id, entry_kind, entry_reply, at)
            return
        if name == INTAKE:
            self._folded(*unpack(reply))
            self._last_now = max(self._last_now, floor)
            return
        if name == "configure":
            self._configure(queue, unpack(reply))
        self._store(queue).restore(images, deletes, last_seq)
        self._last_now = max(self._last_now, floor)
        if request_id and name != IMAGES:
            if kind:
                self._remember(request_id, kind, reply)
            else:  # a held reply dropped before it left (_drop_ahead): not an answer
                self._dedup.pop(request_id, None)

    def _schedule_renewal(self) -> None:
        loop = asyncio.get_running_loop()
        self._renewal = loop.call_later(RENEW_EVERY, lambda: self._spawn(self._renew()))

    async def _renew(self) -> None:
        await self._transport.renew()
        self._schedule_renewal()
