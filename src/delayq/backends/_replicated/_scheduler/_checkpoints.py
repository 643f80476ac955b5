"""Checkpoints (docs/rabbitmq.md, "Checkpoints and retention") roll the live records
forward so that the log can drop its old segments: a ``checkpoint-begin`` operation
(the sequence numbers, the last now, the delivery targets; its dedup table empty), the
dedup table's entries ``[request id, kind, reply, decided at]`` DEDUP_CHUNK to a
``checkpoint-dedup`` operation (each entry as it stands when its chunk is logged: one
taken back or dropped meanwhile is not carried), then the live records' images ~1000
to a ``checkpoint`` operation, one append at a time between the requests, then
``checkpoint-end``. Once that is confirmed the scheduler publishes
a pointer ``[reign, offset, checkpoint id]``, where the next scheduler starts its
replay. A confirm carries no offset, so the pointer's is the offset of the reign's
entry (the last entry a replay reads) plus the appends since: the begin entry's own,
or lower when a deposed scheduler's late entry came in between; a replay from there
skips everything up to the begin operation.

Test only: ``DELAYQ_TEST_CHECKPOINT_STOP=<n>:<k>:<path>``, read once at import, makes
the scheduler's ``n``-th checkpoint (counted in the process) stop for good after its
``k``-th image operation is confirmed, and create the file ``path`` then (the
scheduler goes on serving requests), so that a test can kill a process whose
checkpoint is certainly half written. Never set it elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from ...._log import log_event
from ...._timeout import within
from ....durable.message import Record
from .._codec import encode_record, pack
from .._constants import CHECKPOINT_CHUNK, CHECKPOINT_ENTRIES, DEDUP_CHUNK, LOCATE_TIMEOUT
from ._journal import Journal
from ._state import BEGIN, DEDUP, END, IMAGES, Op, Reply, SchedulerState

__all__ = ["Checkpoints"]


def _fault() -> tuple[int, int, Path] | None:
    """The test-only stop of the module's docstring, from the environment."""
    value = os.environ.get("DELAYQ_TEST_CHECKPOINT_STOP", "")
    if not value:
        return None
    number, chunks, path = value.split(":", 2)
    return int(number), int(chunks), Path(path)


_FAULT = _fault()


