"""A reserve sent with the acks (docs/rabbitmq.md): a sequential consumer's next
reserve leaves in the same batch as its ``ack_many``, so that a message falling due
meanwhile finds a reserve waiting at the scheduler. The loop's (the asyncio face's);
the sync face sends its own from its callers' threads (``_direct``), on the same
rules (the core's decisions)."""

from __future__ import annotations

import asyncio
from typing import Any

from ...._timeout import within
from ._core import unclaim
from ._state import LinkState

__all__ = ["Ahead"]


class Ahead(LinkState):
    """A sequential consumer's next reserve, sent ahead."""

    def _send_ahead(self, queue: str) -> None:
        """With a sequential caller's ``ack_many`` (its last call was a waiting reserve
        of ``queue`` that got messages), send that reserve again in the same batch, so
        that a message falling due during the ack's round trip finds a reserve waiting
        at the scheduler; the caller's next matching reserve takes its answer."""
        limit, lease_ms, wait = self._core.reserving[queue]
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._call("reserve", [queue, limit, lease_ms], wait))
        self._ahead[queue] = (limit, lease_ms, task)
        task.add_done_callback(lambda done: self._ahead_answered(queue, done))

    def _ahead_answered(self, queue: str, task: asyncio.Task[tuple[Any, float | None]]) -> None:
        ahead = self._ahead.get(queue)
        if ahead is None or ahead[2] is not task:
            return
        if task.cancelled() or task.exception() is not None or not task.result()[0]:
            return  # nothing was claimed: the caller's reserve goes as usual
        # Claimed, and not taken yet: given back unless the caller takes it soon.
        loop = asyncio.get_running_loop()
        loop.call_later(self._core.ahead_kept, self._expire_ahead, queue, task)

    def _expire_ahead(self, queue: str, task: asyncio.Task[tuple[Any, float | None]]) -> None:
        ahead = self._ahead.get(queue)
        if ahead is not None and ahead[2] is task and not self._closed:
            del self._ahead[queue]
            self._spawn_giving(self._give_up(queue, task))

    async def _take_ahead(
        self, op: str, args: list[Any], wait: float | None
    ) -> tuple[Any, float | None] | None:
        """The answer of the reserve sent ahead, when this call is the reserve it
        stands for (same queue, limit and lease); else None, once every reserve sent
        ahead is given up (what it claimed released, logged before this call goes)."""
        queue = args[0] if args else ""
        ahead = self._ahead.get(queue)
        if ahead is None or not self._core.takes_ahead(op, args, wait, ahead[:2]):
            await self._drop_ahead()
            return None
        del self._ahead[queue]
        task = ahead[2]
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await within(asyncio.shield(task), wait)
        except asyncio.TimeoutError:
            await self._give_up(queue, task)
            return [], None
        except asyncio.CancelledError:
            await asyncio.shield(self._give_up(queue, task))
            raise
        except Exception:
            return None  # it failed: the caller's own reserve goes as usual
        outcome, until = task.result()
        if outcome:
            return outcome, until
        left = None if wait is None else wait - (loop.time() - started)
        if left is not None and left <= 0:
            return [], None
        return await self._call("reserve", args, left)

    async def _drop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, {}
        for queue, (_, _, task) in ahead.items():
            await self._give_up(queue, task)

    async def _give_up(self, queue: str, task: asyncio.Task[tuple[Any, float | None]]) -> None:
        """Give up a reserve sent ahead: cancelled if unanswered (it sends ``forget``,
        which at the scheduler also releases what an answer on its way claimed), or
        what it got released, in both cases before the caller's next request."""
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
            return
        if task.cancelled() or task.exception() is not None:
            return
        outcome = task.result()[0]
        releases = [self._call("release", unclaim(queue, r), 0.0) for r in outcome]
        await asyncio.gather(*releases, return_exceptions=True)
