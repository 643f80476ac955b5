"""The consumer loop that the Worker and the callback dispatcher share: reserve as many
messages as there are free slots, run each as a task, and keep its lease alive while
it runs or waits.

Both run ``concurrency`` jobs at once (a :class:`~delayq.runtime.pool.Gate`) and
reserve up to ``prefetch`` more ahead of free places (:func:`prefetch_slots`), each
waiting at the gate with its lease renewed until a place frees; a stop closes the
gate and gives the waiting ones back at once. The two differ only in what a job does
(run a handler, send an HTTP request), how often the lease is renewed, and the names
of their log events.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from .._log import log_event
from .._timer import sleep_async
from ..durable.message import Message
from ..durable.queue import AsyncQueue
from ..errors import LeaseLost, QueueClosed
from .constants import DEFAULT_WORKER_PREFETCH_PER_HANDLER
from .outage import Outage
from .pool import Slots

__all__ = ["LeaseRenewer", "check_prefetch", "extend_lease", "prefetch_slots", "reserve_loop"]

Job = Callable[[AsyncQueue, Message], Coroutine[Any, Any, None]]
#: Takes reserved messages on without a task of their own, none of them to start before
#: ``not_before`` (``time.monotonic()``; 0.0: all are due); returns those it leaves,
#: in order: the loop holds them until then, offers them again with 0.0, and starts a
#: job for each it leaves then.
Start = Callable[[AsyncQueue, list[Message], float], list[Message]]


def check_prefetch(prefetch: object, concurrency: int, name: str = "prefetch") -> int:
    """The prefetch of a consumer that runs ``concurrency`` jobs at once: ``prefetch``
    itself, an int >= 0 (0: none), or by default (None)
    :data:`~delayq.runtime.constants.DEFAULT_WORKER_PREFETCH_PER_HANDLER` x
    ``concurrency``. Anything else is a ``ValueError`` that names ``name``."""
    if prefetch is None:
        return DEFAULT_WORKER_PREFETCH_PER_HANDLER * concurrency
    if type(prefetch) is not int or prefetch < 0:
        raise ValueError(f"{name} must be an int >= 0, got {prefetch!r}")
    return prefetch


def prefetch_slots(concurrency: int, prefetch: int, waiting: Callable[[], int]) -> Slots:
    """The slots of a consumer that runs ``concurrency`` jobs at once and reserves up to
    ``prefetch`` more ahead; ``waiting()`` says how many reserved ones wait for a place.

    It claims in batches of half the prefetch, or as soon as fewer than a round of
    jobs wait: one claim costs about as much as the work of one job."""
    return Slots(concurrency + prefetch, batch=prefetch // 2, low=lambda: waiting() < concurrency)


async def reserve_loop(
    queue: AsyncQueue,
    slots: Slots,
    running: dict[asyncio.Task[None], Message],
    job: Job,
    *,
    lease: float,
    idle_wait: float,
    outage: Outage,
    hold_all_slots: bool,
    event_prefix: str,
    start: Start | None = None,
) -> None:
    """Reserve from ``queue`` into free ``slots`` and start ``job(queue, msg)`` for each
    message as a task registered in ``running`` (its slot comes back when it ends).

    When nothing is due, the loop blocks in ``reserve`` for up to ``idle_wait``. It
    holds every free slot while blocking when ``hold_all_slots`` (one queue: a burst
    due at the same instant comes in one claim), else one slot only, so the loops of
    other queues keep the rest. Returns when the queue closes. A failed reserve is
    noted in ``outage`` (shared by the loops of one consumer), which logs it and says
    how long to pause: a backend that does not answer is retried with a growing pause
    and a line per step, not a line per try.

    A waiting reserve may claim messages a moment before their due time
    (:meth:`~delayq.AsyncQueue.reserve_ahead`): ``start(queue, msgs, not_before)``,
    when given, is offered each claim's messages first, with the instant before which
    none may start, and takes on those it can hold until then itself; the loop holds
    the rest on the precise timer (giving them back if cancelled meanwhile), offers
    them to ``start`` again, due, then starts a job for each it leaves. ``start`` gives
    the slot of each one it took on back itself once that message is settled.
    """
    finished = functools.partial(_finished, running, slots, f"{event_prefix}.job_crashed")
    while True:
        taken = await slots.take_all()
        not_before = 0.0
        try:
            msgs = await queue.reserve(max=taken, wait=0, lease=lease)
            outage.answered()
            if not msgs:
                if not hold_all_slots:
                    slots.give(taken - 1)
                    taken = 1
                msgs, not_before = await queue.reserve_ahead(max=taken, wait=idle_wait, lease=lease)
        except QueueClosed:
            slots.give(taken)
            return
        except asyncio.CancelledError:
            slots.give(taken)
            raise
        except Exception as exc:
            slots.give(taken)
            failed = f"{event_prefix}.reserve_failed"
            await asyncio.sleep(outage.failed(exc, failed_event=failed, queue=queue.name))
            continue
        slots.give(taken - len(msgs))
        if start is not None:
            msgs = start(queue, msgs, not_before)
        if msgs and not_before:
            try:
                await _hold(queue, msgs, not_before)
            except BaseException:
                slots.give(len(msgs))
                raise
            if start is not None:
                msgs = start(queue, msgs, 0.0)
        for msg in msgs:
            task = asyncio.create_task(job(queue, msg))
            running[task] = msg
            task.add_done_callback(finished)


async def _hold(queue: AsyncQueue, msgs: list[Message], not_before: float) -> None:
    """Wait until ``not_before`` (``time.monotonic()``) on the precise timer; cancelled
    meanwhile, give ``msgs`` back first (due where they were, no attempt charged)."""
    left = not_before - time.monotonic()
    if left <= 0.0:
        return
    try:
        await sleep_async(left)
    except BaseException:
        for msg in msgs:
            with contextlib.suppress(Exception):
                await queue.release(msg)
        raise


def _finished(
    running: dict[asyncio.Task[None], Message], slots: Slots, event: str, task: asyncio.Task[None]
) -> None:
    running.pop(task, None)
    slots.give(1)
    if not task.cancelled() and task.exception() is not None:
        log_event(logging.ERROR, event, error=repr(task.exception()))


class LeaseRenewer:
    """Extends ``msg``'s lease by ``lease`` seconds, first after ``first`` seconds and
    then every ``every``, until :meth:`stop`.

    A lost lease ends the renewals (counted in ``counts["lease_lost"]``, logged as
    ``<event_prefix>.lease_lost at=extend``); a closed queue ends them quietly; any
    other error is logged and retried at the next beat.
    """

    def __init__(
        self,
        queue: AsyncQueue,
        msg: Message,
        counts: Counter[str],
        *,
        lease: float,
        first: float,
        every: float,
        event_prefix: str,
    ) -> None:
        self._queue, self._msg, self._counts = queue, msg, counts
        self._lease, self._every, self._prefix = lease, every, event_prefix
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._handle = self._loop.call_later(first, self._fire)

    def _fire(self) -> None:
        if not self._stopped:
            self._task = self._loop.create_task(self._extend())

    async def _extend(self) -> None:
        again = await extend_lease(self._queue, self._msg, self._counts, self._lease, self._prefix)
        if again and not self._stopped:
            self._handle = self._loop.call_later(self._every, self._fire)

    def stop(self) -> None:
        """No more renewals; an extend in flight is cancelled."""
        self._stopped = True
        self._handle.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()


async def extend_lease(
    queue: AsyncQueue, msg: Message, counts: Counter[str], lease: float, event_prefix: str
) -> bool:
    """Extend ``msg``'s lease by ``lease`` seconds: whether to go on renewing it. A lost
    lease is counted (``counts["lease_lost"]``) and logged, and ends the renewals; a
    closed queue ends them quietly; any other error is logged (try again later)."""
    try:
        until = await queue.extend(msg, lease)
    except LeaseLost:
        counts["lease_lost"] += 1
        log_event(
            logging.WARNING, f"{event_prefix}.lease_lost", queue=queue.name, id=msg.id, at="extend"
        )
        return False
    except QueueClosed:
        return False
    except Exception as exc:  # a hiccup: try again at the next beat
        log_event(
            logging.WARNING,
            f"{event_prefix}.extend_failed",
            queue=queue.name,
            id=msg.id,
            error=repr(exc),
        )
    else:
        log_event(
            logging.DEBUG, f"{event_prefix}.extended", queue=queue.name, id=msg.id, until=until
        )
    return True
