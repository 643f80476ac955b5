"""The ways a first connection to RabbitMQ fails, against the shared test broker
(guest/guest, never reconfigured) or a closed port: each case's URL and the one line
delayq says; and what a namespace where no scheduler runs says."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import pika

from delayq.backends.amqp._constants import LOCK_ARGUMENTS

from ._postgres_mistakes import closed_port

__all__ = ["BASE", "NAMES", "line", "mistakes", "mute_candidate", "not_running"]

BASE = os.environ.get("DELAYQ_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
_HOST = urlsplit(BASE).hostname or "127.0.0.1"
_PORT = urlsplit(BASE).port or 5672

#: The mistakes, in the order of :func:`mistakes`.
NAMES = ("down", "vhost", "password")


def _shown(url: str) -> str:
    """``url`` with its password hidden, as every face shows it."""
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)


def line(url: str, reason: str) -> str:
    """What every face says for ``url`` (its password hidden)."""
    return f"cannot use the queue at {_shown(url)}: {reason}"


def not_running(url: str) -> str:
    """What every face says for a call to ``url``'s namespace when nothing stands for
    its scheduler."""
    return line(
        url,
        "no scheduler runs for its namespace (no delayq process stands for election): "
        "start one with `delayq scheduler --url URL` (a `delayq worker`, or a consumer "
        "waiting in a reserve, stands too)",
    )


def mistakes() -> dict[str, tuple[str, str]]:
    """mistake -> (its URL, whose password is never shown; the cause delayq names)."""
    port = closed_port()
    return {
        "down": (
            f"amqp://guest:hunter2@{_HOST}:{port}/",
            f"the broker is not answering at {_HOST}:{port}",
        ),
        "vhost": (
            f"amqp://guest:guest@{_HOST}:{_PORT}/nosuchvhost",
            'the broker refused the virtual host "nosuchvhost" (it does not exist, or user '
            '"guest" has no access to it)',
        ),
        "password": (
            f"amqp://guest:hunter2@{_HOST}:{_PORT}/",
            'the broker refused the login of user "guest" (a wrong user name or password)',
        ),
    }


@contextlib.contextmanager
def mute_candidate(url: str) -> Iterator[None]:
    """A process that stands for the election of ``url``'s namespace (a consumer of its
    lock queue) and never serves: a scheduler that hangs."""
    prefix = url.split("prefix=", 1)[1].split("&", 1)[0]
    connection = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
    try:
        channel = connection.channel()
        lock = f"{prefix}.lock"
        channel.queue_declare(lock, durable=True, arguments=dict(LOCK_ARGUMENTS))
        channel.basic_consume(lock, lambda *_: None)
        yield
    finally:
        connection.close()