class Checkpoints(SchedulerState):
    """Rolling the live records forward, and pointing the next replay at them."""

    def _maybe_checkpoint(self) -> None:
        if self._checkpointing or self._stopped or not self._serving:
            return
        if self._grown_entries >= CHECKPOINT_ENTRIES or self._grown_bytes >= max(
            self._live_bytes(), self._checkpoint_bytes
        ):
            self._checkpointing = True
            self._spawn(self._checkpoint())

    async def _logged(self, op: Op) -> None:
        """Append ``op`` with the requests (group commit) and return once it is in the
        log."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._commit(op, Reply("", op[2], "", b"", done=done))
        await done

    async def _checkpoint(self) -> None:
        """Roll every live record forward (the module's docstring), one operation of
        images per append, so that requests keep being answered meanwhile."""
        self._checkpoints += 1
        number = self._checkpoints
        checkpoint = uuid.uuid4().hex[:16]
        started = time.monotonic()
        begin = [
            checkpoint,
            self._last_now,
            {queue: store.last_seq for queue, store in self._queues.items()},
            {queue: list(target) for queue, target in self._targets.items()},
            [],  # the dedup table follows in chunks: no begin of many megabytes
            [self._intake_next, list(self._clients.items())],
        ]
        live = [(queue, list(store.records)) for queue, store in self._queues.items()]
        for store in self._queues.values():
            store.watch()
        remembered = list(self._dedup)
        self._grown_bytes = self._grown_entries = 0
        floor = self._now().floor
        await self._logged([BEGIN, "", f"begin:{checkpoint}", floor, 0, [], [], "", pack(begin)])
        dedup = self._dedup
        for at in range(0, len(remembered), DEDUP_CHUNK):
            part = [
                [request_id, *entry]
                for request_id in remembered[at : at + DEDUP_CHUNK]
                if (entry := dedup.get(request_id)) is not None
            ]
            if part:
                mark = f"dedup:{checkpoint}:{at // DEDUP_CHUNK + 1}"
                floor = self._now().floor
                await self._logged([DEDUP, "", mark, floor, 0, [], [], "", pack(part)])
        chunks = images = 0

        async def log_images(queue: str, store: Journal, chunk: list[Record | None]) -> None:
            encoded = [encode_record(r) for r in chunk if r is not None]
            if encoded:  # else every one of them changed meanwhile, and was logged then
                await log_encoded(queue, store, encoded)

        async def log_encoded(queue: str, store: Journal, encoded: list[Any]) -> None:
            nonlocal chunks, images
            chunks += 1
            images += len(encoded)
            mark = f"images:{checkpoint}:{chunks}"
            floor = self._now().floor
            await self._logged([IMAGES, queue, mark, floor, store.last_seq, encoded, [], "", b""])
            if _FAULT is not None and _FAULT[:2] == (number, chunks):
                _FAULT[2].touch()
                await asyncio.get_running_loop().create_future()  # forever (tests)

        try:
            for queue, ids in live:
                # The ids that were in memory at the begin (a record sent far since is
                # found there), then the far ones by id, then those brought back from
                # far since the begin (in neither walk: _records.py, Records.watch).
                for at in range(0, len(ids), CHECKPOINT_CHUNK):
                    store = self._store(queue)
                    chunk = [store.find(id) for id in ids[at : at + CHECKPOINT_CHUNK]]
                    await log_images(queue, store, chunk)
                after = ""
                while True:
                    store = self._store(queue)
                    encoded, after = store.far_images(after, CHECKPOINT_CHUNK)
                    if not encoded:
                        break
                    await log_encoded(queue, store, encoded)
                surfaced = sorted(self._store(queue).unwatch())
                for at in range(0, len(surfaced), CHECKPOINT_CHUNK):
                    store = self._store(queue)
                    chunk = [store.find(id) for id in surfaced[at : at + CHECKPOINT_CHUNK]]
                    await log_images(queue, store, chunk)
        finally:
            for store in self._queues.values():
                store.unwatch()
        floor = self._now().floor
        await self._logged([END, "", f"end:{checkpoint}", floor, 0, [], [], "", b""])
        # Complete in the log: the next checkpoint may start now, while this one's
        # pointer waits for an earlier one's and is found (each up to LOCATE_TIMEOUT).
        # The log must never outgrow its retention with no complete checkpoint in it,
        # and a backlog of fast puts folds that fast (tests/backends/
        # test_amqp_checkpoint.py).
        self._checkpointing = False
        self._completed = checkpoint
        self._maybe_checkpoint()
        async with self._pointing:
            appended = self._begins.pop(checkpoint)
            if self._completed == checkpoint:  # else a later one points past it
                offset = await self._locate(appended, f"begin:{checkpoint}")
                await self._transport.point(pack([self._reign, offset, checkpoint]))
        log_event(
            logging.INFO,
            "checkpoint_written",
            reign=self._reign,
            images=images,
            operations=chunks,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _locate(self, appended: int, mark: str) -> int:
        """The offset of this reign's entry marked ``mark``, its ``appended``-th append
        of the reign: at or after the reign entry's offset plus ``appended`` (a
        stream's offsets have gaps: a segment opens with an entry of the broker's
        own), read from there; the predictions that follow start from what it finds.
        That lower bound itself when it cannot be read in time (still a valid
        pointer)."""
        lower = self._reign_offset + appended
        log = self._transport.read_log(lower, few=True)

        async def find() -> int:
            async for entry in log:
                if entry.kind == "reign" and entry.reign != self._reign:
                    break
                if entry.reign == self._reign and entry.mark == mark:
                    return entry.offset
            return lower

        try:
            found = await within(find(), LOCATE_TIMEOUT)
        except (asyncio.TimeoutError, ConnectionError):
            found = lower
        finally:
            await log.aclose()  # type: ignore[attr-defined]
        # Whatever was found for a later append meanwhile: the gaps only add up.
        self._reign_offset = max(self._reign_offset, found - appended)
        return found
