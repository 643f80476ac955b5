"""A purge or a retry of the dead larger than an append (issue 41: a purge of millions
outgrew RabbitMQ's largest message): logged in pieces, each an entry of its own, the
request id and its reply with the last only; a hot standby that folds the pieces and a
cold one that replays them come to the same state as the scheduler that cut them.

On the shared RabbitMQ, each test under a namespace of its own (deleted afterwards).
"""

from __future__ import annotations

import concurrent.futures
import logging
import statistics
import threading
import time
from typing import Any

import msgpack
import pytest
from msgpack import unpackb

from delayq.backends import _records
from delayq.backends._far import Far
from delayq.backends._replicated._scheduler import _group_commit, _requests, _state
from delayq.durable import Queue, State
from delayq.errors import DuplicateId

pytest.importorskip("pika")
pytest.importorskip("aiormq")

from . import test_amqp_checkpoint as checkpoint
from .test_amqp_checkpoint import SMALL, events, state_of, stream_messages

base = checkpoint.base

#: The messages of each queue: many times a piece of PIECE bytes, and the pieces of one
#: request many times an append of GROUP bytes.
COUNT = 240
PIECE = 3000
GROUP = 12_000


def logged(url: str, name: str) -> list[list[Any]]:
    """Every operation ``name`` of the namespace's log, in log order."""
    ops: list[list[Any]] = []
    for kind, body in stream_messages(url, "log"):
        if kind == "entry":
            ops += [op for op in msgpack.unpackb(body) if op[0] == name]
    return ops


