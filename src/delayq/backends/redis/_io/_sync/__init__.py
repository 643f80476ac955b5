"""The Redis backend's pairs below the faces, sync, generated from the ``_async``
package by ``scripts/unasync.py`` (never edited by hand)."""
