"""Fixtures of the fault tests: a host in a network namespace, its links, its Redis
(a host and a RabbitMQ node per module for amqp://)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from backends._tansu import TansuBroker, TansuUnavailable, s3_broker  # noqa: F401
from backends._tansu import unavailable as kafka_unavailable

from ._netns import Link, NsRabbit, NsRedis, ServerHost, namespaces_refused, unavailable


@pytest.fixture(scope="session")
def namespaces() -> None:
    """Once a session: whether hosts can be made here (fail under CI, skip elsewhere)."""
    reason = namespaces_refused()
    if reason:
        unavailable(reason)


@pytest.fixture
def server_host(namespaces: None) -> Iterator[ServerHost]:
    """A host of the test's own; removed with its links at the end, even on failure."""
    host = ServerHost()
    try:
        yield host
    finally:
        host.close()


@pytest.fixture
def ns_redis(server_host: ServerHost, tmp_path: Path) -> Iterator[NsRedis]:
    """A ``redis-server`` in :func:`server_host`'s namespace (not started: the test
    starts it once it made its links), stopped by PID at the end."""
    server = NsRedis(server_host, tmp_path)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def link(server_host: ServerHost, ns_redis: NsRedis) -> Link:
    """A link to :func:`ns_redis`, which is started."""
    link = server_host.link()
    ns_redis.start(link)
    return link


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs of 1 MiB of its own (a disk that fills up), unmounted at
    the end, even on failure."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        unavailable("not root, or no mount command", "a tmpfs mount")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "delayq-test-disk", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        unavailable(done.stderr.strip() or "mount failed", "a tmpfs mount")
    try:
        yield disk
    finally:
        # Lazy: a connection the test left open must not keep the mount forever.
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


# -- RabbitMQ (amqp://) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def rabbit_host(namespaces: None) -> Iterator[ServerHost]:
    """A host for one RabbitMQ node, shared by a test module (a node takes seconds to
    start); each test makes its own links to it (:func:`rabbit_link`)."""
    host = ServerHost()
    try:
        yield host
    finally:
        host.close()


@pytest.fixture(scope="module")
def ns_rabbit(
    rabbit_host: ServerHost, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NsRabbit]:
    """A private RabbitMQ node in :func:`rabbit_host`'s namespace, started once a module
    (tests use a namespace of their own on it: a fresh ``prefix``), stopped by PID."""
    pytest.importorskip("aiormq")
    server = NsRabbit(rabbit_host, tmp_path_factory.mktemp("rabbit"))
    try:
        server.start(rabbit_host.link())
        yield server
    finally:
        server.stop()


@pytest.fixture
def rabbit_link(rabbit_host: ServerHost, ns_rabbit: NsRabbit) -> Iterator[Callable[[], Link]]:
    """Make links to :func:`ns_rabbit` (healed and removed at the end of the test)."""
    made: list[Link] = []

    def make() -> Link:
        link = rabbit_host.link()
        made.append(link)
        return link

    try:
        yield make
    finally:
        for link in made:
            link.heal()
            link.remove()
            rabbit_host.links.remove(link)


# -- Kafka (kafka://) --------------------------------------------------------------------


class KafkaNet(NamedTuple):
    """A private Tansu broker (memory storage) in a host's namespace, advertising the
    address of ``direct`` (a link from the root namespace), and a client host (a
    namespace, ``clients``) whose one route to that address is ``cut_off``: a thread
    that enters ``clients`` (_netns.enter, ``Face(netns=...)``) reaches the broker
    through ``cut_off``, every other through ``direct``. A broker advertises one
    address to all its clients, so two clients of one process cannot otherwise be cut
    apart."""

    broker: TansuBroker
    direct: Link
    cut_off: Link
    clients: str


@pytest.fixture(scope="module")
def kafka_net(namespaces: None) -> Iterator[KafkaNet]:
    """:class:`KafkaNet`, once a module (tests use a namespace of their own on it: a
    fresh ``prefix``); the links healed after each test by :func:`kafka_links`."""
    pytest.importorskip("aiokafka")
    with ServerHost() as host, ServerHost() as clients:
        direct = host.link()
        cut_off = host.link(client=clients)
        cut_off.route(direct.address)
        try:
            broker = TansuBroker("memory", host=direct.address, wrap=host.exec_argv([]))
        except TansuUnavailable as exc:
            kafka_unavailable(str(exc))
        try:
            yield KafkaNet(broker, direct, cut_off, clients.name)
        finally:
            broker.close()


@pytest.fixture
def kafka_links(kafka_net: KafkaNet) -> Iterator[KafkaNet]:
    """:func:`kafka_net`, its links healed at the end of the test, even on failure."""
    try:
        yield kafka_net
    finally:
        kafka_net.direct.heal()
        kafka_net.cut_off.heal()
