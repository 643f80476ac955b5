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
        waiting.result(5)
