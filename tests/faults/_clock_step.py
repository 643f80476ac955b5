"""A producer and a consumer on one SQLite file in a process whose wall clock steps
back, as the system clock does when it is set back: run as
``python _clock_step.py DATABASE STEP OUTPUT``.

The process's ``time.time`` is replaced, before delayq is imported, by the true clock
plus an offset that jumps from 0 to ``-STEP`` seconds while messages wait (everything
in the process reads the stepped clock, as every process of a host would); the history
is timed on the true clock. It puts messages before and after the step, consumes them
all, and writes the history's calls as JSON to OUTPUT for the test to check.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

TRUE_CLOCK = time.time
OFFSET = [0.0]
time.time = lambda: TRUE_CLOCK() + OFFSET[0]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from delayq.durable import Queue  # noqa: E402
from faults._history import History  # noqa: E402

BEFORE = [(f"before-{n}", 0.4 + 0.05 * n) for n in range(10)]
AFTER = [(f"after-{n}", 0.1 + 0.05 * n) for n in range(10)]


def main(database: str, step: float, output: str) -> None:
    history = History(clock=TRUE_CLOCK)
    with Queue(f"sqlite:///{database}", name="clock") as q:

        def put(id: str, delay: float) -> None:
            with history.call("put", id, delay=delay):
                q.put(id, id=id, delay=delay)

        for id, delay in BEFORE:
            put(id, delay)
        time.sleep(0.2)
        OFFSET[0] = -step  # the clock is set back
        for id, delay in AFTER:
            put(id, delay)
        acked: set[str] = set()
        deadline = TRUE_CLOCK() + step + 10
        while len(acked) < len(BEFORE) + len(AFTER) and TRUE_CLOCK() < deadline:
            with history.call("reserve") as op:
                messages = q.reserve(wait=0.5, max=10, lease=30)
                op.deliver(messages)
            for message in messages:
                with history.call("ack", message.id, token=message.lease):
                    q.ack(message)
                acked.add(message.id)
    Path(output).write_text(json.dumps([asdict(op) for op in history.ops]))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
