"""The sync face of ``postgresql://``, GENERATED from :mod:`.._async` by scripts/unasync.py."""
