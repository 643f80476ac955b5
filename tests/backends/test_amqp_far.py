"""``amqp://`` with most of its backlog far (issue 41, point 1): the scheduler keeps the
earliest messages in memory and the later ones in a private SQLite database of its
process (``delayq.backends._far``), here past 20 waiting instead of 50,000. Everything a
user sees is as if all were in memory: stats, pages, gets, cancels and reschedules by
id, claims at their time in their order, once each; and a hot standby that folds the
same log far as well takes over with the same state, from a checkpoint that walked the
far records too.

On the shared RabbitMQ, each test under a namespace of its own (deleted afterwards).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from delayq.backends import _far, _records
from delayq.backends._replicated._scheduler._journal import Journal, image_bytes
from delayq.durable import Message, Queue, State
from delayq.durable.message import Now, put_request

pytest.importorskip("pika")
pytest.importorskip("aiormq")

from . import test_amqp_checkpoint as checkpoint
from .test_amqp_checkpoint import SMALL, events, state_of

#: A namespace of its own on the shared RabbitMQ (the checkpoint tests' fixture).
base = checkpoint.base

COUNT = 300


@pytest.fixture
def far_adds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records go far past 20 waiting; the count of those sent there, by every
    scheduler of this process."""
    monkeypatch.setattr(_records, "FAR_ABOVE", 20)
    added = [0]
    add = _far.Far.add

    def counted(self: _far.Far, record: Any) -> None:
        added[0] += 1
        add(self, record)

    monkeypatch.setattr(_far.Far, "add", counted)
    return added


