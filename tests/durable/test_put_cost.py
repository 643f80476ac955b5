"""The client's work per message of ``put_many`` and ``App.send_many`` stays where issue 38
left it. Counted as the Python functions called per message (``sys.setprofile``), a
figure the machine's load does not move: before issue 38 a message of ``put_many`` cost
14 calls on ``memory://`` (the facade's ``_request`` wrapper, the serializer's
``dumps`` and two payload checks, the slot setters of its request among them), now 10.
``benchmarks/client_cost.py`` gives the same paths in instructions."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from delayq.durable import Queue
from delayq.runtime import App

BATCH = 1_000


def calls_per_message(run: Callable[[], object]) -> float:
    """Python functions called while ``run()`` handles a batch, per message."""
    calls = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls / BATCH


def test_a_put_many_message_costs_at_most_ten_calls() -> None:
    with Queue("memory://put-cost", name="q") as q:
        q.put_many([{"payload": 0}])  # the queue's store made, the encoder's thread state
        items = [{"payload": {"n": i}} for i in range(BATCH)]
        assert calls_per_message(lambda: q.put_many(items)) < 11
        assert q.stats().total == BATCH + 1


def test_a_send_many_message_costs_at_most_thirteen_calls() -> None:
    with App("memory://send-cost") as app:

        @app.task(queue="t")
        def job(n: int) -> None:
            del n

        app.send_many([job.message(-1)])
        messages = [job.message(i) for i in range(BATCH)]
        assert calls_per_message(lambda: app.send_many(messages)) < 14
        assert app.queue("t").stats().total == BATCH + 1
