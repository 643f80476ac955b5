"""Redis ack_many specifics: a sharded queue on one node sends one script per shard in
one pipeline, which reloads the function library when the server lost it."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from delayq.durable import AsyncQueue, Message, Queue, State

redis = pytest.importorskip("redis")

from delayq.backends.redis._scripts import library_source  # noqa: E402
from delayq.backends.redis._shards import shard_of  # noqa: E402

SHARED = os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
SHARDS = 3


@pytest.fixture
def sharded_url() -> Iterator[str]:
    """A sharded queue URL under a private key prefix of the shared test Redis."""
    client = redis.Redis.from_url(SHARED, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        required = {n.strip() for n in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
        if "redis" in required or "all" in required:
            pytest.fail(f"redis is required by DELAYQ_REQUIRE but unavailable: {exc}")
        pytest.skip(f"redis unavailable: {exc}")
    prefix = f"delayq-test-{uuid.uuid4().hex[:12]}"
    try:
        yield f"{SHARED}?prefix={prefix}&shards={SHARDS}"
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def _drop_library() -> None:
    """Remove delayq's function library, as a restart without persistence would (any
    client that needs it loads it again)."""
    client = redis.Redis.from_url(SHARED)
    try:
        client.function_delete(library_source()[0])
    except redis.ResponseError:
        pass  # not loaded
    finally:
        client.close()


def _reserve(q: Queue, count: int, lease: float = 30) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        got += q.reserve(max=count - len(got), wait=1, lease=lease)
    return got


def test_sharded_ack_many_spans_shards_and_reports_lost_in_order(sharded_url: str) -> None:
    with Queue(sharded_url, name="spread") as q:
        q.put_many([{"payload": n, "id": f"m{n}"} for n in range(30)])
        msgs = sorted(_reserve(q, 30), key=lambda m: m.id)
        assert len({shard_of(m.id, SHARDS) for m in msgs}) == SHARDS
        stale = msgs[::7]
        q.ack_many(stale)
        _drop_library()
        batch = list(reversed(msgs))
        expected = [m.id for m in batch if m in stale]
        assert q.ack_many(batch) == expected
        assert q.stats().total == 0


def test_async_sharded_ack_many(sharded_url: str) -> None:
    async def main() -> None:
        async with AsyncQueue(sharded_url, name="spread-async") as q:
            await q.put_many([{"payload": n} for n in range(20)])
            msgs: list[Message] = []
            while len(msgs) < 20:
                msgs += await q.reserve(max=20 - len(msgs), wait=1)
            first = msgs[0]
            assert await q.ack_many([first]) == []
            assert await q.ack_many(msgs) == [first.id]
            assert (await q.stats()).total == 0

    asyncio.run(main())


def test_sharded_ack_many_leaves_stale_messages_as_they_were(sharded_url: str) -> None:
    with Queue(sharded_url, name="stale") as q:
        q.put_many([{"payload": n, "id": f"s{n}"} for n in range(6)])
        old = _reserve(q, 6, lease=0.05)
        time.sleep(0.15)
        new = _reserve(q, 6)
        assert sorted(q.ack_many(old)) == sorted(m.id for m in old)
        assert all(q.get(m.id).state is State.ACTIVE for m in new)
        assert q.ack_many(new) == []
