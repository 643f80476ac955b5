"""The transports other than plain TCP: ``redis+unix://`` (a Redis on this host through
its Unix domain socket) and ``rediss://`` (TLS).

A private ``redis-server`` listens on a socket file in the test's directory, or on a
TLS port with a certificate made for the test by ``openssl`` (and on a TCP port, to
check what landed). Checked on each: both faces put, wait for and take messages,
including a consumer woken by a put (the listener's connection goes the same way), a
sharded queue, the database and prefix of the URL. And: TLS checks the server's
certificate unless told otherwise, and malformed unix URLs are refused before anything
connects.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.durable import AsyncQueue, Queue
from delayq.errors import UnsupportedURL

pytest.importorskip("redis")

import redis

from ._redis_server import RedisProcess, free_port, unavailable

#: Where the TLS server's certificate and key go in the test's directory.
CERT, KEY = "cert.pem", "key.pem"


def _unix(tmp_path: Path) -> tuple[RedisProcess, str]:
    path = tmp_path / "redis.sock"
    process = RedisProcess(
        tmp_path,
        ("--unixsocket", str(path), "--unixsocketperm", "700", "--save", "", "--appendonly", "no"),
    )
    return process, f"redis+unix://{path}?db=2&prefix=viasock"


def _tls(tmp_path: Path) -> tuple[RedisProcess, str]:
    openssl = shutil.which("openssl")
    if openssl is None:
        unavailable("no openssl binary to make the TLS server's certificate")
    cert, key = tmp_path / CERT, tmp_path / KEY
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert)),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    process = RedisProcess(
        tmp_path,
        (
            *("--tls-port", str(port), "--tls-auth-clients", "no"),
            *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
            *("--tls-ca-cert-file", str(cert), "--save", "", "--appendonly", "no"),
        ),
    )
    return process, f"rediss://127.0.0.1:{port}/2?ssl_ca_certs={cert}&prefix=viasock"


@pytest.fixture(params=["unix", "tls"])
def sock_server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[RedisProcess, str]]:
    """A private server reached through the transport; its URL (database 2, prefix
    ``viasock``)."""
    process, url = (_unix if request.param == "unix" else _tls)(tmp_path)
    try:
        try:
            process.start()
        except RuntimeError as exc:  # e.g. a redis-server built without TLS
            unavailable(str(exc))
        yield process, url
    finally:
        process.stop()


def test_both_faces_put_wait_and_take_through_the_transport(
    sock_server: tuple[RedisProcess, str],
) -> None:
    server, url = sock_server
    with Queue(url, name="jobs") as q:
        woken: list[Any] = []
        waiter = threading.Thread(target=lambda: woken.extend(q.reserve(wait=10)))
        waiter.start()
        time.sleep(0.3)  # into its wait: the put must wake it
        q.put({"n": 1}, id="a")
        waiter.join(10)
        assert [m.payload for m in woken] == [{"n": 1}]
        q.ack(woken[0])
        q.put_many([{"payload": i} for i in range(3)])

    async def take() -> list[Any]:
        async with AsyncQueue(url, name="jobs") as aq:
            got = await aq.reserve(max=10, wait=5)
            await aq.ack_many(got)
            await aq.put("later", delay=3600)
            return [m.payload for m in got]

    assert asyncio.run(take()) == [0, 1, 2]
    client = server.client()
    try:
        client.select(2)
        keys = sorted(key.decode() for key in client.keys("*"))
    finally:
        client.close()
    assert keys
    assert all(key.startswith("viasock:{jobs:0}:") for key in keys)


def test_a_sharded_queue_through_the_transport(sock_server: tuple[RedisProcess, str]) -> None:
    _, url = sock_server
    with Queue(f"{url}&shards=3", name="spread") as q:
        ids = q.put_many([{"payload": i} for i in range(30)])
        got: list[Any] = []
        while batch := q.reserve(max=30, wait=0):
            got += batch
        assert [m.id for m in got] == ids  # put order across the shards
        assert q.ack_many(got) == []


def test_tls_checks_the_server_certificate_unless_told_otherwise(tmp_path: Path) -> None:
    process, url = _tls(tmp_path)
    process.start()
    try:
        unverified = url.replace(f"ssl_ca_certs={tmp_path / CERT}&", "")
        with Queue(unverified, name="jobs") as q, pytest.raises(redis.ConnectionError) as raised:
            q.put("never")
        assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value)
        with Queue(f"{unverified}&ssl_cert_reqs=none", name="jobs") as q:
            q.put("trusting")
            assert [m.payload for m in q.reserve(wait=0)] == ["trusting"]
    finally:
        process.stop()


@pytest.mark.parametrize(
    "url",
    [
        "redis+unix://localhost/tmp/redis.sock",  # a host where the path should be
        "redis+unix:///",
        "redis+unix:///tmp/redis.sock?db=two",
    ],
)
def test_a_malformed_unix_url_is_refused(url: str) -> None:
    with pytest.raises(UnsupportedURL):
        Queue(url, name="never")
