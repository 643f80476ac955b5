"""Scenario 4 for Redis: the filesystem under Redis's append-only file fills up.

Redis runs with its data directory on a tmpfs of 1 MiB mounted by the test, which a
file of the test's own then fills. What the client sees depends on ``appendfsync``:

* ``everysec``: Redis refuses every script that writes (``MISCONF Errors writing to the
  AOF file``, a ``redis.ResponseError``: nothing ran), reads still answer, and once
  space is freed writes are accepted again, without a restart;
* ``always``: Redis exits at the first failed write (it cannot keep its promise), so
  the put in flight raises ``OutcomeUnknown`` and the next calls find no server.

Either way every acknowledged put is there after a ``kill -9`` and a restart.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from backends._redis_server import RedisProcess
from delayq.errors import OutcomeUnknown

from ._disk import fill
from ._faces import FACES, OUTAGE, Face

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

PAYLOAD = "x" * 20_000


def _server(directory: Path, fsync: str) -> RedisProcess:
    server = RedisProcess(directory, ("--appendonly", "yes", "--appendfsync", fsync, "--save", ""))
    server.start()
    return server


async def _stored(url: str, ids: list[str]) -> list[str]:
    """Which of ``ids`` the server at ``url`` holds."""
    q = Face("async", url, "aof")
    try:
        return [id for id in ids if await q.call("get", id) is not None]
    finally:
        await q.close()


@pytest.mark.parametrize("face", FACES)
def test_appendfsync_everysec_refuses_writes_while_full_and_takes_them_after(
    face: str, small_disk: Path
) -> None:
    server = _server(small_disk, "everysec")
    acknowledged: list[str] = []
    refused: list[str] = []

    async def main() -> None:
        q = Face(face, server.url, "aof")
        try:
            for n in range(3):
                await q.call("put", PAYLOAD, id=f"before-{n}")
                acknowledged.append(f"before-{n}")
            fill(small_disk / "filler")
            errors = []
            # The first puts may still be acknowledged: Redis buffers them, and while
            # its background fsync runs (a loaded machine's bio thread waits for a CPU)
            # it postpones the write that fails by up to 2 s. Then it refuses them all.
            deadline = time.monotonic() + 10
            n = 0
            while len(refused) < 3:
                assert time.monotonic() < deadline, f"no write refused: {acknowledged}"
                try:
                    await q.call("put", PAYLOAD, id=f"full-{n}")
                    acknowledged.append(f"full-{n}")
                    assert not refused, "a write taken after one was refused"
                except redis.ResponseError as exc:
                    errors.append(str(exc))
                    refused.append(f"full-{n}")
                n += 1
                await asyncio.sleep(0.2)  # at most ~10 buffered: they fit once freed
            assert all(error.startswith("MISCONF") for error in errors), errors
            assert await q.call("get", "before-0") is not None  # reads answer
            (small_disk / "filler").unlink()
            deadline = time.monotonic() + 10
            while True:  # Redis tries its write again every second or so
                try:
                    await q.call("put", "after", id="after")
                    acknowledged.append("after")
                    break
                except redis.ResponseError:
                    assert time.monotonic() < deadline, "writes still refused"
                    await asyncio.sleep(0.2)
        finally:
            await q.close()

    try:
        asyncio.run(main())
        server.kill()
        server.start()
        assert asyncio.run(_stored(server.url, acknowledged + refused)) == acknowledged
    finally:
        server.stop()


def test_appendfsync_always_stops_redis_at_the_first_failed_write(small_disk: Path) -> None:
    server = _server(small_disk, "always")
    acknowledged = [f"before-{n}" for n in range(3)]

    async def main() -> None:
        q = Face("async", server.url, "aof")
        try:
            for id in acknowledged:
                await q.call("put", PAYLOAD, id=id)
            fill(small_disk / "filler")
            with pytest.raises(OutcomeUnknown):
                await q.call("put", PAYLOAD, id="full")
            with pytest.raises(OUTAGE):
                await q.call("put", PAYLOAD, id="down")
        finally:
            await q.close()

    try:
        asyncio.run(main())
        assert server.process is not None
        assert server.process.wait(10) != 0  # it exited on its own
        server.process = None
        (small_disk / "filler").unlink()
        server.start()
        assert asyncio.run(_stored(server.url, [*acknowledged, "down"])) == acknowledged
    finally:
        server.stop()
