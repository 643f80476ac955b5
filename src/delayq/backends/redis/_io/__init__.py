"""The Redis backend's sync/async pairs below the faces that have the same shape: each
written once for asyncio in ``_async``, its sync twin generated into ``_sync`` by
``scripts/unasync.py``. The pairs that truly differ (a socket read, a wait, a thread)
stay hand-written beside them and are listed in ``tests/durable/test_twins.py``."""
