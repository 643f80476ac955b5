"""close(), context managers, and waking a waiting reserve on close."""

from __future__ import annotations

import time
from typing import Any

import pytest

from delayq import QueueClosed

from ._helpers import in_thread


def test_every_call_after_close_raises_queue_closed(make_queue: Any) -> None:
    q = make_queue()
    q.close()
    q.close()  # idempotent
    assert q.closed
    with pytest.raises(QueueClosed):
        q.put("x")
    with pytest.raises(QueueClosed):
        q.reserve(wait=0)
    with pytest.raises(QueueClosed):
        q.stats()
    with pytest.raises(QueueClosed):
        q.get("x")


def test_context_manager_closes(make_queue: Any) -> None:
    with make_queue() as q:
        q.put("x")
    assert q.closed


def test_messages_outlive_a_closed_queue_object(make_queue: Any) -> None:
    first = make_queue(name="outlive")
    first.put("kept", id="k")
    first.close()
    second = make_queue(name="outlive")
    assert second.get("k").payload == "kept"


def test_close_wakes_a_waiting_reserve(make_queue: Any) -> None:
    q = make_queue()
    waiting = in_thread(q.reserve, wait=30)
    time.sleep(0.1)
    q.close()
    with pytest.raises(QueueClosed):
        waiting.result(15)  # at once; a loaded CI machine once took more than 5 s


def test_closing_a_named_sibling_leaves_the_shared_backend_open(make_queue: Any) -> None:
    """``named()`` siblings share the backend of the queue that opened it and do not
    own it: closing one leaves the others (and that queue) working; closing the queue
    that opened the backend closes it under every sibling."""
    root = make_queue()
    first, second = root.named(f"{root.name}-a"), root.named(f"{root.name}-b")
    first.put("a", id="a")
    second.put("b", id="b")
    first.close()
    assert first.closed
    with pytest.raises(QueueClosed):
        first.put("again")
    assert not second.closed
    assert second.get("b").payload == "b"
    second.put("b2", id="b2")
    assert [m.id for m in second.reserve(wait=0, max=5)] == ["b", "b2"]
    root.put("r", id="r")
    assert root.get("r").payload == "r"
    third = root.named(f"{root.name}-a")  # a new sibling of the closed one's queue
    assert third.get("a").payload == "a"
    third.purge()
    second.purge()
    second.close()
    root.put("r2", id="r2")
    assert root.get("r2").payload == "r2"
    root.close()
    with pytest.raises(QueueClosed):
        third.put("after the backend closed")
