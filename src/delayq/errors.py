"""The exceptions delayq raises; every one of them is a :class:`DelayqError`."""

from __future__ import annotations

__all__ = [
    "DelayqError",
    "DuplicateId",
    "LeaseLost",
    "PayloadTooLarge",
    "QueueClosed",
    "UnsupportedURL",
]


class DelayqError(Exception):
    """Base class of every error delayq raises on purpose."""


class QueueClosed(DelayqError):
    """The queue was closed: no more puts, and no more gets once it is empty."""


class DuplicateId(DelayqError):
    """A message with this id exists and ``on_conflict="error"`` (or it is in flight).
    ``id`` is that id (None when unknown)."""

    def __init__(self, message: str, id: str | None = None) -> None:
        super().__init__(message)
        self.id = id


class LeaseLost(DelayqError):
    """The lease on a reserved message expired or was superseded; nothing was changed."""


class PayloadTooLarge(DelayqError, ValueError):
    """The serialized payload is larger than the queue's size limit."""


class UnsupportedURL(DelayqError, ValueError):
    """The queue URL is malformed or names a backend delayq does not have."""
