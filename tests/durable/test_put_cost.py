"""The client's work per message of ``put_many`` and ``App.send_many`` stays where issue 38
left it. Counted as the Python functions called per message (``sys.setprofile``), a
figure the machine's load does not move: before issue 38 a message of ``put_many`` cost
14 calls on ``memory://`` (the facade's ``_request`` wrapper, the serializer's
``dumps`` and two payload checks, the slot setters of its request among them), then 10,
now 8 (its id drawn with the batch's, its request built by the batch's loop); a
message of ``App.send_many`` 12, then 9 (its item built by send_many itself), now 8
(its envelope written from its task's fixed text by the codec itself, no call of the
JSON encoder's wrapper).
``benchmarks/client_cost.py`` gives the same paths in instructions.

Each count runs in a process of its own, as a user's program with no tracer provider:
the suite's process may hold the tracing tests' provider (set once a process), and a
put then makes its spans, which are not this figure."""

from __future__ import annotations

import json
import subprocess
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


def put_many_figures() -> tuple[float, int]:
    """(calls per message of a ``put_many`` of BATCH, the messages stored)."""
    with Queue("memory://put-cost", name="q") as q:
        q.put_many([{"payload": 0}])  # the queue's store made, the encoder's thread state
        items = [{"payload": {"n": i}} for i in range(BATCH)]
        calls = calls_per_message(lambda: q.put_many(items))
        return calls, q.stats().total


def send_many_figures() -> tuple[float, int]:
    """(calls per message of an ``App.send_many`` of BATCH, the messages stored)."""
    with App("memory://send-cost") as app:

        @app.task(queue="t")
        def job(n: int) -> None:
            del n

        app.send_many([job.message(-1)])
        messages = [job.message(i) for i in range(BATCH)]
        calls = calls_per_message(lambda: app.send_many(messages))
        return calls, app.queue("t").stats().total


FIGURES = {"put_many": put_many_figures, "send_many": send_many_figures}


def in_own_process(name: str) -> tuple[float, int]:
    done = subprocess.run(
        [sys.executable, __file__, name], capture_output=True, text=True, check=True, timeout=60
    )
    calls, total = json.loads(done.stdout)
    return float(calls), int(total)


def test_a_put_many_message_costs_at_most_eight_calls() -> None:
    calls, total = in_own_process("put_many")
    assert calls < 9
    assert total == BATCH + 1


def test_a_send_many_message_costs_at_most_eight_calls() -> None:
    calls, total = in_own_process("send_many")
    assert calls < 9
    assert total == BATCH + 1


if __name__ == "__main__":
    print(json.dumps(FIGURES[sys.argv[1]]()))
