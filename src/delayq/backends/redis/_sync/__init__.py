"""The Redis backend's sync faces, generated from the ``_async`` package by
``scripts/unasync.py`` (never edited by hand)."""
