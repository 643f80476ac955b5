"""Ports for the servers the tests start themselves, outside the kernel's ephemeral range.

A port the kernel handed out for ``bind(0)`` lies in its ephemeral range, the range it
also draws from for every outgoing connection. Between the moment a test picks such a
port and the moment its server binds it (or while a killed server waits to be started
again on the same port), any connection on the machine may take it as its local port,
and the server exits with "Address already in use": seen once in CI on a Redis Cluster
node. The ports here are drawn at random below that range, where no outgoing connection
lands, and checked free; the xdist processes draw independently, so two of them meet on
a port only by a one-in-thousands chance, and the bind check catches most of those.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["BUS_OFFSET", "free_port"]

#: A Redis Cluster node also listens on its port + 10000 (the cluster bus).
BUS_OFFSET = 10000
#: The lowest port drawn: clear of the well-known and registered services below it.
LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(*, bus: bool = False, taken: tuple[int, ...] = ()) -> int:
    """A port of 127.0.0.1 that nothing listens on, below the ephemeral range; with
    ``bus``, its port + :data:`BUS_OFFSET` is free and below that range as well.

    The range below the ephemeral one is cut in three that never meet: single ports at
    the bottom, then the cluster nodes' ports, then their bus ports."""
    top = _ephemeral_start()
    split = max(LOWEST + (top - LOWEST - BUS_OFFSET) // 2, top - 2 * BUS_OFFSET)
    low, high = (split, top - BUS_OFFSET) if bus else (LOWEST, split)
    while True:
        if high - low < 100:  # an unusual range: fall back to the kernel's choice
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if bus and port + BUS_OFFSET > 65535:
                continue
        else:
            port = random.randrange(low, high)
        if port in taken or not _bindable(port):
            continue
        if bus and not _bindable(port + BUS_OFFSET):
            continue
        return port
