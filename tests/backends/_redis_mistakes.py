"""The ways a first call to Redis fails for a mistake of its URL: each case's URL and the
one line delayq says (:class:`~delayq.backends.redis.ServerRefused`).

:func:`server` runs a private ``redis-server`` and a private one-node cluster that
need a password (never the shared one's config); the shared Redis serves as a node
without cluster mode and as a server without TLS. Each mistake is tried on one node
(``redis://``), on a sharded queue (``?shards=2``) and, where it applies, on
``redis+cluster://``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from ._redis_server import READY_TIMEOUT, RedisProcess, free_port

__all__ = ["NAMES", "PASSWORD", "VARIANTS", "line", "mistakes", "server"]

_SHARED = urlsplit(os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0"))
_SHARED_AT = f"{_SHARED.hostname or '127.0.0.1'}:{_SHARED.port or 6379}"
#: The private server's password (the URLs of the mistakes carry ``hunter2``).
PASSWORD = "s3cret"

#: The mistakes, in the order of :func:`mistakes`.
NAMES = (
    "down",
    "down-sharded",
    "down-cluster",
    "tls",
    "tls-sharded",
    "not-cluster",
    "no-password",
    "no-password-sharded",
    "wrong-password",
    "wrong-password-sharded",
    "no-password-cluster",
    "wrong-password-cluster",
)

#: The mistakes of :data:`NAMES` that are another's on a sharded queue or a cluster: the
#: same path through the faces, so the CLI's test tries them with one command.
VARIANTS = tuple(name for name in NAMES if name.endswith(("-sharded", "-cluster")))


def line(url: str, reason: str) -> str:
    """What every face says for ``url`` (its password hidden)."""
    return f"cannot use the queue at {url.replace(':hunter2@', ':***@')}: {reason}"


def _start(directory: Path, *options: str) -> RedisProcess:
    """A private ``redis-server`` whose default user needs :data:`PASSWORD`, started."""
    process = RedisProcess(directory, ("--save", "", "--requirepass", PASSWORD, *options))
    while process.port + 10000 > 65535:  # a cluster node's bus port is its port + 10000
        process.port = free_port()
    process.url = f"redis://:{PASSWORD}@127.0.0.1:{process.port}/0"  # for its readiness
    process.start()
    return process


def _one_node_cluster(directory: Path) -> RedisProcess:
    """A cluster of one node that serves every slot, with :data:`PASSWORD`."""
    node = _start(directory, "--cluster-enabled", "yes", "--masterauth", PASSWORD)
    client = node.client()
    try:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + READY_TIMEOUT
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up:\n{node.log_tail()}")
            time.sleep(0.02)
    except BaseException:
        node.stop()
        raise
    finally:
        client.close()
    return node


@contextmanager
def server(directory: Path) -> Iterator[tuple[int, int]]:
    """Two private ``redis-server`` processes whose default user needs
    :data:`PASSWORD`, one node and a one-node cluster: their ports."""
    (directory / "node").mkdir()
    (directory / "cluster").mkdir()
    node = _start(directory / "node")
    try:
        cluster = _one_node_cluster(directory / "cluster")
        try:
            yield node.port, cluster.port
        finally:
            cluster.stop()
    finally:
        node.stop()


def mistakes(ports: tuple[int, int]) -> dict[str, tuple[str, str]]:
    """mistake -> (its URL, with the password ``hunter2`` where it gives one; the cause
    delayq names), ``ports`` being :func:`server`'s."""
    port, cluster = ports
    closed = free_port()
    down = f"the server is not answering at 127.0.0.1:{closed}"
    tls = (
        f"the server at {_SHARED_AT} does not speak TLS (the URL asks for it: rediss://): "
        "is the server TLS? use redis:// for a server without it"
    )
    needs = "the server needs a password (the URL gives none)"
    wrong = "authentication failed: the server refused the URL's user name and password"
    return {
        "down": (f"redis://:hunter2@127.0.0.1:{closed}/0", down),
        "down-sharded": (f"redis://:hunter2@127.0.0.1:{closed}/0?shards=2", down),
        "down-cluster": (f"redis+cluster://:hunter2@127.0.0.1:{closed}", down),
        "tls": (f"rediss://:hunter2@{_SHARED_AT}/0", tls),
        "tls-sharded": (f"rediss://:hunter2@{_SHARED_AT}/0?shards=2", tls),
        # No password: the shared server has none, and a password it does not take is a
        # mistake of its own, which redis-py 6.2 meets first.
        "not-cluster": (
            f"redis+cluster://{_SHARED_AT}",
            "the server is not a cluster (cluster mode is off): use redis:// for a single node",
        ),
        "no-password": (f"redis://127.0.0.1:{port}/0", needs),
        "no-password-sharded": (f"redis://127.0.0.1:{port}/0?shards=2", needs),
        "wrong-password": (f"redis://:hunter2@127.0.0.1:{port}/0", wrong),
        "wrong-password-sharded": (f"redis://:hunter2@127.0.0.1:{port}/0?shards=2", wrong),
        "no-password-cluster": (f"redis+cluster://127.0.0.1:{cluster}", needs),
        "wrong-password-cluster": (f"redis+cluster://:hunter2@127.0.0.1:{cluster}", wrong),
    }
