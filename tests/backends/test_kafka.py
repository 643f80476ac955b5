"""``kafka://``'s own: its URL (refused with a clear error before anything connects),
an unreachable broker, the election's group keeping its scheduler while candidates join,
and delivery into a user's topic, read by a plain Kafka consumer that knows nothing of
delayq. The contract itself is the conformance suite's (tests/conformance, ``kafka``).

The broker is a private Tansu (tests/backends/_tansu.py), one for the file; its
departures from Kafka are taken as docs/kafka.md says (``idempotence=off``, a short
``fetch_wait_ms``)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

pytest.importorskip("aiokafka")

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from delayq import AsyncQueue, Queue
from delayq.backends.kafka import OUTAGE_ERRORS
from delayq.backends.kafka._url import parse
from delayq.errors import UnsupportedURL

from ._kafka_mistakes import NAMES, mistakes
from ._tansu import TansuBroker


def _url(broker: TansuBroker, **options: str) -> str:
    query = "&".join(f"{key}={value}" for key, value in options.items())
    prefix = f"delayq-test-{uuid.uuid4().hex[:10]}"
    return f"kafka://{broker.bootstrap}?prefix={prefix}&idempotence=off&fetch_wait_ms=5&{query}"


# -- the URL ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "error", "says"),
    [
        ("kafka://", UnsupportedURL, "names a broker"),
        ("kafka://h:99999", UnsupportedURL, "port is not in"),
        ("kafka://h,k:99999", UnsupportedURL, "bad port"),
        ("kafka://h:9092/path", UnsupportedURL, "has no path"),
        ("kafka://h?prefix=a/b", ValueError, "prefix must be"),
        ("kafka://h?prefix=_x", ValueError, "prefix must be"),
        ("kafka://h?scheduler=maybe", ValueError, "scheduler must be"),
        ("kafka://h?standby=warm", ValueError, "standby must be"),
        ("kafka://h?shards=-1", ValueError, "shards must be a whole number from 1 to 256"),
        ("kafka://h?shards=1.5", ValueError, "shards must be"),
        ("kafka://h?shards=2&scheduler_shards=0,5", ValueError, "from 0 to 1 .shards=2."),
        ("kafka://h?scheduler_shards=a", ValueError, "scheduler_shards must list"),
        ("kafka://h?request_timeout=0", ValueError, "request_timeout must be"),
        ("kafka://h?retention_bytes=10", ValueError, "retention_bytes must be"),
        ("kafka://h?fast_put=sometimes", ValueError, "fast_put must be"),
        ("kafka://h?idempotence=2", ValueError, "idempotence must be"),
        ("kafka://h?fetch_wait_ms=-1", ValueError, "fetch_wait_ms must be"),
        ("kafka://h?fetch_wait_ms=1.5", ValueError, "fetch_wait_ms must be"),
        ("kafka://h?session_timeout=5", ValueError, "session_timeout must be seconds from 6"),
        ("kafka://h?session_timeout=1801", ValueError, "session_timeout must be"),
        ("kafka://h?session_timeout=soon", ValueError, "session_timeout must be"),
        ("kafka://h?security_protocol=TLS", ValueError, "security_protocol must be"),
        ("kafka://h?sasl_mechanism=PLAIN", ValueError, "sasl_mechanism needs"),
        (
            "kafka://u:p@h?security_protocol=SASL_SSL&sasl_mechanism=MD5",
            ValueError,
            "sasl_mechanism must be",
        ),
        ("kafka://u:p@h", UnsupportedURL, "are SASL credentials"),
        ("kafka://h?security_protocol=SASL_SSL", UnsupportedURL, "user and password"),
        ("kafka://u@h?security_protocol=SASL_PLAINTEXT", UnsupportedURL, "user and password"),
        ("kafka://h?ssl_cafile=/ca.pem", UnsupportedURL, "need security_protocol=SSL"),
        ("kafka://h?security_protocol=SSL&ssl_cafile=", ValueError, "must name a file"),
        (
            "kafka://h?security_protocol=SSL&ssl_keyfile=/k.pem",
            UnsupportedURL,
            "ssl_keyfile needs ssl_certfile",
        ),
        ("kafka://h?deliver_key=k", ValueError, "deliver_key needs deliver_topic"),
        ("kafka://h?deliver_topic=a%20b", ValueError, "deliver_topic must be"),
        ("kafka://h?bogus=1", UnsupportedURL, "unknown option 'bogus'"),
    ],
)
def test_a_bad_url_is_refused_before_anything_connects(
    url: str, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        Queue(url, name="jobs")


def test_an_unknown_keyword_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"unknown option.*heartbeat"):
        Queue("kafka://h", name="jobs", heartbeat=5)


def test_the_url_gives_the_brokers_the_credentials_and_the_tls_files() -> None:
    settings = parse(
        "kafka://svc%40corp:p%3Ass@k1,k2:9093,[::1]:9094?prefix=orders"
        "&security_protocol=SASL_SSL&sasl_mechanism=SCRAM-SHA-512&ssl_cafile=/etc/ca.pem",
        {"fetch_wait_ms": 20, "session_timeout": 7.5},
    )
    assert settings.bootstrap == ("k1:9092", "k2:9093", "[::1]:9094")
    assert settings.prefix == "orders"
    assert settings.fetch_wait_ms == 20  # a keyword wins over the URL
    assert settings.idempotence is True  # Kafka's default for the log
    assert settings.session_timeout_ms == 7_500
    assert settings.security == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "svc@corp",
        "sasl_plain_password": "p:ss",
    }
    assert settings.tls == {"cafile": "/etc/ca.pem"}
    assert parse("kafka://h?deliver_topic=orders.timeouts", {}).deliver == ("orders.timeouts", "")


@pytest.mark.parametrize("face", ["sync", "async"])
@pytest.mark.parametrize("mistake", NAMES)
def test_a_first_connection_that_fails_says_why_in_one_line(
    mistake: str, face: str, memory_broker: TansuBroker
) -> None:
    """Each way the first connection fails is one line, the same on both faces, within
    the request timeout, the password never shown."""
    url, error, says = mistakes(memory_broker.bootstrap)[mistake]

    def sync() -> None:
        with Queue(url, name="jobs") as queue:
            queue.stats()

    async def call() -> None:
        async with AsyncQueue(url, name="jobs") as queue:
            await queue.stats()

    started = time.monotonic()
    with pytest.raises(error) as raised:
        sync() if face == "sync" else asyncio.run(call())
    assert str(raised.value).startswith(says)
    assert "hunter2" not in str(raised.value)
    assert time.monotonic() - started < 15


# -- the election -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_candidate_that_joins_leaves_the_scheduler_in_place(memory_broker: TansuBroker) -> None:
    """The group's rebalance at a join gives the lock back to its holder (a plain
    assignor would hand it to whichever member sorts first): the first scheduler goes on
    answering, and once it closes the second takes over with the state of the log (a
    request rides the failover out: on Tansu the group's rebalance after a member left
    takes some 15 s, docs/kafka.md)."""
    url = _url(memory_broker, scheduler="on", request_timeout="60")
    first = Queue(url, name="jobs")
    first.put("kept", delay=60, id="m1")
    second = Queue(url, name="jobs")
    second.stats()  # standing: it joined the group
    time.sleep(1)
    started = time.monotonic()
    for n in range(20):
        first.put(n, delay=60)
    assert time.monotonic() - started < 5  # no failover, no replay
    first.close()
    assert second.get("m1") is not None
    assert second.stats().scheduled == 21
    second.purge()
    second.close()


@pytest.mark.slow
def test_a_candidate_whose_request_timeout_is_shorter_than_an_election_is_elected(
    memory_broker: TansuBroker,
) -> None:
    """A candidate's calls get no reply until it is elected (3 to 5 s on Tansu). Each
    call left without a reply gave up the connection, and with it the candidacy being
    elected, so with a request timeout shorter than an election it never was: now a
    link that no scheduler ever answered keeps its connection, and the election ends."""
    url = _url(memory_broker, scheduler="on", request_timeout="2")
    with Queue(url, name="jobs") as queue:
        give_up = time.monotonic() + 40
        while True:
            try:
                queue.stats()
                break
            except OUTAGE_ERRORS:
                assert time.monotonic() < give_up, "never elected"
        queue.put("kept", id="m1", on_conflict="replace")
        assert queue.get("m1") is not None
        queue.purge()


async def _usurp(bootstrap: str, prefix: str) -> None:
    """A ``reign`` entry of another reign appended to the namespace's log, as a
    successor elected while the scheduler did not yet notice would append it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        headers = [("kind", b"reign"), ("reign", b"usurper")]
        await producer.send_and_wait(f"{prefix}.log", b"", partition=0, headers=headers)
    finally:
        await producer.stop()


