"""The event loop timers a waiting reserve sleeps on (``delayq._timer``): they run their
callback once, in deadline order, never before the deadline; a cancelled one never runs;
none leaves a file descriptor behind."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import threading
import time

import pytest

from delayq._timer import MOST_TIMER_FDS, call_later_precisely, precise_thread


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_callbacks_run_once_in_deadline_order_and_never_early() -> None:
    async def main() -> list[tuple[str, float, float]]:
        loop = asyncio.get_running_loop()
        ran: list[tuple[str, float, float]] = []
        done = loop.create_future()

        def note(name: str, deadline: float) -> None:
            ran.append((name, deadline, time.monotonic()))
            if len(ran) == 3:
                done.set_result(None)

        # Registered latest-first; the deadlines far enough apart that a thread
        # preempted between two registrations (a loaded machine: 3.2 ms apart once
        # inverted them) does not reorder them: each deadline counts from its own call.
        for name, delay in (("late", 0.150), ("first", 0.050), ("now", 0.0)):
            call_later_precisely(loop, delay, note, name, time.monotonic() + delay)
        await asyncio.wait_for(done, 5.0)
        await asyncio.sleep(0.05)  # nothing runs twice
        return ran

    ran = asyncio.run(main())
    assert [name for name, _, _ in ran] == ["now", "first", "late"]
    assert all(at >= deadline for _, deadline, at in ran)


def test_a_cancelled_callback_never_runs() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        dropped = call_later_precisely(loop, 0.01, ran.append, "dropped")
        kept = call_later_precisely(loop, 0.02, ran.append, "kept")
        dropped.cancel()
        await asyncio.sleep(0.1)
        kept.cancel()  # after it ran: nothing happens
        dropped.cancel()
        return ran

    assert asyncio.run(main()) == ["kept"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/fd")
def test_timers_that_ran_or_were_cancelled_hold_no_file_descriptor() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        before = _open_fds()
        for _ in range(200):
            call_later_precisely(loop, 0.0, lambda: None)
            call_later_precisely(loop, 60.0, lambda: None).cancel()
        await asyncio.sleep(0.05)
        assert _open_fds() == before

    asyncio.run(main())


def test_more_pending_timers_than_may_hold_a_descriptor_all_run_once() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        ran: list[int] = []
        count = 3 * MOST_TIMER_FDS
        done = loop.create_future()

        def note(i: int) -> None:
            ran.append(i)
            if len(ran) == count:
                done.set_result(None)

        for i in range(count):
            call_later_precisely(loop, 0.001 * (i % 20), note, i)
        await asyncio.wait_for(done, 5.0)
        await asyncio.sleep(0.05)
        return ran

    assert sorted(asyncio.run(main())) == list(range(3 * MOST_TIMER_FDS))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_has_its_own_timers_whatever_its_parent_holds() -> None:
    """The parent holds every timer it may (a server's parked reserves) when it forks:
    the child's loop still gets timers of its own, which fire."""

    async def child() -> int:
        loop = asyncio.get_running_loop()
        before = _open_fds()
        fired = loop.create_future()
        timer = call_later_precisely(loop, 0.001, fired.set_result, None)
        held = _open_fds() - before  # a descriptor of its own, not call_later
        await asyncio.wait_for(fired, 5.0)
        timer.cancel()
        return held

    async def parent() -> None:
        loop = asyncio.get_running_loop()
        timers = [call_later_precisely(loop, 60.0, lambda: None) for _ in range(MOST_TIMER_FDS)]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if asyncio.run(child()) == 1 else 3
            finally:
                os._exit(code)
        for timer in timers:
            timer.cancel()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0

    asyncio.run(parent())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_TIMERSLACK is Linux's")
def test_a_precise_thread_has_its_timed_waits_end_at_their_deadline_alone() -> None:
    """precise_thread() (what a lane thread that holds a message until its due time
    calls) drops the calling thread's timer slack, the kernel's leeway after a timed
    wait's deadline, to 1 ns; other threads keep theirs."""
    libc = ctypes.CDLL(None, use_errno=True)
    get_timer_slack = 30  # PR_GET_TIMERSLACK: the calling thread's, in ns

    def slack() -> int:
        return int(libc.prctl(get_timer_slack, 0, 0, 0, 0))

    seen: list[int] = []

    def body() -> None:
        seen.append(slack())
        precise_thread()
        seen.append(slack())

    before = slack()
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before, 1]
    assert slack() == before
