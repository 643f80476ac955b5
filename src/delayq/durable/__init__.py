"""Durable queues: one contract (:mod:`.backend`) over backends chosen by URL.

:class:`Queue` / :class:`AsyncQueue` are the faces; :class:`Message`, :class:`State`,
:class:`Stats` and :class:`PutResult` what they return; :class:`RetryPolicy` how
failures are retried.
"""

from .backend import AsyncBackend, Backend
from .message import Message, Now, PutRequest, PutResult, Record, State, Stats
from .queue import AsyncQueue, Queue
from .registry import register_backend, register_scheme
from .retry import RetryPolicy
from .serializer import JSONSerializer, Serializer

__all__ = [
    "AsyncBackend",
    "AsyncQueue",
    "Backend",
    "JSONSerializer",
    "Message",
    "Now",
    "PutRequest",
    "PutResult",
    "Queue",
    "Record",
    "RetryPolicy",
    "Serializer",
    "State",
    "Stats",
    "register_backend",
    "register_scheme",
]
