"""The four ways a first connection to PostgreSQL fails, against the shared test server
(trust auth, no SSL) or a closed port: each case's URL and the one line delayq says."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

__all__ = ["BASE", "NAMES", "closed_port", "line", "mistakes"]

BASE = os.environ.get("DELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
_HOST = urlsplit(BASE).hostname or "127.0.0.1"
_PORT = urlsplit(BASE).port or 5432


#: The mistakes, in the order of :func:`mistakes`.
NAMES = ("down", "role", "database", "ssl")


def line(url: str, reason: str) -> str:
    """What every face says for ``url`` (its password hidden)."""
    return f"cannot use the queue at {url.replace(':hunter2@', ':***@')}: {reason}"


def closed_port() -> int:
    """A port of the test server's host on which nothing listens."""
    with socket.socket() as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def mistakes() -> dict[str, tuple[str, str]]:
    """mistake -> (its URL, with the password ``hunter2``; the cause delayq names)."""
    port = closed_port()
    return {
        "down": (
            f"postgresql://postgres:hunter2@{_HOST}:{port}/test",
            f"the server is not answering at {_HOST}:{port}",
        ),
        "role": (
            f"postgresql://nosuchrole:hunter2@{_HOST}:{_PORT}/test",
            'role "nosuchrole" does not exist',
        ),
        "database": (
            f"postgresql://postgres:hunter2@{_HOST}:{_PORT}/nosuchdb",
            'database "nosuchdb" does not exist',
        ),
        "ssl": (
            f"postgresql://postgres:hunter2@{_HOST}:{_PORT}/test?sslmode=require",
            "the server does not support SSL (the URL asks for it: sslmode)",
        ),
    }
