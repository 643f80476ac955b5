"""A listener's connection for ``BLPOP``; written once for asyncio, its sync twin,
``_sync/blpop.py``, is generated from this file by ``scripts/unasync.py``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["AsyncBlocking"]


class AsyncBlocking:
    """One connection of its own for a blocking command (a listener's ``BLPOP``), a
    redis-py ``Connection`` made from ``connection_class`` and ``kwargs``
    (:func:`..._transport.connection_settings`): it connects on first use, and again
    after a failure (redis-py drops a connection whose write or read failed)."""

    def __init__(self, connection_class: Any, kwargs: dict[str, Any]) -> None:
        self._connection = connection_class(**kwargs)

    async def blpop(self, keys: Sequence[bytes], timeout: float) -> Any:
        """``BLPOP keys... timeout``: the popped ``[key, value]``, or None."""
        await self._connection.send_command("BLPOP", *keys, timeout, check_health=False)
        return await self._connection.read_response()

    async def aclose(self) -> None:
        """Close the connection (on the sync face also from another thread, to break a
        ``BLPOP``)."""
        await self._connection.disconnect()
