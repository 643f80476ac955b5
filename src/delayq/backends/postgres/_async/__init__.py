"""The asyncio face of ``postgresql://``, written by hand: the source of :mod:`.._sync`."""
