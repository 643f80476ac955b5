"""The asyncio face of ``amqp://``, written by hand: the source of :mod:`.._sync`."""
