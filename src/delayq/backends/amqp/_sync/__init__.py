"""The sync face of ``amqp://``, GENERATED from :mod:`.._async` by ``scripts/unasync.py``."""
