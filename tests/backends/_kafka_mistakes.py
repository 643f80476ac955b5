"""The ways a first connection to Kafka fails, against a private Tansu broker or a
closed port: each case's URL and the one line delayq says (its password hidden)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from ._postgres_mistakes import closed_port

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

# aiokafka is imported by the helpers that use it: an amqp test that imports this
# module runs without it.

__all__ = ["NAMES", "mistakes", "mute_candidate", "wait_for_members"]

#: The mistakes, in the order of :func:`mistakes`.
NAMES = ("down", "tls file", "no idempotent producer")


def mistakes(bootstrap: str) -> dict[str, tuple[str, type[Exception], str]]:
    """mistake -> (its URL, whose password is never shown; the error every face
    raises; what it says). ``bootstrap``: a running Tansu broker."""
    port = closed_port()
    down = f"kafka://svc:hunter2@127.0.0.1:{port}?security_protocol=SASL_SSL&request_timeout=5"
    return {
        "down": (
            down,
            ConnectionError,
            f"cannot use the queue at {down.replace('hunter2', '***')}: "
            f"no Kafka broker answers at 127.0.0.1:{port}",
        ),
        "tls file": (
            f"kafka://{bootstrap}?security_protocol=SSL&ssl_cafile=/nonexistent/ca.pem",
            ValueError,
            "cannot use the TLS files (ssl_cafile=/nonexistent/ca.pem): ",
        ),
        # Tansu has no InitProducerId (docs/kafka.md); Kafka grants it
        "no idempotent producer": (
            f"kafka://{bootstrap}?prefix=delayq-mistakes&request_timeout=5",
            ValueError,
            "the Kafka broker refused an idempotent producer (",
        ),
    }


def _lock_of(url: str) -> tuple[str, str]:
    """The bootstrap address and the election's group (and topic) of ``url``."""
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2], f"{parse_qs(parts.query)['prefix'][0]}.lock"


def wait_for_members(url: str, count: int, timeout: float = 30.0) -> None:
    """Return once the election's group of ``url``'s namespace is stable with ``count``
    members (its rebalance done): a candidate that logged it stands has only sent its
    JoinGroup, and on Tansu a leader that leaves while a join is pending stays the
    group's leader (docs/kafka.md, "Tansu")."""
    from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415

    bootstrap, lock = _lock_of(url)

    async def described() -> tuple[str, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            [response] = await admin.describe_consumer_groups([lock])
        finally:
            await admin.close()
        [group] = response.groups
        return group[2], len(group[5])

    deadline = time.monotonic() + timeout
    while asyncio.run(described()) != ("Stable", count):
        assert time.monotonic() < deadline, f"{lock} not stable with {count} members"
        time.sleep(0.1)


@contextmanager
def mute_candidate(url: str) -> Iterator[None]:
    """A member of the election's group of ``url``'s namespace that holds the lock and
    never serves (a scheduler that hangs): it says it holds it, so the group's assignor
    leaves it there. Returns once the group assigned it the lock."""
    from aiokafka import AIOKafkaConsumer  # noqa: PLC0415
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415
    from aiokafka.errors import TopicAlreadyExistsError  # noqa: PLC0415

    from delayq.backends.kafka._lock import lock_assignor  # noqa: PLC0415

    bootstrap, lock = _lock_of(url)
    loop = asyncio.new_event_loop()

    async def stand() -> AIOKafkaConsumer:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(lock, 1, 1)])
        except TopicAlreadyExistsError:
            pass
        finally:
            await admin.close()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=lock,
            enable_auto_commit=False,
            partition_assignment_strategy=(lock_assignor(lock, lambda: True),),
        )
        await consumer.start()
        consumer.subscribe([lock])
        deadline = time.monotonic() + 30
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the mute candidate was never elected"
            await asyncio.sleep(0.05)
        return consumer

    consumer = loop.run_until_complete(stand())
    # The group's coordinator runs on the loop: heartbeats, and the rebalance that a
    # joining candidate causes, in which the mute one keeps the lock.
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(consumer.stop())
        loop.close()
