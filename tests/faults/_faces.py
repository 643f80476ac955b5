"""One scenario for both faces: a queue whose calls are awaited on either face.

:class:`Face` opens ``Queue`` (sync) or ``AsyncQueue`` (asyncio) and offers each
operation as a coroutine. A sync queue's calls all run on one thread of its own, as a
sync program's would (the sync face keeps one connection per thread).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis

from delayq.backends.postgres import OUTAGE_ERRORS as PG_OUTAGE
from delayq.durable import AsyncQueue, Queue
from delayq.errors import OutcomeUnknown

from ._history import History, Op
from ._netns import CONNECT_TIMEOUT, READ_TIMEOUT, NsPostgres, enter

__all__ = [
    "BOUND",
    "FACES",
    "OUTAGE",
    "PG_BOUND",
    "PG_OUTAGE",
    "Face",
    "answers_again",
    "drain",
    "fails",
    "reserve",
    "settle",
]

FACES = ("sync", "async")
#: The longest a call to a silent server may take with the tests' timeouts: a read
#: that times out, then one connect; plus slack for a loaded machine.
BOUND = READ_TIMEOUT + CONNECT_TIMEOUT + 1.5
#: What a call to a server that does not answer raises.
OUTAGE = (redis.ConnectionError, redis.TimeoutError)
#: :data:`BOUND` on PostgreSQL with :meth:`NsPostgres.short_url`'s timeouts: the longest
#: of a request's user timeout (its retransmissions land on about 1.5 s), a connect
#: and the wait for a pooled connection, plus slack; what it raises is
#: :data:`PG_OUTAGE` (``psycopg.OperationalError``, ``PoolTimeout``).
PG_BOUND = (
    max(
        2 * READ_TIMEOUT, *(float(NsPostgres.SHORT[k]) for k in ("connect_timeout", "pool_timeout"))
    )
    + 1.5
)


async def fails(
    call: Awaitable[Any],
    op: Op | None = None,
    *,
    errors: tuple[type[BaseException], ...] = OUTAGE,
    bound: float = BOUND,
) -> BaseException:
    """What ``call`` raised (one of ``errors``), once it failed within ``bound`` s
    (Redis's by default; its outcome noted in ``op``: unknown for
    :class:`OutcomeUnknown`, else failed)."""
    started = time.monotonic()
    with pytest.raises(errors) as raised:
        await asyncio.wait_for(call, bound * 3)
    elapsed = time.monotonic() - started
    assert elapsed < bound, f"{raised.value!r} took {elapsed:.1f} s"
    if op is not None:
        op.outcome = "unknown" if isinstance(raised.value, OutcomeUnknown) else "failed"
        op.error = type(raised.value).__name__
    return raised.value


class Face:
    """A queue of ``url`` named ``name`` on the ``face`` ("sync" or "async"); closed by
    :meth:`close`, or at the end of an ``async with`` block. With ``netns``, every
    connection of the queue is opened in that network namespace (_netns.enter): the
    sync face's thread enters it, the asyncio face runs on a loop of its own in a thread
    that entered it (its calls awaited from the test's loop)."""

    def __init__(self, face: str, url: str, name: str, netns: str | None = None) -> None:
        self.face = face
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if face == "sync":
            self._pool = ThreadPoolExecutor(
                1,
                thread_name_prefix="delayq-test-face",
                initializer=None if netns is None else enter,
                initargs=() if netns is None else (netns,),
            )
            # Made in its thread: the threads it starts are in that thread's namespace.
            self._queue: Any = self._pool.submit(Queue, url, name=name).result()
        elif netns is None:
            self._queue = AsyncQueue(url, name=name)
        else:
            self._loop = asyncio.new_event_loop()
            entered: Future[None] = Future()

            def run(loop: asyncio.AbstractEventLoop) -> None:
                try:
                    enter(netns)
                except BaseException as exc:
                    entered.set_exception(exc)
                    return
                entered.set_result(None)
                asyncio.set_event_loop(loop)
                loop.run_forever()

            self._thread = threading.Thread(target=run, args=(self._loop,), daemon=True)
            self._thread.start()
            entered.result()
            self._queue = AsyncQueue(url, name=name)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``queue.<method>(*args, **kwargs)`` on this face."""
        bound = getattr(self._queue, method)
        if self._loop is not None:
            done = asyncio.run_coroutine_threadsafe(bound(*args, **kwargs), self._loop)
            try:
                return await asyncio.wrap_future(done)
            except asyncio.CancelledError:
                done.cancel()
                raise
        if self._pool is None:
            return await bound(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(bound, *args, **kwargs))

    async def __aenter__(self) -> Face:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the queue (and the sync face's thread, or the asyncio face's loop)."""
        try:
            await self.call("close")
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            if self._loop is not None and self._thread is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)
                if not self._thread.is_alive():
                    self._loop.close()


async def reserve(q: Face, history: History, **options: Any) -> list[Any]:
    """``q.reserve(**options)``, recorded in ``history`` with what it delivered."""
    with history.call("reserve") as op:
        messages = await q.call("reserve", **options)
        op.deliver(messages)
    return list(messages)


async def settle(q: Face, history: History, kind: str, message: Any, **options: Any) -> None:
    """``q.<kind>(message, **options)`` (ack, nack, release), recorded in ``history``."""
    with history.call(kind, message.id, token=message.lease, delay=options.get("delay", 0.0)):
        await q.call(kind, message, **options)


async def drain(q: Face, history: History, lease: float) -> None:
    """Reserve and ack on ``q`` until a reserve waiting past ``lease`` gets nothing
    (the messages of a lease that ran out meanwhile included), each call recorded."""
    while messages := await reserve(q, history, lease=lease, wait=lease + 2):
        for message in messages:
            await settle(q, history, "ack", message)


async def answers_again(q: Face, errors: tuple[type[BaseException], ...], within: float) -> None:
    """``q.stats()`` until it answers; an outage meanwhile (one of ``errors``) is
    retried until ``within`` seconds have passed."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            await q.call("stats")
            return
        except errors:
            if asyncio.get_running_loop().time() > deadline:
                raise
