"""The replicated backends' generic part: a replicated log of operations in a broker,
one elected scheduler that holds the state in memory and answers every operation
over request/reply (docs/rabbitmq.md). A broker adds only its
:class:`~._transport.Transport` (``delayq.backends.amqp``).
"""

from ._async.backend import AsyncReplicatedBackend
from ._link import Candidacy, LoopLink, ThreadLink
from ._sync.backend import ReplicatedBackend
from ._transport import (
    BlockingTransport,
    Delivery,
    LogEntry,
    LogFull,
    NoScheduler,
    Refused,
    ReplyLost,
    ServerRefused,
    Transport,
)

__all__ = [
    "AsyncReplicatedBackend",
    "BlockingTransport",
    "Candidacy",
    "Delivery",
    "LogEntry",
    "LogFull",
    "LoopLink",
    "NoScheduler",
    "Refused",
    "ReplicatedBackend",
    "ReplyLost",
    "ServerRefused",
    "ThreadLink",
    "Transport",
]
