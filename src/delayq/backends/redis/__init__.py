"""``redis://host:port/db`` and ``rediss://``: the durable backend on Redis (see
:mod:`._async.backend`; sharded queues and ``redis+cluster://``: :mod:`._async.sharded`).

A first use whose server cannot be used raises :class:`ServerRefused` (a
:class:`~delayq.errors.DelayqError`, also a ``redis.ConnectionError``) within the
connect timeout, with one line that names the URL (its password hidden) and the cause:
the server is not answering at host:port, needs a password, refused the user name and
password, is not a cluster (``redis+cluster://`` to a single node: use ``redis://``),
or does not speak TLS (``rediss://`` to a plain server: use ``redis://``).
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_names
from ...durable.descriptor import BackendDescriptor, BackendDriver

if TYPE_CHECKING:
    from ._async.backend import AsyncRedisBackend
    from ._async.open import open_async_backend
    from ._async.sharded import AsyncShardedRedisBackend
    from ._driver import OUTAGE_ERRORS
    from ._refused import ServerRefused
    from ._sync.backend import RedisBackend
    from ._sync.open import open_backend
    from ._sync.sharded import ShardedRedisBackend

__all__ = [
    "DESCRIPTOR",
    "OUTAGE_ERRORS",
    "AsyncRedisBackend",
    "AsyncShardedRedisBackend",
    "RedisBackend",
    "ServerRefused",
    "ShardedRedisBackend",
    "open_async_backend",
    "open_backend",
]

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "AsyncRedisBackend": "._async.backend",
        "AsyncShardedRedisBackend": "._async.sharded",
        "open_async_backend": "._async.open",
        "RedisBackend": "._sync.backend",
        "ShardedRedisBackend": "._sync.sharded",
        "open_backend": "._sync.open",
        "OUTAGE_ERRORS": "._driver",
        "ServerRefused": "._refused",
    },
    globals(),
)


def _load() -> BackendDriver:
    from ._driver import DRIVER  # noqa: PLC0415

    return DRIVER


#: redis:// as delayq's faces see it (see delayq.durable.descriptor).
DESCRIPTOR = BackendDescriptor(
    name="redis",
    schemes=("redis", "rediss", "redis+cluster", "redis+unix"),
    load=_load,
    client=("redis",),
    extra="redis",
)
