"""The link of the sync face: its calls made in the caller's thread (:class:`~._direct.
Direct`, on a :class:`~.._transport.BlockingTransport`), a first call too, reserves and
their hold, the reserve sent with a sequential consumer's acks, and fast puts appended
there too; a :class:`~._loop_link.LoopLink` on a private event-loop thread for the
candidacy and the scheduler alone (``LinkState.stands_first`` decides), that thread
started by the first call that needs it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from ...._fork import generation
from ....errors import QueueClosed
from .._constants import RESEND_FOR
from .._transport import Refused, Transport
from ._core import take_group
from ._direct import Direct
from ._fast_put import soon
from ._loop_link import CLOSE_WAIT, LoopLink
from ._state import Candidacy, T

__all__ = ["ThreadLink"]


class _Waiting:
    """A sync fast put waiting for its turn in the intake (:meth:`ThreadLink.put_fast`)."""

    __slots__ = ("error", "lead", "queue", "request_id", "requests", "size", "soon", "woken")

    def __init__(self, queue: str, requests: list[Any]) -> None:
        self.request_id = uuid.uuid4().hex
        self.queue = queue
        self.requests = requests
        self.size = sum(len(request[1]) for request in requests)  # the payloads
        self.soon = soon(requests)
        #: Released once its outcome is known, or once its thread is to lead.
        self.woken = threading.Lock()
        self.woken.acquire()
        self.lead = False
        self.error: BaseException | None = None


class ThreadLink:
    """The sync face's link: a call is sent from its caller's thread and its reply read
    there (:class:`Direct`), and a fast put appended there, when the transport offers a
    :class:`~.._transport.BlockingTransport`; the candidacy and the scheduler (see
    :mod:`._direct`) run on a :class:`LoopLink` on a private event loop thread, a
    call that stands first blocking its thread until the loop stood. That thread
    starts with the first call that needs it: a process that does not stand for
    election (one that puts and reads; one that consumes too, with ``scheduler=off``)
    never has it.

    A forked child has no such thread (only the forking thread survives a fork), and
    the connection it would find is its parent's. Its first call starts afresh: a new
    link, loop and thread, which connect on their own. The parent's are left as they
    are, never closed from the child (a close would end the parent's connection), and
    a child never inherits its parent's scheduler."""

    def __init__(
        self,
        make_transport: Callable[[], Transport],
        *,
        scheduler: Candidacy,
        request_timeout: float,
        deliver: tuple[str, str] | None = None,
        fast_put: bool = False,
        url: str = "",
        standby: bool = False,
    ) -> None:
        self._options = (
            make_transport,
            scheduler,
            request_timeout,
            deliver,
            fast_put,
            url,
            standby,
        )
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        make_transport, scheduler, request_timeout, deliver, fast_put, url, standby = self._options
        self._link = LoopLink(
            make_transport,
            scheduler=scheduler,
            request_timeout=request_timeout,
            deliver=deliver,
            fast_put=fast_put,
            url=url,
            standby=standby,
        )
        #: The loop and its thread, once a call needed them (:meth:`_started`).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self._fork = generation()
        # Fast puts (put_fast): those waiting, whether a thread leads (appends the next
        # message of them). The calls from the callers' threads (None after the
        # transport offered none: every call goes through the loop).
        self._intake_lock = threading.Lock()
        self._waiting: list[_Waiting] = []
        self._leading = False
        self._closing = False
        self._direct: Direct | None = None
        self._by_loop = False

    @property
    def closed(self) -> bool:
        return self._link.closed

    @property
    def candidacy(self) -> Candidacy:
        """See :attr:`LoopLink.candidacy`."""
        return self._link.candidacy

    def _current(self) -> LoopLink:
        if self._fork != generation():
            self._after_fork()
        return self._link

    def _started(self) -> asyncio.AbstractEventLoop | None:
        """The loop, made and its thread started unless it runs; None once this link
        is closed."""
        loop = self._loop
        if loop is None:
            with self._loop_lock:
                if self._link.closed:
                    return None
                loop = self._loop
                if loop is None:
                    loop = asyncio.new_event_loop()
                    thread = threading.Thread(
                        target=loop.run_forever, name="delayq-amqp-link", daemon=True
                    )
                    thread.start()
                    self._loop, self._thread = loop, thread
        return None if loop.is_closed() else loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop thread (started if need be) and block until its
        outcome. One wake-up each way: the coroutine's own task releases a plain lock
        as it ends (no concurrent future, no done callback a loop turn later), and the
        caller holds the task, so a pending one is not collected."""
        loop = self._started()
        if loop is None:
            coro.close()
            raise QueueClosed("the queue is closed")
        done = threading.Lock()
        done.acquire()
        outcome: list[tuple[bool, Any]] = []  # (raised, its result or exception)

        async def hop() -> None:
            try:
                outcome.append((False, await coro))
            except BaseException as exc:
                # A cancelled call raises as a cancelled concurrent future did.
                cancelled = isinstance(exc, asyncio.CancelledError)
                outcome.append((True, concurrent.futures.CancelledError() if cancelled else exc))
                if not isinstance(exc, Exception):
                    raise  # a cancellation, or a KeyboardInterrupt of the loop thread
            finally:
                done.release()

        tasks: list[asyncio.Task[None]] = []
        loop.call_soon_threadsafe(lambda: tasks.append(loop.create_task(hop())))
        done.acquire()
        raised, value = outcome[0]
        if raised:
            raise value
        return value  # type: ignore[no-any-return]

    def _after_fork(self) -> None:
        with _after_fork_lock:
            if self._fork == generation():
                return  # another thread of the child started afresh meanwhile
            # The lock may have been held by a thread of the parent at the fork.
            self._lock = threading.Lock()
            if self._link.closed or (self._loop is not None and self._loop.is_closed()):
                self._fork = generation()  # closed before the fork: it stays closed
                return
            self._start()

    def call(self, op: str, args: list[Any], wait: float | None = 0.0) -> Any:
        """See :meth:`LoopLink.call`. Messages got ahead of their due time are held in
        the calling thread (its sleep is precise to the kernel's timer; the loop's
        timers count whole milliseconds), which so wakes with them."""
        link = self._current()
        if not self._by_loop and not link.closed:
            direct = self._direct or self._make_direct(link)
            if direct is not None:
                if link.stands_first(op, wait):
                    self._run(link.stand_for())  # the candidacy is the loop's
                if args:
                    direct.configure(args[0])
                outcome, until = direct.call(op, args, wait)
                if until is not None:
                    self._hold(link, until, lambda: direct.give_back(args[0], outcome))
                return outcome
        outcome, until = self._run(link.call_held(op, args, wait))
        if until is not None:

            def give_back() -> None:
                loop = self._loop
                if loop is not None and not loop.is_closed():
                    loop.call_soon_threadsafe(link.give_back, args[0], outcome)

            self._hold(link, until, give_back)
        return outcome

    @staticmethod
    def _hold(link: LoopLink, until: float, give_back: Callable[[], None]) -> None:
        """Hold messages claimed ahead of their due time until ``until`` (a
        :func:`time.monotonic` time); a caller interrupted meanwhile gives them back."""
        try:
            while (rest := until - time.monotonic()) > 0:
                time.sleep(rest)
        except BaseException:
            give_back()
            raise
        if link.closed:
            raise QueueClosed("the queue was closed")

    def _make_direct(self, link: LoopLink) -> Direct | None:
        """The calls from the callers' threads, made on the first (None, and every call
        through the loop from then on, when the transport offers none)."""
        with self._intake_lock:
            if self._direct is None and not self._by_loop:
                timeout = link.request_timeout
                self._direct = Direct.over(
                    link.blocking, link.core, timeout, link.no_answer, lambda: link.standing
                )
                self._by_loop = self._direct is None
            return self._direct

    @property
    def fast(self) -> bool:
        """See :attr:`LoopLink.fast` (a ``full`` that came taken first: only an
        announcement makes a fast link plain)."""
        link = self._current()
        if link.fast and self._direct is not None:
            self._direct.heard()
        return link.fast

    def put_fast(self, queue: str, requests: list[Any]) -> None:
        """See :meth:`LoopLink.put_fast`: the same outcome and errors, the put appended
        from this thread (docs/rabbitmq.md, "Fast put from a thread"). The puts of
        several threads at once are appended a message at a time, in order: the thread
        whose turn it is (the lead) appends every put waiting then, up to
        MAX_GROUP_BYTES, wakes their threads, and hands the lead to the next put still
        waiting. No thread appends puts that came after its own."""
        link = self._current()
        if self._by_loop:
            self._run(link.put_fast(queue, requests))
            return
        put = _Waiting(queue, requests)
        with self._intake_lock:
            if self._closing or link.closed:
                raise QueueClosed("the queue is closed")
            self._waiting.append(put)
            put.lead = not self._leading
            self._leading = True
        if not put.lead:
            try:
                put.woken.acquire()
            except BaseException:
                self._leave(put)
                raise
        if put.lead:
            self._lead(link)
        if put.error is not None:
            raise put.error

    def _leave(self, put: _Waiting) -> None:
        """``put``'s caller gave up before its outcome (an interrupt): it leaves, and
        the lead, if it was given it, goes on."""
        with self._intake_lock:
            if put in self._waiting:
                self._waiting.remove(put)
            handed = put.lead
        if handed:
            self._hand_on()

    def _lead(self, link: LoopLink) -> None:
        """Append the puts waiting (this thread's first), wake their threads, and hand
        the lead on."""
        with self._intake_lock:
            batch = take_group(self._waiting, lambda put: put.size)
        try:
            self._append(link, batch)
        except BaseException as exc:
            for put in batch:
                put.error = exc if isinstance(exc, Exception) else QueueClosed("closed")
            raise
        finally:
            for put in batch[1:]:
                put.woken.release()
            self._hand_on()
            if link.closed and self._direct is not None:
                self._direct.close()  # reopened by a retry that raced the close

    def _hand_on(self) -> None:
        with self._intake_lock:
            if self._waiting:
                following = self._waiting[0]
                following.lead = True
                following.woken.release()
            else:
                self._leading = False

    def _append(self, link: LoopLink, batch: list[_Waiting]) -> None:
        """Append ``batch`` as this link's next intake message, on a new connection when
                one fails, for up to the request timeout or RESEND_FOR, the shorter (as
        :meth:`LoopLink._append` does)."""
        direct = self._direct or self._make_direct(link)
        if direct is None:  # none offered: through the loop
            for put in batch:
                self._run(link.put_fast(put.queue, put.requests))
            return
        if link.stands_first("put", 0.0):
            self._run(link.stand_for())  # the candidacy is the loop's
        for queue in dict.fromkeys(put.queue for put in batch):
            direct.configure(queue)  # a request, if any: it needs a scheduler
        transport = direct.transport
        core = link.core
        direct.heard()  # a ``quiet`` or ``nudge`` that came decides the copy
        seq, nudge = core.next_intake(any(put.soon for put in batch), time.monotonic())
        parts = [[put.request_id, put.queue, put.requests] for put in batch]
        deadline = time.monotonic() + min(link.request_timeout, RESEND_FOR)
        may_have_run = False
        while True:
            try:
                direct.connect(deadline)  # a first one's failure: said at once
                may_have_run = True
                body = core.intake_body(seq, parts, time.time())
                transport.append(body, nudge=nudge, deadline=deadline)
                break
            except Refused as exc:
                raise exc.reason from exc.reason.__cause__
            except (ConnectionError, OSError) as exc:
                if time.monotonic() >= deadline:
                    raise link.no_reply("put", may_have_run, "no intake append") from exc
                if link.closed:
                    raise QueueClosed("the queue was closed") from None
                time.sleep(min(max(deadline - time.monotonic(), 0.0), 0.1))
        core.intake_confirmed(seq)

    def close(self) -> None:
        """See :meth:`LoopLink.close`, once the fast puts of this link's threads are
        appended (for up to CLOSE_SETTLE s); then the loop thread ends."""
        link = self._current()
        with self._lock:
            if self._link.closed and (self._loop is None or self._loop.is_closed()):
                return
            with self._intake_lock:
                self._closing = True
            until = time.monotonic() + link.close_settle
            while self._leading and time.monotonic() < until:
                time.sleep(0.005)
            direct = self._direct
            if direct is not None:
                direct.settle(link.close_settle)
                direct.close()
            with self._loop_lock:
                loop, thread = self._loop, self._thread
                if loop is None or thread is None:  # never needed: nothing of it runs
                    link.close_idle()
                    return
            self._run(link.close(settle=direct is None))
            self._run(_settle_loop(CLOSE_WAIT))
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()


async def _settle_loop(seconds: float) -> None:
    """Let the loop's other tasks end (the broker library's, closing a connection),
    for up to ``seconds``, then cancel what is left: a task still pending when its
    loop is closed would be reported as destroyed, on stderr, at exit."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    # Again while ending tasks start others (a reader's end starts the writer's close).
    while (others := asyncio.all_tasks() - {asyncio.current_task()}) and loop.time() < until:
        await asyncio.wait(others, timeout=until - loop.time())
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=seconds)


#: Serialises a forked child's fresh starts; made anew in each child (a thread of the
#: parent may have held it at the fork).
_after_fork_lock = threading.Lock()


def _new_after_fork_lock() -> None:
    global _after_fork_lock
    _after_fork_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_after_fork_lock)
