"""The Redis backend's pairs below the faces, written by hand for asyncio;
``scripts/unasync.py`` makes their sync twins in the sibling ``_sync`` package."""
