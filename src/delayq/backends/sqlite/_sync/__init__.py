"""The sync face of ``sqlite:///``, generated from :mod:`.._async` by ``scripts/unasync.py``."""
