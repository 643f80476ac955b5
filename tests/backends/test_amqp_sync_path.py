"""``amqp://``'s sync face sends its calls from the caller's thread (docs/rabbitmq.md,
"The sync face's path"): a request is published on the backend object's sync
connection by the thread that calls, which reads the reply there (that 16 threads'
calls leave from their threads, and together: test_amqp_coalesce.py). Checked here:
the sync connection closed by the broker under calls of four threads (each call
still returns, each put stored once).

The tests use the shared RabbitMQ under a namespace (``prefix``) of their own, deleted
afterwards; the schedulers are ``delayq scheduler`` processes of the test's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.test_amqp_fastput import client, scheduler
from backends.test_amqp_thread_put import calls_under_closes
from conformance.conftest import amqp_url
from delayq.durable import Queue

pytest.importorskip("pika")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace)


def test_the_sync_connection_closed_under_calls_loses_and_doubles_nothing(url: str) -> None:
    """The broker closes the sync connection three times while four threads put (plain
    puts) and read back: every call returns (sent again on a new connection), and each
    put is stored once."""
    with (
        scheduler(url),
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=30) as queue,
    ):
        queue.stats()

        def put_and_get(k: int, i: int) -> str:
            id = queue.put(i, id=f"{k}-{i}", delay=3600)
            assert queue.get(id) is not None
            return id

        acked = calls_under_closes(url, put_and_get)
        assert len(acked) == len(set(acked))
        assert queue.stats().scheduled == len(acked)
