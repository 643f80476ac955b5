"""The asyncio face of ``sqlite:///``, written by hand: the source of :mod:`.._sync`."""
