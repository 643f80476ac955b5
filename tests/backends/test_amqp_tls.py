"""``amqps://``: a private RabbitMQ node with a TLS listener and a certificate made for
the test by ``openssl``. Both faces put, wait for and take messages over TLS; the
broker's certificate is checked unless the URL says otherwise; TLS parameters on a plain
``amqp://`` URL, or malformed ones, are refused before anything connects.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.durable import AsyncQueue, Queue
from delayq.errors import UnsupportedURL

pytest.importorskip("aiormq")

from delayq.backends.amqp import ServerRefused

from ._rabbitmq_nodes import RabbitNodes, unavailable

pytestmark = pytest.mark.slow


def _certificate(directory: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("no openssl binary to make the TLS broker's certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert)),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o644)  # the broker's Erlang VM reads it
    return cert, key


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RabbitNodes, Path]]:
    """A private node with a TLS listener; its certificate (its own CA)."""
    directory = tmp_path_factory.mktemp("amqps")
    cert, key = _certificate(directory)
    nodes = RabbitNodes(directory, 1, tls=(cert, key))
    try:
        nodes.start()
        yield nodes, cert
    finally:
        nodes.stop()


def _url(nodes: RabbitNodes, query: str) -> str:
    return f"amqps://guest:guest@127.0.0.1:{nodes.tls_ports[0]}/%2F?{query}"


def test_both_faces_put_wait_and_take_over_tls(broker: tuple[RabbitNodes, Path]) -> None:
    nodes, cert = broker
    url = _url(nodes, f"cafile={cert}&prefix=tls&scheduler=on")
    with Queue(url, name="jobs") as q:
        woken: list[Any] = []
        waiter = threading.Thread(target=lambda: woken.extend(q.reserve(wait=20)))
        waiter.start()
        time.sleep(0.5)  # into its wait: the put must wake it
        q.put({"n": 1}, id="a", delay=0.2)
        waiter.join(20)
        assert [(m.id, m.payload) for m in woken] == [("a", {"n": 1})]
        q.ack(woken[0])
        q.put_many([{"payload": i} for i in range(3)])

        async def take() -> list[Any]:
            async with AsyncQueue(url, name="jobs") as aq:
                got = await aq.reserve(max=10, wait=20)
                assert await aq.ack_many(got) == []
                return [m.payload for m in got]

        assert asyncio.run(take()) == [0, 1, 2]
        assert q.stats().ready == 0


def test_the_brokers_certificate_is_checked_unless_told_otherwise(
    broker: tuple[RabbitNodes, Path],
) -> None:
    nodes, _ = broker
    with (
        Queue(_url(nodes, "prefix=tls-unverified&request_timeout=10"), name="jobs") as q,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        q.put("x")
    with Queue(_url(nodes, "no_verify_ssl=1&prefix=tls-unverified&scheduler=on"), name="jobs") as q:
        q.put("x", id="kept")
        assert q.get("kept") is not None
        q.purge()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("amqp://guest:guest@127.0.0.1/%2F?cafile=/ca.pem", "use amqps://"),
        ("amqp://127.0.0.1/?no_verify_ssl=1&certfile=/c.pem", "are TLS parameters"),
        ("amqps://127.0.0.1/?no_verify_ssl=yes", "no_verify_ssl must be 0 or 1"),
        ("amqps://127.0.0.1/?keyfile=/k.pem", "keyfile needs certfile"),
        ("amqps://127.0.0.1/?cafile=", "cafile of an AMQP URL needs a value"),
    ],
)
def test_bad_tls_parameters_are_refused_before_connecting(url: str, says: str) -> None:
    with pytest.raises(UnsupportedURL, match=says):
        Queue(url, name="jobs")


def test_a_tls_file_that_cannot_be_read_is_raised_at_once(tmp_path: Path) -> None:
    url = f"amqps://guest:guest@127.0.0.1:1/%2F?cafile={tmp_path / 'missing.pem'}"
    with Queue(f"{url}&request_timeout=60", name="jobs") as q, pytest.raises(FileNotFoundError):
        q.put("x")


def test_credentials_the_broker_refuses_are_raised_at_once() -> None:
    """Not ridden out as an outage until the request timeout: no retry mends them."""
    url = "amqp://guest:not-the-password@127.0.0.1:5672/%2F?request_timeout=60"
    with Queue(url, name="jobs") as q, pytest.raises(ServerRefused) as got:
        q.put("x")
    assert "refused the login" in str(got.value)
    assert "ACCESS_REFUSED" in str(got.value.__cause__)
