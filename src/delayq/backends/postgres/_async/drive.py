"""Driving a libpq exchange (:mod:`..._libpq`) to its end, written once as its asyncio
face: the source of the generated :mod:`delayq.backends.postgres._sync.drive`. Each
face waits for the socket with its own primitive (:mod:`.._runner`)."""

from __future__ import annotations

from psycopg import pq

from .._libpq import Exchange
from .._runner import wait_ready_async

__all__ = ["drive_async"]


async def drive_async(exchange: Exchange) -> list[pq.abc.PGresult]:
    """Run ``exchange`` to its end, waiting for its socket as it asks. Stopped half way
    (a cancelled task, an interrupt), it leaves the connection in the middle of the
    command: the caller must not use it again (the backend gives it back to its pool,
    which closes a connection left busy)."""
    try:
        fd, wanted = next(exchange)
        while True:
            fd, wanted = exchange.send(await wait_ready_async(fd, wanted))
    except StopIteration as end:
        results: list[pq.abc.PGresult] = end.value
        return results