@pytest.mark.slow
def test_a_deposed_scheduler_acknowledges_nothing_a_replay_skips(
    memory_broker: TansuBroker,
) -> None:
    """A scheduler that still believes it is elected after a successor's ``reign``
    entry is in the log (cut off from the group's coordinator, not from the log's
    leader) answers no put from then on: the put is answered once a scheduler whose
    entries every replay keeps holds it, and after a failover every put that returned
    is there (on Tansu a failover takes some 15 s, 9 s at the least session timeout a
    Kafka broker takes: docs/kafka.md)."""
    url = _url(memory_broker, scheduler="on", request_timeout="90", session_timeout="6")
    prefix = parse(url, {}).prefix
    first = Queue(url, name="jobs")
    first.put("before", delay=600, id="m1", on_conflict="replace")  # once elected
    asyncio.run(_usurp(memory_broker.bootstrap, prefix))
    acknowledged = ["m1"]
    for n in range(2, 5):  # the scheduler's own answers (a fast put is the intake's)
        first.put(n, delay=600, id=f"m{n}", on_conflict="replace")
        acknowledged.append(f"m{n}")
    first.close()
    second = Queue(url, name="jobs")
    assert [mid for mid in acknowledged if second.get(mid) is None] == []
    assert second.stats().scheduled == len(acknowledged)
    second.purge()
    second.close()


