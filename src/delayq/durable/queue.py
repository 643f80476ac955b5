"""Queue and AsyncQueue: the durable queue as users see it, over any backend.

This is where both faces are imported from. :class:`AsyncQueue` is written by hand in
:mod:`delayq.durable._async.queue`; :class:`Queue` is generated from it into
:mod:`delayq.durable._sync.queue` by ``scripts/unasync.py`` (``make lint`` checks that
the generated file is current), so the two cannot drift apart.
"""

from __future__ import annotations

from ._async.queue import AsyncQueue
from ._sync.queue import Queue

__all__ = ["AsyncQueue", "Queue"]
