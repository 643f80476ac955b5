"""The hand-written I/O pairs behind the face written once in :mod:`._async.backend`:
the lock of its first use, the pool's hand-over of a connection (a cancellation it
dropped raised again), and the wait for a socket to be ready that drives a libpq
exchange (:mod:`._async.drive`). How a claim survives a cancelled caller is shared with
``redis://`` (:mod:`.._guard`). Listed, with why each pair differs, in
``tests/durable/test_twins.py``."""

from __future__ import annotations

import asyncio
import select
import threading
from typing import Any

from ._libpq import READ, WRITE

__all__ = [
    "AsyncLock",
    "Lock",
    "getconn",
    "getconn_async",
    "wait_ready",
    "wait_ready_async",
]

AsyncLock = asyncio.Lock
Lock = threading.Lock


def getconn(pool: Any, timeout: float | None = None) -> Any:
    """``pool.getconn(timeout)`` (a thread is not cancelled)."""
    return pool.getconn(timeout)


async def getconn_async(pool: Any, timeout: float | None = None) -> Any:
    """``await pool.getconn(timeout)``, and a cancellation the pool lost raised: a
    waiting client of psycopg_pool waits with ``asyncio.wait_for``, which before Python
    3.12 returns the connection and drops a cancellation that comes as the connection
    is handed over, so that the cancelled task ran on (seen: a task cancelled as it
    put, still putting 10 s later). The task's count of cancel requests tells: grown
    meanwhile, the connection goes back and the cancellation is raised."""
    task = asyncio.current_task()
    before = _cancel_requests(task)
    conn = await pool.getconn(timeout)
    if _cancel_requests(task) > before:
        await pool.putconn(conn)
        raise asyncio.CancelledError
    return conn


def _cancel_requests(task: asyncio.Task[Any] | None) -> int:
    """``task.cancelling()`` (Python 3.11+; before, 0: nothing to tell by)."""
    cancelling = getattr(task, "cancelling", None)
    return 0 if cancelling is None else int(cancelling())


def wait_ready(fd: int, wanted: int) -> int:
    """Block until ``fd`` is ready for some of ``wanted``; what it is ready for (an
    error or a hang-up counts as readable: the read that follows reports it)."""
    if not hasattr(select, "poll"):  # Windows
        readable, writable, _ = select.select(
            [fd] if wanted & READ else [], [fd] if wanted & WRITE else [], []
        )
        return (READ if readable else 0) | (WRITE if writable else 0)
    poller = select.poll()
    poller.register(
        fd, (select.POLLIN if wanted & READ else 0) | (select.POLLOUT if wanted & WRITE else 0)
    )
    events = 0
    for _, event in poller.poll():
        events |= event
    ready = WRITE if events & select.POLLOUT else 0
    if events & ~select.POLLOUT:
        ready |= READ
    return ready


async def wait_ready_async(fd: int, wanted: int) -> int:
    """:func:`wait_ready` for a task: the event loop runs meanwhile. Cancelled, it
    stops watching ``fd``."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[int] = loop.create_future()

    def on(flag: int) -> None:
        if not ready.done():
            ready.set_result(flag)

    if wanted & READ:
        loop.add_reader(fd, on, READ)
    if wanted & WRITE:
        loop.add_writer(fd, on, WRITE)
    try:
        return await ready
    finally:
        if wanted & READ:
            loop.remove_reader(fd)
        if wanted & WRITE:
            loop.remove_writer(fd)
