"""``memory://``: the durable contract in one process, for tests and single-process apps.

Every ``memory://`` queue of one name shares one store in the process (``memory://ns``
gives a separate namespace ``ns``). A store is a dict of records plus two heaps with
lazy deletion: ``(due_at, seq, id)`` of scheduled messages and ``(lease_until, id,
token)`` of leases. Each operation holds the store's lock once and runs the pure
transitions of :mod:`delayq.durable.message`, so it is atomic.

Waiting ``reserve`` calls sleep until the earliest due time or lease expiry; puts,
nacks, releases, reschedules and ``retry_dead`` wake them at once (threads through a
condition, asyncio tasks through their loop), so nothing polls.

The store: :mod:`._store`; the asyncio face, written by hand: :mod:`._async.backend`;
the sync face, generated from it by ``scripts/unasync.py``: :mod:`._sync.backend`.
"""

from ._async.backend import AsyncMemoryBackend, open_async_backend
from ._sync.backend import MemoryBackend, open_backend

__all__ = ["AsyncMemoryBackend", "MemoryBackend", "open_async_backend", "open_backend"]

#: No error of memory:// means "the backend does not answer" (see delayq.durable.registry).
OUTAGE_ERRORS: tuple[type[Exception], ...] = ()
