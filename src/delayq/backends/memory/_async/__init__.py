"""The asyncio face of ``memory://``, written by hand: the source of :mod:`.._sync`."""
