"""A purge or a retry of the dead larger than an append (issue 41: a purge of millions
outgrew RabbitMQ's largest message): logged in pieces, each an entry of its own, the
request id and its reply with the last only; a hot standby that folds the pieces and a
cold one that replays them come to the same state as the scheduler that cut them.

On the shared RabbitMQ, each test under a namespace of its own (deleted afterwards).
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
from msgpack import unpackb

from delayq.backends import _records
from delayq.backends._replicated._scheduler import _group_commit, _state
from delayq.durable import Queue, State

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
            # The request id, the reply: on each request's last piece only.
            replies = [op for op in ops if op[2]]
            assert len(replies) == (1 if name == "retry_dead" else 2)
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
