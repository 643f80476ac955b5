"""Fixtures of the conformance suite: every test runs for each backend x each face.

A backend joins the suite with one entry in ``BACKENDS``: a generator function that
takes pytest's ``tmp_path`` and yields a URL for a fresh, isolated store (and cleans
it up afterwards). When its server is unreachable it calls :func:`unavailable`,
which skips the backend locally but fails the run when the backend is listed in
``$DELAYQ_REQUIRE`` (``DELAYQ_REQUIRE=redis,postgres``; ``all`` requires every one).

A guarantee of the contract that a backend cannot give is declared by its descriptor
(``not_guaranteed``, name -> reason); a test that needs one is marked
``@pytest.mark.guarantee("<name>")`` and is skipped, with that reason, on such a
backend (``amqp://`` declares ``server-clock``: AMQP exposes no server time).

The async face runs through :class:`AsyncFace`, which drives an ``AsyncQueue`` on an
event loop in a helper thread, so each test is written once against the sync API.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import itertools
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import pytest

from delayq.durable import AsyncQueue, Queue
from delayq.durable.registry import descriptor

T = TypeVar("T")


def unavailable(backend: str, reason: str) -> NoReturn:
    """Skip tests of ``backend`` (its server is not reachable), or fail them when
    ``$DELAYQ_REQUIRE`` lists it."""
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    if backend in required or "all" in required:
        pytest.fail(f"{backend} is required by DELAYQ_REQUIRE but unavailable: {reason}")
    pytest.skip(f"{backend} unavailable: {reason}")


def memory_url(tmp_path: Path) -> Iterator[str]:
    """A private namespace of the process-wide memory store."""
    yield f"memory://conformance-{uuid.uuid4().hex}"


def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """A fresh database file in the test's temporary directory."""
    yield f"sqlite:///{tmp_path / 'conformance.db'}"


def redis_url(tmp_path: Path) -> Iterator[str]:
    """A private key prefix on the test Redis (``$DELAYQ_TEST_REDIS``, by default
    ``redis://127.0.0.1:6379/0``); every key under it is deleted afterwards."""
    try:
        import redis  # noqa: PLC0415 (optional: the backend is skipped without it)
    except ImportError:
        unavailable("redis", "redis-py is not installed (pip install 'delayq[redis]')")
    base = os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
    prefix = f"delayq-test-{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(base, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        unavailable("redis", f"{base}: {exc}")
    try:
        yield f"{base}{'&' if '?' in base else '?'}prefix={prefix}"
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


#: Shards of the cluster entry: more than masters, so every master holds some.
CLUSTER_SHARDS = 4


def redis_cluster_url(tmp_path: Path) -> Iterator[str]:
    """A private key prefix on the session's 3-master Redis Cluster (started from the
    ``redis-server`` binary on free ports, see tests/backends/_redis_cluster.py), with
    each queue spread over :data:`CLUSTER_SHARDS` shards; keys are deleted afterwards.
    Required by ``DELAYQ_REQUIRE=redis``."""
    try:
        import redis.cluster  # noqa: PLC0415 (optional: the backend is skipped without it)

        from backends._redis_cluster import ClusterUnavailable, shared_cluster  # noqa: PLC0415
    except ImportError as exc:
        unavailable("redis", f"cannot run a cluster: {exc}")
    try:
        cluster = shared_cluster()
    except ClusterUnavailable as exc:
        unavailable("redis", f"the test cluster did not start: {exc}")
    prefix = f"delayq-test-{uuid.uuid4().hex[:12]}"
    try:
        yield f"{cluster.url}?prefix={prefix}&shards={CLUSTER_SHARDS}"
    finally:
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        try:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for key in keys:
                client.delete(key)
        finally:
            client.close()


#: Schemas of this process's tests that ended, emptied, each to be the next test's: a
#: schema's first backend object builds it with ~0.2-0.35 s of DDL, which was half of a
#: PostgreSQL conformance test's time. Dropped when the session ends (``drop_spare``).
_spare_schemas: list[str] = []