def test_a_backlog_mostly_far_is_seen_and_claimed_as_if_in_memory(
    base: str, far_adds: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    url = f"{base}&retention_bytes={SMALL}"
    with Queue(url, name="far") as queue:
        # Due over six seconds from two seconds on, 20 ms apart: seven one-second buckets.
        ids = queue.put_many(
            [{"payload": f"m{n} " + "x" * 200, "delay": 2.0 + 0.02 * n} for n in range(COUNT)]
        )
        assert far_adds[0] >= COUNT // 2  # most went far
        assert queue.stats().scheduled == COUNT
        pages: list[Message] = []
        after = None
        while page := queue.peek(limit=37, after=after):
            pages += page
            after = (page[-1].due_at, page[-1].seq or 0)
        assert [m.id for m in pages] == ids
        for n in range(0, COUNT, 10):
            got = queue.get(ids[n])
            assert got is not None
            assert got.payload == f"m{n} " + "x" * 200
        # The latest ones: far, found there by id.
        cancelled = set(ids[-30:-15])
        assert all(queue.cancel(id) for id in cancelled)
        moved = ids[-15:]
        assert all(queue.reschedule(id, delay=0) for id in moved)
        stats = queue.stats()
        assert stats.scheduled + stats.ready == COUNT - len(cancelled)
        order = [m.id for m in pages if m.id not in cancelled and m.id not in moved]
        assert order == [id for id in ids if id not in cancelled and id not in moved]
        # Claimed at their time, each once, in due order: the rescheduled ones first.
        received: list[Message] = []
        give_up = time.monotonic() + 60
        while len(received) < COUNT - len(cancelled):
            assert time.monotonic() < give_up, len(received)
            for message in queue.reserve(max=25, wait=1, lease=60):
                assert message.due_at <= time.time() * 1000 + 1
                received.append(message)
                queue.ack(message)
        # (Unless the machine is slow enough that the first ones fell due before the
        # reschedules: then in due order all the same.)
        assert sorted(m.id for m in received) == sorted(moved + order)
        assert [(m.due_at, m.seq) for m in received] == sorted((m.due_at, m.seq) for m in received)
        assert [m.id for m in received if m.id in moved] == moved
        assert queue.stats().scheduled == queue.stats().ready == 0
        assert queue.get(ids[-20]) is None
    assert not events(caplog, "scheduler_stopped")


@pytest.mark.parametrize("standby", ["hot", "cold"])
def test_the_next_scheduler_takes_over_with_the_same_state(
    base: str, standby: str, far_adds: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """Hot: it folded the log as it grew, far as well. Cold: it replays from the last
    checkpoint's pointer, whose images the scheduler walked out of memory and far."""
    caplog.set_level(logging.INFO, logger="delayq")
    url = f"{base}&retention_bytes={SMALL}"
    first = Queue(url, name="far")
    with Queue(f"{url}&standby={standby}", name="far") as second:
        ids: list[str] = []
        for round in range(8):
            # An hour ahead, each round over 50 seconds; some replaced, cancelled and
            # rescheduled once far, and puts that fill the log past checkpoints.
            ids += first.put_many(
                [
                    {"payload": f"{round}-{n} " + "y" * 300, "delay": 3600 + round * 60 + n}
                    for n in range(50)
                ]
            )
            for again in range(3):  # the log grows past the live records: checkpoints
                first.put_many(
                    [
                        {
                            "id": id,
                            "payload": f"{round}-{n}-{again} " + "y" * 300,
                            "delay": 3600 + round * 60 + n,
                            "on_conflict": "replace",
                        }
                        for n, id in enumerate(ids[-50:])
                    ]
                )
            first.put({"replaced": round}, id=ids[-1], on_conflict="replace", delay=7200)
            assert first.cancel(ids[-2])
            assert first.reschedule(ids[-3], delay=1800)
        assert far_adds[0] > 0
        before = state_of(first, ids)
        assert events(caplog, "checkpoint_written")
        second.stats()  # the standby is caught up
        first.close()
        assert state_of(second, ids) == before
        elected = events(caplog, "scheduler_elected")[-1]
        assert elected["standby"] == standby
        if standby == "cold":
            assert elected["start"] > 0  # from a checkpoint, not the log's first entry
        page = second.peek(limit=1000)
        assert len(page) == 8 * 49
        assert page[0].id == ids[47]  # the first round's, rescheduled to half an hour
        second.purge()
        assert second.stats().scheduled == 0


def test_the_live_bytes_stay_those_of_the_records_far_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the scheduler weighs a put against (a quarter of the retention) and starts
    checkpoints by: the images' bytes of every live record, through records sent far,
    brought back, replaced, cancelled, and a purge that takes far's rows unread."""
    monkeypatch.setattr(_records, "FAR_ABOVE", 20)
    store = Journal()
    now = Now(1_700_000_000_000, 1_700_000_000_000)

    def weighed() -> int:
        every = [*store.records.values(), *(store.far or ())]
        return sum(image_bytes(r.id, r.payload, r.headers, r.last_error) for r in every)

    requests = [
        put_request(f"w{n}", b"p" * (n % 50), "bytes", 5, {}, 1000 * n, None, "replace", False)
        for n in range(200)
    ]
    store.put(requests, now)
    assert store.far is not None
    assert store.far.count > 100
    assert store.size == weighed()
    store.put(requests[::3], now)  # replaced, far ones among them
    for n in range(0, 200, 7):
        store.cancel(f"w{n}", now)
    assert store.size == weighed()
    store.claim(Now(now.floor + 60_000, now.floor + 60_000), 30, 1000)  # brought back
    assert store.size == weighed()
    store.purge(State.SCHEDULED, now)
    assert store.far.count == 0
    assert store.size == weighed()


def test_a_replay_over_far_records_comes_to_the_state_of_one_all_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hot standby's fold (``Journal.restore``) of puts, of the same images logged again
    (a checkpoint's), of replacements and deletes: with most records far, the same
    records, live bytes and stats as with all in memory; and a far record replaced is
    read once, not once more by the write that replaces it."""
    now = Now(1_700_000_000_000, 1_700_000_000_000)
    scratch = Journal()
    entries: list[tuple[list[Any], list[str], int]] = []
    requests = [
        put_request(f"r{n}", b"p" * (n % 40), "bytes", 5, {}, 1000 * n, None, "replace", False)
        for n in range(300)
    ]
    for at in range(0, 300, 50):
        scratch.put(requests[at : at + 50], now)
        entries.append((*scratch.take_changes(), scratch.last_seq))
    entries += entries[:3]  # logged again, as a checkpoint rolls them forward
    scratch.put(requests[::7], now)  # replaced
    entries.append((*scratch.take_changes(), scratch.last_seq))
    for n in range(0, 300, 11):
        scratch.cancel(f"r{n}", now)
    entries.append((*scratch.take_changes(), scratch.last_seq))

    reads = [0]
    get = _far.Far.get

    def counted(self: _far.Far, id: str) -> Any:
        reads[0] += 1
        return get(self, id)

    monkeypatch.setattr(_far.Far, "get", counted)

    def folded(far_above: int) -> Journal:
        monkeypatch.setattr(_records, "FAR_ABOVE", far_above)
        journal = Journal()
        reads[0] = 0
        for images, deletes, last_seq in entries[:-1]:
            journal.restore(images, deletes, last_seq)
        assert reads[0] == 0  # a far record replaced: read once, with its batch
        journal.restore(*entries[-1])  # the deletes read what they delete, far or not
        return journal

    far = folded(20)
    assert far.far is not None
    assert far.far.count > 100
    memory = folded(1_000_000)
    assert memory.far is not None
    assert memory.far.count == 0
    ids = [f"r{n}" for n in range(300)]
    assert [far.find(id) for id in ids] == [memory.find(id) for id in ids]
    assert far.size == memory.size == scratch.size
    assert len(far) == len(memory) == len(scratch)
    assert far.stats(now) == memory.stats(now)


def test_a_purge_sets_its_far_records_aside_and_keeps_the_newer_ones_when_resumed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A purge's far records leave every read at once, set aside for the scheduler to
    log their deletion; a purge resumed after a failover (``through``: the sequence
    number it was decided at) takes only those up to it, and those it keeps are found
    by a walk of every record under way (a checkpoint's), as any brought back."""
    monkeypatch.setattr(_records, "FAR_ABOVE", 20)
    now = Now(1_700_000_000_000, 1_700_000_000_000)
    store = Journal()
    old = [
        put_request(f"o{n}", b"p", "bytes", 5, {}, 3_600_000 + n, None, "replace", False)
        for n in range(200)
    ]
    store.put(old, now)
    through = store.last_seq
    new = [
        put_request(f"n{n}", b"p", "bytes", 5, {}, 7_200_000 + n, None, "replace", False)
        for n in range(50)
    ]
    store.put(new, now)
    assert store.far is not None
    assert store.far.count > 200
    store.take_changes()
    newer_far = {r.id for r in store.far} & {f"n{n}" for n in range(50)}
    assert newer_far
    store.watch()
    assert store.purge(None, now, through) == 200
    assert len(store.aside) == 1
    assert store.aside[0].count > 150  # their deletions to log
    assert sorted(r.id for r in store.peek(None, 1000, None, now)) == sorted(
        f"n{n}" for n in range(50)
    )
    assert store.unwatch() >= newer_far  # moved out of far: the walk logs them too
    images, deletes = store.take_changes()
    assert not images
    assert len(deletes) == 200 - store.aside[0].count  # those in memory
    # A put of a purged id whose deletion is not logged yet: never logged deleted.
    store.put([old[0]], now)
    store.put([old[199]], now)
    assert {"o0", "o199"}.isdisjoint(set(store.aside[0].ids_after("", 1000)))
    assert store.size == sum(
        image_bytes(r.id, r.payload, r.headers, r.last_error)
        for r in [*store.records.values(), *(store.far or ())]
    )
    store.close()
