"""The sync face of ``memory://``, generated from :mod:`.._async` by ``scripts/unasync.py``."""
