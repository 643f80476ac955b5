"""``redis+unix://``: a Redis on this host through its Unix domain socket.

A private ``redis-server`` listens on a socket file in the test's directory (and on a
TCP port, to check what landed). Checked: both faces put, wait for and take messages
through the socket, including a consumer woken by a put (the listener's connection is
a socket connection too), a sharded queue, the database and prefix of the URL, and
malformed URLs refused before anything connects.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.durable import AsyncQueue, Queue
from delayq.errors import UnsupportedURL

pytest.importorskip("redis")

from ._redis_server import RedisProcess


@pytest.fixture
def sock_server(tmp_path: Path) -> Iterator[tuple[RedisProcess, str]]:
    """A private server on a socket file; its ``redis+unix://`` URL (database 2)."""
    path = tmp_path / "redis.sock"
    process = RedisProcess(
        tmp_path,
        ("--unixsocket", str(path), "--unixsocketperm", "700", "--save", "", "--appendonly", "no"),
    )
    try:
        process.start()
        yield process, f"redis+unix://{path}?db=2&prefix=viasock"
    finally:
        process.stop()


def test_both_faces_put_wait_and_take_through_the_socket(
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


def test_a_sharded_queue_through_the_socket(sock_server: tuple[RedisProcess, str]) -> None:
    _, url = sock_server
    with Queue(f"{url}&shards=3", name="spread") as q:
        ids = q.put_many([{"payload": i} for i in range(30)])
        got: list[Any] = []
        while batch := q.reserve(max=30, wait=0):
            got += batch
        assert [m.id for m in got] == ids  # put order across the shards
        assert q.ack_many(got) == []


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
