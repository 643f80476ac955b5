"""The sync face of ``amqp://`` in a forked child (a pre-fork server, a
``multiprocessing`` worker under the fork start method): the child's first call starts
a link of its own, the parent's connection is left alone, and the parent (here the
elected scheduler) goes on serving both."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from delayq.durable import Queue

pytest.importorskip("aiormq")

from conformance.conftest import amqp_url


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    yield from amqp_url(tmp_path)


def _child(q: Queue) -> int:
    """The child's work with its parent's queue object: 0 when all went as expected."""
    q.put("from the child", id="child")
    got = q.reserve(max=10, wait=10)
    for message in got:
        q.release(message)
    q.close()
    return 0 if sorted(m.id for m in got) == ["before", "child"] else 2


def test_a_forked_child_uses_the_queue_and_leaves_its_parent_working(url: str) -> None:
    with Queue(url, name="jobs") as q:
        q.put("before", id="before")
        assert q.get("before") is not None  # connected: this process is the scheduler
        pid = os.fork()
        if pid == 0:
            status = 1
            signal.alarm(30)  # a child that hangs (a dead loop thread) dies of it
            try:
                status = _child(q)
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's connection and scheduler are untouched by the child.
        got = q.reserve(max=10, wait=10)
        assert sorted(m.id for m in got) == ["before", "child"]
        assert q.ack_many(got) == []
        q.put("after", id="after")
        assert q.get("after") is not None


def test_a_queue_closed_before_the_fork_stays_closed_in_the_child(url: str) -> None:
    q = Queue(url, name="jobs")
    q.put("x")
    q.close()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            q.put("y")
        except Exception as exc:  # the child reports what it got
            status = 0 if type(exc).__name__ == "QueueClosed" else 3
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