def postgres_url(tmp_path: Path) -> Iterator[str]:
    """A private schema on the test PostgreSQL (``$DELAYQ_TEST_POSTGRES``, by default
    ``postgresql://postgres@127.0.0.1:5432/test``): a new one, or one an earlier test of
    this process left and that was emptied (no row in any table but the schema's
    version, every sequence at its start); afterwards emptied for the next, or dropped."""
    try:
        import psycopg  # noqa: PLC0415 (optional: the backend is skipped without it)
    except ImportError:
        unavailable("postgres", "psycopg is not installed (pip install 'delayq[postgres]')")
    base = os.environ.get("DELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    schema = _spare_schemas.pop() if _spare_schemas else f"delayq_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=2)
    except psycopg.Error as exc:
        unavailable("postgres", f"{base}: {exc}")
    try:
        yield f"{base}{'&' if '?' in base else '?'}schema={schema}"
    finally:
        with admin:
            if _emptied(admin, schema):
                _spare_schemas.append(schema)
            else:
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _emptied(admin: Any, schema: str) -> bool:
    """Empty ``schema`` as its first backend object leaves it (its tables' rows gone
    but the version in ``meta``, its sequences restarted), if it is at this code's
    version: whether it was (else it is to be dropped)."""
    import psycopg  # noqa: PLC0415

    from delayq.backends.postgres._schema import VERSION  # noqa: PLC0415

    try:
        with admin.transaction():
            admin.execute("SET LOCAL lock_timeout = '10s'")
            tables = [
                row[0]
                for row in admin.execute(
                    "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s", [schema]
                )
            ]
            if "meta" not in tables:
                return False
            version = admin.execute(
                f"SELECT value FROM \"{schema}\".meta WHERE key = 'schema'"
            ).fetchone()
            if version is None or version[0] != VERSION:
                return False
            others = ", ".join(f'"{schema}"."{table}"' for table in tables if table != "meta")
            if others:
                admin.execute(f"TRUNCATE {others}")
            admin.execute(f"DELETE FROM \"{schema}\".meta WHERE key <> 'schema'")
            for (sequence,) in admin.execute(
                "SELECT sequencename FROM pg_catalog.pg_sequences WHERE schemaname = %s",
                [schema],
            ).fetchall():
                admin.execute(f'ALTER SEQUENCE "{schema}"."{sequence}" RESTART')
    except psycopg.Error:
        return False
    return True


