"""The asyncio faces written by hand: the source that ``scripts/unasync.py`` turns into
the sync faces of :mod:`delayq.durable._sync` (edit these, never the generated ones)."""
