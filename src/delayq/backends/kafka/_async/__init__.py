"""The asyncio face of ``kafka://``, written by hand: the source of :mod:`.._sync`."""