def drop_spare() -> None:
    """Drop the schemas kept for later tests (the session's end)."""
    if not _spare_schemas:
        return
    import psycopg  # noqa: PLC0415

    base = os.environ.get("DELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    with psycopg.connect(base, autocommit=True, connect_timeout=2) as admin:
        while _spare_schemas:
            admin.execute(f'DROP SCHEMA IF EXISTS "{_spare_schemas.pop()}" CASCADE')


def amqp_url(tmp_path: Path) -> Iterator[str]:
    """A namespace of its own (``prefix``) on the test RabbitMQ (``$DELAYQ_TEST_AMQP``, by
    default ``amqp://guest:guest@127.0.0.1:5672/%2F``), every backend object a candidate
    for its scheduler (of each of ``$DELAYQ_TEST_AMQP_SHARDS`` shards, when set); the
    namespace's queues and exchanges are deleted afterwards."""
    try:
        import pika  # noqa: PLC0415 (optional: the backend is skipped without it)
        import pika.exceptions  # noqa: PLC0415
    except ImportError:
        unavailable("amqp", "pika is not installed (pip install 'delayq[dev]')")
    base = os.environ.get("DELAYQ_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
    prefix = f"delayq-test-{uuid.uuid4().hex[:12]}"
    try:
        connection = pika.BlockingConnection(pika.URLParameters(f"{base}?socket_timeout=2"))
    except pika.exceptions.AMQPError as exc:
        unavailable("amqp", f"{base}: {exc!r}")
    # DELAYQ_TEST_AMQP_SHARDS=N: every namespace of N shards (docs/rabbitmq.md).
    shards = int(os.environ.get("DELAYQ_TEST_AMQP_SHARDS", "1"))
    try:
        yield f"{base}?prefix={prefix}&scheduler=on" + (f"&shards={shards}" if shards > 1 else "")
    finally:
        channel = connection.channel()
        _drop_amqp_namespace(channel, prefix)
        for k in range(shards if shards > 1 else 0):
            _drop_amqp_namespace(channel, f"{prefix}.{k}")
        connection.close()


def _drop_amqp_namespace(channel: Any, prefix: str) -> None:
    """Delete the queues and exchanges of the amqp:// namespace ``prefix``."""
    for queue in (f"{prefix}.log", f"{prefix}.meta", f"{prefix}.lock", f"{prefix}.intake"):
        channel.queue_delete(queue)
    for exchange in (f"{prefix}.rpc", f"{prefix}.events"):
        channel.exchange_delete(exchange)


def drop_amqp_shards(url: str, shards: int) -> None:
    """Delete what the shards of the amqp:// namespace of ``url`` (one of
    :func:`amqp_url`) declared: ``amqp_url`` deletes the namespace's own."""
    import pika  # noqa: PLC0415

    parts = urlsplit(url)
    prefix = dict(parse_qsl(parts.query))["prefix"]
    connection = pika.BlockingConnection(pika.URLParameters(urlunsplit(parts._replace(query=""))))
    try:
        channel = connection.channel()
        for k in range(shards):
            _drop_amqp_namespace(channel, f"{prefix}.{k}")
    finally:
        connection.close()


class _KafkaNamespace:
    """One namespace on a private Tansu broker (tests/backends/_tansu.py) for the kafka
    tests of the test files that run one after the other in a process, its scheduler a
    backend object held open for them all.

    A consumer group's join takes seconds on Tansu (a pause of its group coordinator,
    docs/kafka.md), so electing a scheduler per test would cost the suite minutes: the
    tests' own backend objects do not stand (``scheduler=off``) and are answered by
    this one. Each test's queues are purged after it. The namespace closes before a
    file without kafka tests (:func:`close_kafka_namespace`), as its scheduler's readers
    poll the broker while it lives; the broker lives as long as the process."""

    broker: Any = None

    def __init__(self) -> None:
        self.url = self.fresh_url()
        self.prefix = self.url.split("prefix=", 1)[1].split("&", 1)[0]
        self.keeper = Queue(f"{self.url}&scheduler=on", name="keeper")
        self.keeper.stats()  # returns once the keeper is elected

    def worn(self) -> bool:
        """Whether a topic its readers tail (the scheduler's requests and intake, the
        clients' replies) holds :data:`KAFKA_WORN_AT` records or more."""
        topics = [f"{self.prefix}.{topic}" for topic in ("requests", "intake", "replies")]
        return bool(self.broker.fullest(topics) >= KAFKA_WORN_AT)

    @classmethod
    def fresh_url(cls) -> str:
        """The URL of a new namespace on the process's Tansu broker (started at the
        first call), without a scheduler option."""
        from backends._tansu import TansuBroker  # noqa: PLC0415

        if cls.broker is None:
            cls.broker = TansuBroker("memory")
            atexit.register(cls.broker.close)
        prefix = f"delayq-test-{uuid.uuid4().hex[:12]}"
        # Tansu's departures: no InitProducerId, and a waiting fetch answered only
        # when its wait ends; a candidate's leave is seen once its session would have
        # ended, so the least session a Kafka broker takes (docs/kafka.md).
        return (
            f"kafka://{cls.broker.bootstrap}?prefix={prefix}&idempotence=off&fetch_wait_ms=5"
            "&session_timeout=6"
        )

    def close(self) -> None:
        self.keeper.close()


_kafka: _KafkaNamespace | None = None
#: A shared namespace is left for a fresh one once a topic its readers tail holds this
#: many records: on Tansu (memory storage) a fetch from a partition of one-record
#: batches slows as the partition grows; measured, at 4,500 records a fetch returned
#: 1-11 records where 141 came at 3,000, and at 10,000 none within 2 s (docs/kafka.md).
KAFKA_WORN_AT = 2_000


def renew_worn_kafka_namespace() -> None:
    """Close the process's kafka namespace if it is worn (:meth:`_KafkaNamespace.worn`):
    the next kafka test opens a fresh one, with its own election (seconds on Tansu).
    The root conftest calls it after each test, its fixtures torn down."""
    if _kafka is not None and _kafka.worn():
        close_kafka_namespace()


def close_kafka_namespace(*, broker: bool = False) -> None:
    """Close the process's kafka namespace, if one is open, and with ``broker`` its
    Tansu broker too. The root conftest calls it after a test whose next test is in a
    file without kafka tests (or at the session's end): files with kafka tests that
    run one after the other in a process share the namespace and its election, and
    while no kafka test runs no scheduler polls the broker."""
    global _kafka
    if _kafka is not None:
        namespace, _kafka = _kafka, None
        namespace.close()
    if broker and _KafkaNamespace.broker is not None:
        running, _KafkaNamespace.broker = _KafkaNamespace.broker, None
        running.close()


def kafka_url(tmp_path: Path) -> Iterator[str]:
    """The shared namespace of :class:`_KafkaNamespace` (opened by the first kafka test
    after a file without any); required by ``DELAYQ_REQUIRE=kafka``."""
    global _kafka
    try:
        import aiokafka  # noqa: F401, PLC0415 (optional: the backend is skipped without it)

        from backends._tansu import TansuUnavailable  # noqa: PLC0415
    except ImportError as exc:
        unavailable("kafka", f"cannot run a Kafka broker: {exc}")
    if _kafka is None:
        try:
            _kafka = _KafkaNamespace()
        except TansuUnavailable as exc:
            unavailable("kafka", str(exc))
    yield f"{_kafka.url}&scheduler=off"


def kafka_fresh_url(tmp_path: Path) -> Iterator[str]:
    """A namespace of its own on the process's Tansu broker, no scheduler in it and no
    scheduler option in its URL (for the tests of an election: each costs seconds on
    Tansu, so the suites share :func:`kafka_url`'s instead); required by
    ``DELAYQ_REQUIRE=kafka``."""
    try:
        import aiokafka  # noqa: F401, PLC0415 (optional: the backend is skipped without it)

        from backends._tansu import TansuUnavailable  # noqa: PLC0415
    except ImportError as exc:
        unavailable("kafka", f"cannot run a Kafka broker: {exc}")
    try:
        url = _KafkaNamespace.fresh_url()
    except TansuUnavailable as exc:
        unavailable("kafka", str(exc))
    yield url


def kafka_purged_url(tmp_path: Path) -> Iterator[str]:
    """:func:`kafka_url` for tests that name their queues alike (the server suite's
    ``q``, the worker processes' ``jobs``): every queue of the namespace is purged after
    each test, so the next test of the file starts on an empty namespace."""
    for url in kafka_url(tmp_path):
        try:
            yield url
        finally:
            with Queue(url, name="purge") as queue:
                for name in queue.queues():
                    queue.named(name).purge()


# One entry per backend; e.g. sqlite joins with ``"sqlite": sqlite_url`` where
# ``def sqlite_url(tmp_path): yield f"sqlite:///{tmp_path / 'q.db'}"``.
BACKENDS: dict[str, Callable[[Path], Iterator[str]]] = {
    "amqp": amqp_url,
    "kafka": kafka_url,
    "memory": memory_url,
    "postgres": postgres_url,
    "redis": redis_url,
    "redis-cluster": redis_cluster_url,
    "sqlite": sqlite_url,
}


class LoopThread:
    """An event loop running in a daemon thread; ``run(coro)`` waits for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def stop(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class AsyncFace:
    """An :class:`AsyncQueue` seen through the sync API: each coroutine method runs to
    completion on the loop thread (so many caller threads mean many tasks)."""

    def __init__(self, runner: LoopThread, queue: AsyncQueue) -> None:
        self._runner = runner
        self._queue = queue

    @property
    def inner(self) -> AsyncQueue:
        """The wrapped AsyncQueue."""
        return self._queue

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._queue, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(attribute(*args, **kwargs))

        return call

    def named(self, name: str) -> AsyncFace:
        """The sibling queue ``name`` (``AsyncQueue.named``), seen through the same face."""
        return AsyncFace(self._runner, self._queue.named(name))

    def __enter__(self) -> AsyncFace:
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.run(self._queue.close())


@pytest.fixture(params=sorted(BACKENDS))
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh, isolated store for each backend of ``BACKENDS``."""
    yield from BACKENDS[request.param](tmp_path)


def not_guaranteed(url: str) -> dict[str, str]:
    """What the backend of ``url`` declares it cannot guarantee, with the reasons."""
    return dict(descriptor(url).not_guaranteed)


@pytest.fixture(autouse=True)
def _declared_guarantees(request: pytest.FixtureRequest) -> None:
    """Skip a test marked ``guarantee(name)`` on a backend that declares it cannot
    give that guarantee, saying why."""
    marker = request.node.get_closest_marker("guarantee")
    if marker is None or "backend_url" not in request.fixturenames:
        return
    name = str(marker.args[0])
    reason = not_guaranteed(request.getfixturevalue("backend_url")).get(name)
    if reason is not None:
        pytest.skip(f"{name} is not guaranteed by this backend: {reason}")


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> str:
    """Which face the test drives: ``Queue`` or ``AsyncQueue`` (through AsyncFace)."""
    return str(request.param)


_names = itertools.count()


@pytest.fixture
def make_queue(backend_url: str, face: str) -> Iterator[Callable[..., Any]]:
    """``make_queue(name=None, **kwargs)``: a queue of this test's store and face.

    Without ``name`` each call makes a new, unique queue name; queues made with the
    same name share their messages. Every queue is purged and closed afterwards.
    """
    runner = LoopThread() if face == "async" else None
    made: list[Any] = []

    def make(name: str | None = None, **kwargs: Any) -> Any:
        queue_name = f"q{next(_names)}-{uuid.uuid4().hex[:8]}" if name is None else name
        queue: Any
        if runner is None:
            queue = Queue(backend_url, name=queue_name, **kwargs)
        else:

            async def build() -> AsyncQueue:
                return AsyncQueue(backend_url, name=queue_name, **kwargs)

            queue = AsyncFace(runner, runner.run(build()))
        made.append(queue)
        return queue

    try:
        yield make
    finally:
        # Last made first: on amqp:// the first queue's backend is the namespace's
        # scheduler, and closing it first would hand over (and replay) at each close.
        for queue in reversed(made):
            if not queue.closed:
                queue.purge()
                queue.close()
        if runner is not None:
            runner.stop()


@pytest.fixture
def q(make_queue: Callable[..., Any]) -> Any:
    """A fresh queue with the default settings."""
    return make_queue()
