"""The dedup table's bound by age (docs/rabbitmq.md, "The dedup table"). A client sends
a request, or appends an intake message, again for at most RESEND_FOR s after its
first send, and each send expires after as long: every copy of a request arrives
within DEDUP_WINDOW of its decision. So an entry older than that, by the scheduler's
logged time, may go, with two guards:

- no entry goes in the first DEDUP_WINDOW s of a reign (by the loop's clock): an entry
  a predecessor decided was decided before this reign began, whatever the two hosts'
  clocks say, and the replay may give it an earlier time than its own (a fast put's
  operation logs its client's time);
- a fast put's copies come through the intake, which a scheduler folds when it gets to
  them (a successor elected an hour later folds an hour of it): an entry goes only once
  a marker, appended to the intake after the entry aged, is read back, so that every
  copy appended before (all of them) has been folded.

Each round (DEDUP_PRUNE_EVERY s) appends one marker ``[reign, "dedup", cutoff]`` and,
once it is read, drops the entries decided at or before ``cutoff``, oldest first, and
logs that (a ``dedup-prune`` operation), so that a replay and a hot standby drop them
too: they remember each entry as decided at the time this scheduler gave it."""

from __future__ import annotations

import asyncio

from .._codec import pack
from .._constants import DEDUP_PRUNE_EVERY, DEDUP_WINDOW
from ._state import PRUNE, SchedulerState

__all__ = ["Dedup"]


class Dedup(SchedulerState):
    """Dropping the dedup table's entries once no copy of their request can come."""

    def _start_pruning(self) -> None:
        """At election: the reign's start, and the first round's timer."""
        loop = asyncio.get_running_loop()
        self._anchor = (self._now().floor, loop.time())
        self._prune_timer = loop.call_later(DEDUP_PRUNE_EVERY, self._prune_round)

    def _prune_round(self) -> None:
        self._prune_timer = None
        if self._stopped or self._anchor is None:
            return
        loop = asyncio.get_running_loop()
        floor, since = self._anchor
        elapsed = loop.time() - since
        if elapsed >= DEDUP_WINDOW and not self._prune_marked and self._dedup:
            # The logged time, but never ahead of the loop's clock since the election
            # (a wall clock stepped forward does not age the entries).
            now = min(self._now().floor, floor + int(elapsed * 1000))
            cutoff = now - int(DEDUP_WINDOW * 1000)
            if next(iter(self._dedup.values()))[2] <= cutoff:
                self._prune_marked = True
                self._spawn(self._transport.mark_intake(pack([self._reign, "dedup", cutoff])))
        self._prune_timer = loop.call_later(DEDUP_PRUNE_EVERY, self._prune_round)

    def _on_dedup_marker(self, reign: str, cutoff: int) -> None:
        """A prune's marker was read back: the intake is folded past every copy of a
        request decided at or before ``cutoff``; those entries go."""
        if reign != self._reign or self._stopped:
            return
        self._prune_marked = False
        before = len(self._dedup)
        self._prune(cutoff)
        if len(self._dedup) < before:
            op = [PRUNE, "", "", self._last_now, 0, [], [], "", pack(cutoff)]
            self._commit(op, None, folded=True)
