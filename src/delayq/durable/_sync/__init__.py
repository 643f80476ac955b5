"""The sync faces, generated from :mod:`delayq.durable._async` by ``scripts/unasync.py``
(``make lint`` checks that they are current)."""
