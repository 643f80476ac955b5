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

__all__ = ["free_port", "free_ports"]

#: The lowest port drawn: clear of the well-known and registered services below it.
LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(*, companion: int = 0, taken: tuple[int, ...] = ()) -> int:
    """A port of 127.0.0.1 that nothing listens on, below the ephemeral range and not in
    ``taken``; with ``companion``, its port + ``companion`` too (a Redis Cluster node's
    bus port, a RabbitMQ node's distribution port)."""
    high = _ephemeral_start() - companion
    while True:
        if high - LOWEST < 100:  # an unusual range: take the kernel's choice
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port + companion > 65535:
                continue
        else:
            port = random.randrange(LOWEST, high)
        if port in taken or not _bindable(port):
            continue
        if companion and (port + companion in taken or not _bindable(port + companion)):
            continue
        return port


def free_ports(count: int, *, companion: int = 0) -> list[int]:
    """``count`` distinct ports as :func:`free_port` draws them (no port is another's
    companion)."""
    ports: list[int] = []
    while len(ports) < count:
        taken = tuple(ports) + tuple(port + companion for port in ports if companion)
        port = free_port(companion=companion, taken=taken)
        if companion and port + companion in taken:
            continue
        ports.append(port)
    return ports