@pytest.mark.parametrize("standby", ["hot", "cold"])
def test_a_purge_and_a_retry_larger_than_an_append_go_in_pieces_and_replay_whole(
    base: str, standby: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    monkeypatch.setattr(_state, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_requests, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_group_commit, "MAX_GROUP_BYTES", GROUP)
    monkeypatch.setattr(_records, "FAR_ABOVE", 20)  # most of the scheduled go far
    url = f"{base}&retention_bytes={SMALL}"
    first = Queue(url, name="big")
    other = Queue(url.replace("scheduler=on", "scheduler=off"), name="kept")  # no candidate
    with Queue(f"{url}&standby={standby}", name="big") as second:
        payload = "z" * 100
        ids = first.put_many([{"payload": f"d{n} {payload}"} for n in range(COUNT)])
        kept = other.put_many([{"payload": f"k{n}", "delay": 3600} for n in range(30)])
        while dead := first.reserve(max=100, lease=60, wait=0):
            for message in dead:
                first.nack(message, dead=True, error="boom " * 10)
        assert first.stats().dead == COUNT
        assert first.retry_dead() == COUNT  # images of 240 records: many pieces
        assert first.stats().ready == COUNT
        ids += first.put_many(
            [{"payload": f"s{n} {payload}", "delay": 3600 + n} for n in range(COUNT)]
        )
        assert first.purge(State.READY) == COUNT
        assert first.stats().scheduled == COUNT
        assert first.purge() == COUNT  # the scheduled ones, far most of them
        after = first.put({"after": 1}, delay=60)

        for name in ("retry_dead", "purge"):
            ops = logged(url, name)
            assert len(ops) > 3, name
            # The request id, the reply: on each request's last piece only; and on the
            # first piece of a purge that took far records, remembered as under way.
            kinds = [op[7] for op in ops if op[2]]
            assert kinds == (["ok"] if name == "retry_dead" else ["ok", "purging", "ok"])
            assert all(len(msgpack.packb(op)) < 2 * PIECE for op in ops)
        assert sum(len(op[6]) for op in logged(url, "purge")) == 2 * COUNT
        # The pieces leave in appends of about GROUP bytes, not all at once (the broker
        # refuses a message past its largest).
        appends = [
            body
            for kind, body in stream_messages(url, "log")
            if kind == "entry" and any(op[0] in ("purge", "retry_dead") for op in unpackb(body))
        ]
        assert len(appends) > 3
        assert max(len(body) for body in appends) < 2 * GROUP

        before = state_of(first, [*ids, after])
        assert before[0][:4] == (1, 0, 0, 0)
        second.stats()  # the standby is caught up
        first.close()
        assert state_of(second, [*ids, after]) == before
        assert events(caplog, "scheduler_elected")[-1]["standby"] == standby
        assert second.get(after) is not None
        # The request answered again from the log (a resend after a failover): once.
        assert second.purge() == 1
        assert sorted(m.id for m in other.peek(limit=100)) == sorted(kept)
    other.close()


#: Far records a purge takes in the tests below: hundreds of pieces of PIECE bytes.
MANY = 20_000


def fill(queue: Queue, count: int) -> list[str]:
    """``count`` messages due in an hour or more, put in batches (most of them far)."""
    ids: list[str] = []
    for start in range(0, count, 5000):
        batch = range(start, min(start + 5000, count))
        ids += queue.put_many([{"payload": f"f{n}", "delay": 3600 + n} for n in batch])
    return ids


def put_again(queue: Queue, ids: list[str], running: threading.Event) -> list[tuple[str, float]]:
    """Put each of ``ids`` again (``on_conflict="error"``), one at a time, while
    ``running`` is set: ``(id, seconds)`` of each put accepted, its id gone by then."""
    accepted: list[tuple[str, float]] = []
    for id in ids:
        if not running.is_set():
            break
        started = time.monotonic()
        try:
            queue.put({"again": id}, id=id, delay=7200, on_conflict="error")
        except DuplicateId:
            continue  # decided before the purge
        accepted.append((id, time.monotonic() - started))
    return accepted


def test_a_purge_of_many_far_records_lets_the_scheduler_answer_meanwhile(
    base: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The deletions of the far records a purge took are logged a piece at a time while
    the scheduler goes on deciding (a purge of ten million held its loop 35 s, and
    RabbitMQ reset its connection): a put of a purged id, decided after the purge, is
    answered long before the purge is, and it survives the pieces logged after it, in
    this scheduler and in the hot standby that folded them."""
    caplog.set_level(logging.INFO, logger="delayq")
    monkeypatch.setattr(_state, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_requests, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_records, "FAR_ABOVE", 20)
    ids_after = Far.ids_after

    def slow(far: Far, after: str, limit: int) -> list[str]:
        time.sleep(0.01)  # a piece of millions' worth of ids: a put's round trip or more
        return ids_after(far, after, limit)

    url = f"{base}&retention_bytes={SMALL * 40}"
    first = Queue(url, name="big")
    client = Queue(url.replace("scheduler=on", "scheduler=off"), name="big")
    with Queue(f"{url}&standby=hot", name="big") as second:
        ids = fill(first, MANY)
        ready = first.put_many([{"payload": f"r{n}"} for n in range(50)])
        monkeypatch.setattr(Far, "ids_after", slow)
        running = threading.Event()
        running.set()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            putting = pool.submit(put_again, client, ids[::-1], running)
            time.sleep(0.05)  # the puts under way: the first ones meet DuplicateId
            started = time.monotonic()
            assert first.purge() == MANY + 50  # a put decided before it met DuplicateId
            took = time.monotonic() - started
            running.clear()
            accepted = putting.result()
        during = [seconds for _, seconds in accepted]
        # Puts decided after the purge were answered while its pieces were logged, each
        # in a small part of the purge's time (before, each waited for the last piece).
        assert len(accepted) >= 3, (took, accepted)
        assert statistics.median(during) < took / 5, (took, during)
        again = {id for id, _ in accepted}
        assert first.stats().scheduled == len(again)  # only these: the rest purged
        for id in list(again)[:20]:
            message = first.get(id)
            assert message is not None
            assert message.payload == {"again": id}
        kinds = [op[7] for op in logged(url, "purge") if op[2]]
        assert kinds == ["purging", "ok"]
        said = events(caplog, "purge_logged")[-1]
        assert said["purged"] == MANY + 50
        assert said["far"] > MANY - 100  # the rest were in memory
        assert said["pieces"] > 100
        before = state_of(first, [*ids, *ready])
        second.stats()  # caught up
        first.close()
        assert state_of(second, [*ids, *ready]) == before
        assert events(caplog, "scheduler_elected")[-1]["standby"] == "hot"
    client.close()


def test_a_purge_cut_short_by_a_failover_is_finished_by_the_next_scheduler_and_takes_no_more(
    base: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The scheduler stops while a purge's pieces are being logged: its client resends
    the purge to the next scheduler, which purges what the first had taken and not
    logged, and nothing put since (those puts were answered: the queue was purged for
    them), and answers with the purge's count."""
    caplog.set_level(logging.INFO, logger="delayq")
    monkeypatch.setattr(_state, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_requests, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_records, "FAR_ABOVE", 20)
    under_way = threading.Event()
    reads = 0
    ids_after = Far.ids_after

    def counted(far: Far, after: str, limit: int) -> list[str]:
        nonlocal reads
        reads += 1
        if reads == 40:  # some tens of pieces logged
            under_way.set()
        return ids_after(far, after, limit)

    monkeypatch.setattr(Far, "ids_after", counted)
    url = f"{base}&retention_bytes={SMALL * 40}"
    first = Queue(url, name="big")
    client = Queue(url.replace("scheduler=on", "scheduler=off"), name="big")
    with Queue(f"{url}&standby=hot", name="big") as second:
        ids = fill(first, MANY)
        second.stats()  # a candidate, caught up
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            purging = pool.submit(client.purge)
            assert under_way.wait(30)
            # Answered by the first scheduler while it logs the purge's pieces: kept.
            fresh = client.put({"fresh": 1}, delay=7200)
            again = client.put({"again": 1}, id=ids[0], delay=7200, on_conflict="error")
            first.close()
            assert purging.result(timeout=60) == MANY
        kinds = [op[7] for op in logged(url, "purge") if op[2]]
        assert kinds == ["purging", "purging", "ok"]  # taken up again, then done
        assert events(caplog, "scheduler_elected")[-1]["standby"] == "hot"
        assert second.stats().scheduled == 2
        assert {m.id for m in second.peek(limit=10)} == {fresh, again}
        message = second.get(again)
        assert message is not None
        assert message.payload == {"again": 1}
        # Logged whole: a replay comes to the same (a cold scheduler, from the log).
    client.close()
    with Queue(url, name="big") as third:
        assert {m.id for m in third.peek(limit=10)} == {fresh, again}


def test_a_purge_that_outlasts_its_clients_request_timeout_is_answered(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a purge's pieces are logged the scheduler tells its client, every
    FOLDING_EVERY s, that it is at work on it: the client waits a request timeout more
    from each word, and gets the count, rather than ReplyLost at its request timeout
    while the purge goes on (what a purge of millions met)."""
    monkeypatch.setattr(_state, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_requests, "PIECE_BYTES", PIECE)
    monkeypatch.setattr(_requests, "FOLDING_EVERY", 0.2)
    monkeypatch.setattr(_records, "FAR_ABOVE", 20)
    ids_after = Far.ids_after

    def slow(far: Far, after: str, limit: int) -> list[str]:
        time.sleep(0.015)  # a purge of millions: the same, longer
        return ids_after(far, after, limit)

    url = f"{base}&retention_bytes={SMALL * 40}"
    timeout = 0.6
    with Queue(url, name="big") as first:
        fill(first, MANY)
        monkeypatch.setattr(Far, "ids_after", slow)
        client = Queue(
            f"{url.replace('scheduler=on', 'scheduler=off')}&request_timeout={timeout}",
            name="big",
        )
        started = time.monotonic()
        assert client.purge() == MANY
        assert time.monotonic() - started > 3 * timeout
        client.close()
