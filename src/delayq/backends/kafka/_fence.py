"""The fence of a scheduler's entries on Kafka (docs/kafka.md, "The fence").

The log is one partition, totally ordered: an entry of reign R at offset N is kept by
every replay if and only if the last ``reign`` entry before N is R's own. A scheduler
cut off from the election's group coordinator but not from the log's leader goes on
appending until its next heartbeat; an entry it appends after its successor's
``reign`` entry is skipped by every replay, so no reply may leave for it.

:class:`ReignFence` is what the transport's reader of the log (from just after its
own ``reign`` entry, tailing) has seen: how far it read, and the first foreign
``reign`` entry, if any. An append waits until the reader has passed its offset, then
:meth:`ReignFence.check` says whether the entry is kept. One read covers every entry
appended meanwhile: a group commit's batch is one entry, and appends that follow each
other share the reader's fetches."""

from __future__ import annotations

import asyncio

__all__ = ["Deposed", "ReignFence"]


class Deposed(ConnectionError):
    """An entry this scheduler appended lies after another reign's ``reign`` entry: no
    replay keeps it, so nothing may be answered for it (the scheduler steps down, as
    on any failed append; its clients resend to the next one)."""


class ReignFence:
    """What the log's reader saw after ``reign``'s own entry (at ``offset``)."""

    def __init__(self, reign: str, offset: int) -> None:
        self.reign = reign
        self.read = offset + 1
        """The next offset the reader expects: every entry before it was seen."""
        self.foreign: tuple[int, str] | None = None
        """The first ``reign`` entry of another reign after this one's: offset, reign."""
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def seen(self, offset: int, kind: str, reign: str) -> None:
        """The reader's next record; a Deposed when it is not the one expected (a gap
        may hide a foreign reign entry: the reader then ends the transport)."""
        if offset != self.read:
            raise Deposed(f"the log's reader expected offset {self.read} and read {offset}")
        self.read = offset + 1
        if kind == "reign" and reign != self.reign and self.foreign is None:
            self.foreign = (offset, reign)
        if self._waiters:
            waiting = []
            for wanted, future in self._waiters:
                if wanted < self.read:
                    if not future.done():
                        future.set_result(None)
                else:
                    waiting.append((wanted, future))
            self._waiters = waiting

    async def passed(self, offset: int) -> None:
        """Return once the reader has seen the entry at ``offset``."""
        if offset < self.read:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, future))
        await future

    def check(self, offset: int) -> None:
        """Deposed unless the entry at ``offset`` (read past) is kept by every replay."""
        if self.foreign is not None and self.foreign[0] < offset:
            at, reign = self.foreign
            raise Deposed(
                f"deposed: reign {reign} began at offset {at} of the log, before this "
                f"scheduler's entry at {offset} (reign {self.reign}): no replay keeps it"
            )
