"""The asyncio face of the replicated backends, written by hand: the source of :mod:`.._sync`."""
