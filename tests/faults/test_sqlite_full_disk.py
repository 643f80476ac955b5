"""Scenario 4 for SQLite: the disk under the database fills up, on both faces.

The database lives on a tmpfs of 1 MiB mounted by the test; a file of the test's own
then takes every free byte. A put fails with SQLite's own error ("database or disk is
full") and stores nothing, a batch stores none of its messages, the file stays intact
and readable (reads answer, ``PRAGMA integrity_check`` says ok), and once the file is
removed puts succeed again and every message is delivered.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from ._disk import fill
from ._faces import FACES, Face

pytestmark = pytest.mark.timeout(60)

PAYLOAD = "x" * 20_000


def _intact(database: Path) -> list[str]:
    """The ids stored, read by a connection of its own after an integrity check."""
    connection = sqlite3.connect(database)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return sorted(row[0] for row in connection.execute("SELECT id FROM delayq_messages"))
    finally:
        connection.close()


@pytest.mark.parametrize("face", FACES)
def test_a_full_disk_refuses_puts_whole_keeps_the_file_and_recovers(
    face: str, small_disk: Path
) -> None:
    database = small_disk / "queue.db"
    filler = small_disk / "filler"
    before = [f"before-{n}" for n in range(3)]

    async def main() -> None:
        q = Face(face, f"sqlite:///{database}", "disk")
        try:
            for id in before:
                await q.call("put", PAYLOAD, id=id)
            fill(filler)
            with pytest.raises(sqlite3.OperationalError, match="full"):
                await q.call("put", PAYLOAD, id="refused")
            batch = [{"payload": PAYLOAD, "id": f"batch-{n}"} for n in range(5)]
            with pytest.raises(sqlite3.OperationalError, match="full"):
                await q.call("put_many", batch)
            # Nothing of them was stored, and the queue still reads.
            assert await q.call("get", "refused") is None
            assert all([await q.call("get", item["id"]) is None for item in batch])
            assert (await q.call("stats")).ready == len(before)
            assert [m.id for m in await q.call("peek")] == before
            assert _intact(database) == before
            # Space again: puts succeed, and everything stored is delivered.
            filler.unlink()
            await q.call("put", PAYLOAD, id="after")
            delivered = await q.call("reserve", wait=0, max=10)
            assert [m.id for m in delivered] == [*before, "after"]
            assert await q.call("ack_many", delivered) == []
        finally:
            await q.close()

    asyncio.run(main())
    assert _intact(database) == []
