"""The sync face of ``kafka://``, GENERATED from :mod:`.._async` by ``scripts/unasync.py``."""