# -- a user's topic -----------------------------------------------------------------------


async def _read(bootstrap: str, topic: str, count: int, seconds: float) -> list[Any]:
    """Up to ``count`` records of ``topic``'s partition 0 from its first, each with the
    epoch ms it was read: a plain consumer, no group, nothing of delayq."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=5)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        got: list[Any] = []
        give_up = time.monotonic() + seconds
        while len(got) < count and time.monotonic() < give_up:
            batches = await consumer.getmany(partition, timeout_ms=100)
            now = time.time() * 1000
            got += [(record, now) for records in batches.values() for record in records]
        return got
    finally:
        await consumer.stop()


async def _create(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()


@pytest.mark.slow
def test_due_messages_are_produced_to_the_users_topic(memory_broker: TansuBroker) -> None:
    """A queue with ``deliver_topic`` produces each message at its time to the user's
    topic, keyed by ``deliver_key``: a plain consumer reads the payload, the message's
    headers and delayq's, never before the message was due; a cancelled one never
    comes."""
    topic = f"orders-timeouts-{uuid.uuid4().hex[:8]}"
    asyncio.run(_create(memory_broker.bootstrap, topic))
    url = _url(memory_broker, scheduler="on", deliver_topic=topic, deliver_key="timeout")
    with Queue(url, name="orders") as queue:
        queue.put({"order": 1}, delay=0.3, id="o1", headers={"tenant": "acme"})
        queue.put({"order": 2}, delay=0.6, id="o2")
        queue.put({"order": 3}, delay=0.4, id="o3")
        assert queue.cancel("o3")
        got = asyncio.run(_read(memory_broker.bootstrap, topic, 2, 20))
        extra = asyncio.run(_read(memory_broker.bootstrap, topic, 3, 1))
        queue.purge()
    assert [json.loads(record.value) for record, _ in got] == [{"order": 1}, {"order": 2}]
    assert len(extra) == 2  # the cancelled one never came
    first, read_at = got[0]
    headers = {name: value.decode() for name, value in first.headers}
    assert first.key == b"timeout"
    assert headers["tenant"] == "acme"
    assert headers["x-delayq-id"] == "o1"
    assert headers["x-delayq-queue"] == "orders"
    assert read_at >= int(headers["x-delayq-due-at"])  # never early
