"""The replicated scheduler's dedup table, bounded by age as well as by size (no broker:
the log in memory, as in test_replay_log.py; tests/backends/test_amqp_dedup.py has the
same on RabbitMQ). A resent request must be answered once, never applied twice, for as
long as a copy of it can come: an entry goes once it is older than the window by the
log's time, never in a reign's first window (whatever the log's times say), and only
once a marker appended to the intake after it aged is read back (a fast put's copies
come through the intake, folded late by a successor). Old checkpoints, whose entries
carry no time, still replay; new ones carry the table in chunks after their begin."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from delayq.backends._replicated._codec import pack, unpack
from delayq.backends._replicated._scheduler import Scheduler, _checkpoints, _dedup
from delayq.backends._replicated._transport import Delivery

from .test_replay_log import HOUR, NOW, T0, Lineage, Log, LogTransport

#: The window and the rounds the tests run with (seconds): short, so that they wait it.
WINDOW = 0.4
ROUND = 0.02


@pytest.fixture(autouse=True)
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_dedup, "DEDUP_WINDOW", WINDOW)
    monkeypatch.setattr(_dedup, "DEDUP_PRUNE_EVERY", ROUND)


class Marking(LogTransport):
    """:class:`LogTransport` with an intake that reads back each marker appended to it
    once the test lets it (``hold``: kept until :meth:`release`)."""

    def __init__(self, log: Log) -> None:
        super().__init__(log)
        self.on_marker: Callable[[bytes], None] | None = None
        self.hold = False
        self.held: list[bytes] = []

    async def tail_intake(self, start: Any, on_put: Any, on_marker: Any, on_gap: Any) -> None:
        self.on_marker = on_marker

    async def mark_intake(self, body: bytes) -> None:
        self.held.append(body)
        if not self.hold:
            self.release()

    def release(self) -> None:
        held, self.held = self.held, []
        assert self.on_marker is not None
        for body in held:
            asyncio.get_running_loop().call_soon(self.on_marker, body)


async def elected(log: Log, wall: float) -> tuple[Scheduler, Marking]:
    transport = Marking(log)
    scheduler = Scheduler(transport, lambda: None, wall=lambda: wall)
    await asyncio.wait_for(scheduler.run(), 10)
    return scheduler, transport


async def ask(transport: Marking, op: str, args: list[Any], request_id: str) -> tuple[str, Any]:
    assert transport.on_request is not None
    transport.on_request(Delivery(op, request_id, "client", pack(args)))
    for _ in range(1000):
        if request_id in transport.replies:
            break
        await asyncio.sleep(0)
    kind, body = transport.replies.pop(request_id)
    return kind, unpack(body)


def other_put(id: str) -> list[Any]:
    """A put's arguments (another message than the logged request's)."""
    return ["q", [[id, b"other", "bytes", 3, {}, 0, None, "ignore"]]]


def test_an_entry_goes_after_the_window_and_a_read_marker_never_in_the_reigns_first() -> None:
    """A put logged an hour before the successor's election (a failover after an hour
    with no scheduler): its resend is answered from the table during the reign's first
    window, although the log's time says it is an hour old; past the window, its entry
    waits for the intake's marker to be read back, then goes, and the log says so: the
    next scheduler's replay (a hot standby's fold) drops it too."""
    log = Log()
    first = Lineage(log)
    put = first.op("put", "q", ["a", 0])
    first.write(put)

    async def main() -> None:
        scheduler, transport = await elected(log, (T0 + HOUR) / 1000)
        transport.hold = True
        try:
            for _ in range(3):  # rounds pass, within the reign's first window
                assert await ask(transport, "put", other_put("z1"), put[2]) == ("ok", [])
                await asyncio.sleep(WINDOW / 4)
            assert put[2] in scheduler._dedup
            await asyncio.sleep(WINDOW / 2)  # past the window: a marker is on its way
            assert transport.held, "no marker appended"
            assert put[2] in scheduler._dedup, "dropped before the intake's marker was read"
            assert await ask(transport, "put", other_put("z2"), put[2]) == ("ok", [])
            transport.release()
            await asyncio.sleep(ROUND)
            assert put[2] not in scheduler._dedup
            kind, got = await ask(transport, "get", ["q", "z1"], "read")
            assert (kind, got) == ("ok", None)  # no resend was applied
        finally:
            scheduler.stop()
        successor, _ = await elected(log, (T0 + HOUR) / 1000)
        try:
            assert put[2] not in successor._dedup
        finally:
            successor.stop()

    asyncio.run(main())


def test_entries_of_an_old_checkpoint_carry_its_time_and_go_after_the_window() -> None:
    """A checkpoint written before the entries carried their time (three fields): it
    replays, each entry taken as decided at the begin's last time; a resend is answered
    from it, and it goes once the window has passed."""
    log = Log()
    first = Lineage(log)
    old = first.op("put", "q", ["old", 0])
    first.write(old)
    checkpoint, offset = first.checkpoint()
    first.point(checkpoint, offset)
    log.drop_before(offset)

    async def main() -> None:
        scheduler, transport = await elected(log, NOW.floor / 1000)
        try:
            assert scheduler._dedup[old[2]][2] == T0  # the begin's last_now
            assert await ask(transport, "put", other_put("z"), old[2]) == ("ok", [])
            # Gone past the window, once a round's marker is read back: waited for, since
            # a loaded machine delays the rounds' timers (0.5 s was once too short).
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WINDOW + 10
            while old[2] in scheduler._dedup:
                assert loop.time() < deadline, "the entry never went"
                await asyncio.sleep(ROUND)
        finally:
            scheduler.stop()

    asyncio.run(main())


def test_a_checkpoint_carries_the_table_in_chunks_with_each_entrys_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scheduler's checkpoint: a small begin, then the table's entries a chunk to an
    operation, each with the time it was decided at; a successor that replays from it
    answers every resend from the table and keeps those times."""
    monkeypatch.setattr(_checkpoints, "DEDUP_CHUNK", 3)
    log = Log()
    ids = [f"put-{n}" for n in range(7)]

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        scheduler, transport = await elected(log, NOW.floor / 1000)
        try:
            for n, request_id in enumerate(ids):
                request = [f"m{n}", b"x", "bytes", 3, {}, HOUR, None, "ignore"]
                assert (await ask(transport, "put", ["q", [request]], request_id))[0] == "ok"
            monkeypatch.setattr(_checkpoints, "CHECKPOINT_ENTRIES", 1)
            assert (await ask(transport, "cancel", ["q", "m0"], "cancel"))[0] == "ok"
            for _ in range(500):
                if log.pointer is not None:
                    break
                await asyncio.sleep(0.01)
            assert log.pointer is not None, "no checkpoint"
            table = {id: entry for id, entry in scheduler._dedup.items() if id in ids}
        finally:
            scheduler.stop()
        successor, transport = await elected(log, NOW.floor / 1000 + 1)
        try:
            kept = {id: entry for id, entry in successor._dedup.items() if id in ids}
            for request_id in ids:
                assert await ask(transport, "put", other_put("z"), request_id) == ("ok", [])
        finally:
            successor.stop()
        return table, kept

    table, kept = asyncio.run(main())
    assert kept == table
    assert sorted(table) == sorted(ids)
    assert {entry[2] for entry in table.values()} == {NOW.floor}
    ops = [op for entry in log.entries if entry.kind == "entry" for op in unpack(entry.body)]
    begins = [op for op in ops if op[0] == "checkpoint-begin"]
    assert begins
    assert all(unpack(op[8])[4] == [] for op in begins), "the table rode in the begin"
    chunks = [unpack(op[8]) for op in ops if op[0] == "checkpoint-dedup"]
    assert chunks
    assert max(len(chunk) for chunk in chunks) <= 3
    assert sum(len(chunk) for chunk in chunks) >= len(ids)
    assert all(len(entry) == 4 and entry[3] == NOW.floor for c in chunks for entry in c)
