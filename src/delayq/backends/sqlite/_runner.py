"""Where a face of ``sqlite:///`` runs the transactions of its :class:`~._core.Core`: the
one pair of I/O primitives behind the face written once in :mod:`._async.backend`.

:class:`Runner` (the sync face) calls them on the calling thread; :class:`AsyncRunner`
hands each one to a small thread pool of its own, so the event loop never waits for
SQLite, and gives back what a claim took when the task awaiting it was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from ...durable.message import Record
from ._constants import SQLITE_ASYNC_THREADS
from ._core import Core

__all__ = ["AsyncRunner", "Runner"]

P = ParamSpec("P")
T = TypeVar("T")

_Claimed = tuple[list[Record], int | None, int, float]


class Runner:
    """Runs on the calling thread. Opens (and creates) the file at once."""

    __slots__ = ("_core",)

    def __init__(self, core: Core) -> None:
        self._core = core
        core.pool.run(lambda conn: None)

    @staticmethod
    def call(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)``."""
        return function(*args, **kwargs)

    def claim(self, queue: str, limit: int, lease_ms: int, peek: bool, ahead_ms: int) -> _Claimed:
        """:meth:`Core.claim <._core.Core.claim>`."""
        return self._core.claim(queue, limit, lease_ms, peek, ahead_ms)

    def close(self) -> None:
        """Close the connections."""
        self._core.pool.close()


class AsyncRunner:
    """Runs on a thread pool of its own. Does no I/O until the first call."""

    __slots__ = ("_core", "_executor", "_giving_back")

    def __init__(self, core: Core) -> None:
        self._core = core
        self._executor = ThreadPoolExecutor(
            max_workers=SQLITE_ASYNC_THREADS, thread_name_prefix="delayq-sqlite"
        )
        # One future a cancelled claim, done once what it claimed is given back:
        # ``close`` waits for them before it closes the connections.
        self._giving_back: set[Future[None]] = set()

    async def call(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``function(*args, **kwargs)`` on the pool; :class:`QueueClosed` once closed.
        A cancelled call may still take effect."""
        self._core.check_open()
        return await asyncio.wrap_future(self._executor.submit(function, *args, **kwargs))

    async def claim(
        self, queue: str, limit: int, lease_ms: int, peek: bool, ahead_ms: int
    ) -> _Claimed:
        """:meth:`Core.claim <._core.Core.claim>` on the pool; cancelled, it claims
        nothing: what the claim took once it finishes anyway is given back."""
        self._core.check_open()
        future = self._executor.submit(self._core.claim, queue, limit, lease_ms, peek, ahead_ms)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            given_back: Future[None] = Future()
            self._giving_back.add(given_back)
            given_back.add_done_callback(self._giving_back.discard)
            future.add_done_callback(lambda done: self._unclaim(queue, done, given_back))
            raise

    def _unclaim(self, queue: str, done: Future[_Claimed], given_back: Future[None]) -> None:
        """After a cancelled claim finished anyway: give back what it claimed (on the
        pool: this may run on the event loop's thread), then resolve ``given_back``."""
        records = [] if done.cancelled() or done.exception() is not None else done.result()[0]
        if not records:
            given_back.set_result(None)
            return
        try:
            self._executor.submit(self._core.unclaim, queue, records).add_done_callback(
                lambda _: given_back.set_result(None)
            )
        except RuntimeError:  # the executor is shut down: give them back here
            try:
                self._core.unclaim(queue, records)
            finally:
                given_back.set_result(None)

    async def close(self) -> None:
        """Wait for the give-backs of cancelled claims, close the connections, then the
        pool."""
        # A claim cancelled just before a close may still be running, its give-back
        # not yet submitted: closing first would leave its messages leased until
        # their lease ran out.
        while self._giving_back:
            await asyncio.wait([asyncio.wrap_future(f) for f in list(self._giving_back)])
        # Closing the last connection checkpoints the WAL: not on the event loop.
        await asyncio.wrap_future(self._executor.submit(self._core.pool.close))
        self._executor.shutdown(wait=False)
