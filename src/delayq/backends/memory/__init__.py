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

from typing import TYPE_CHECKING

from ..._lazy import lazy_names
from ...durable.descriptor import BackendDescriptor, BackendDriver

if TYPE_CHECKING:
    from ._async.backend import AsyncMemoryBackend, open_async_backend
    from ._sync.backend import MemoryBackend, open_backend

__all__ = [
    "DESCRIPTOR",
    "AsyncMemoryBackend",
    "MemoryBackend",
    "open_async_backend",
    "open_backend",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "AsyncMemoryBackend": "._async.backend",
        "open_async_backend": "._async.backend",
        "MemoryBackend": "._sync.backend",
        "open_backend": "._sync.backend",
    },
    globals(),
)


def _load() -> BackendDriver:
    from ._driver import DRIVER  # noqa: PLC0415

    return DRIVER


#: memory:// as delayq's faces see it (see delayq.durable.descriptor).
DESCRIPTOR = BackendDescriptor(name="memory", schemes=("memory",), load=_load)
