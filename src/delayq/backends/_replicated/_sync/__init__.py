"""The sync face of the replicated backends, GENERATED from :mod:`.._async` by ``scripts/unasync.py``."""
