"""Crash tests of ``redis://``: a Redis killed with SIGKILL loses nothing it acknowledged.

Each test runs its own ``redis-server`` (:mod:`._redis_server`) with ``appendonly yes``,
``appendfsync always`` and no RDB snapshots, kills it with SIGKILL (no shutdown, no
final rewrite or fsync) and starts it again on the same port and directory, so it
comes back from its append-only file alone.

* A producer process puts messages one by one and prints each id once ``put`` returned;
  the server is killed while it is putting. Every printed id is there after the
  restart, with its payload and due time unchanged.
* Messages reserved and acked before the kill stay gone; messages reserved and not
  acked stay held until their lease expires and then come back (attempt 2, "lease
  expired"), and the lease from before the crash can no longer ack them.

What a SIGKILL shows is a crash of the Redis process; an acknowledged write that a power
loss could still take is one the server wrote but did not fsync, which is what
``appendfsync always`` rules out (fsync before the reply) and cannot be shown here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis")

from delayq import LeaseLost
from delayq.durable import Queue, State

from ._redis_server import RedisProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs kill -9"),
]

#: Every write is in the append-only file, fsynced, before Redis replies; no snapshots.
AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always", "--save", "")
#: How many acknowledged puts come before the kill.
BEFORE_KILL = 300
#: How many more come after the restart (the producer carries on).
AFTER_RESTART = 20
#: Bound for each wait on the producer, in seconds.
PATIENCE = 15.0

_PRODUCER = """
import sys, time
from delayq.durable import Queue

url, base, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
q = Queue(url, name="acked")
for i in range(count):
    try:
        id = q.put(i, at=base + i)  # whole epoch seconds: due_at is exactly (base+i)*1000
    except Exception as exc:
        print("err", i, type(exc).__name__, flush=True)
        time.sleep(0.05)
        continue
    print("ok", id, i, flush=True)  # put() returned: the message is acknowledged
"""


class Lines:
    """The complete lines a process writes to stdout, gathered by a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self._cond = threading.Condition()
        self._lines: list[list[str]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stdout:
            if not line.endswith("\n"):  # cut short by a kill: not a whole report
                break
            with self._cond:
                self._lines.append(line.split())
                self._cond.notify_all()

    def snapshot(self) -> list[list[str]]:
        """Every line read so far, split into words."""
        with self._cond:
            return list(self._lines)

    def count(self, kind: str) -> int:
        """How many lines so far start with ``kind``."""
        return sum(1 for words in self.snapshot() if words[0] == kind)

    def wait_for(self, kind: str, at_least: int, what: str) -> None:
        """Wait until ``at_least`` lines start with ``kind``; fail after :data:`PATIENCE`."""

        def enough() -> bool:
            return sum(1 for words in self._lines if words[0] == kind) >= at_least

        with self._cond:
            if not self._cond.wait_for(enough, PATIENCE):
                pytest.fail(f"timed out waiting for {what}; got {len(self._lines)} lines")

    def close(self) -> None:
        """Wait for the reader to reach the end of the stream (the process ended)."""
        self._thread.join(PATIENCE)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A private server with ``appendfsync always``, stopped afterwards whatever happens."""
    process = RedisProcess(tmp_path, AOF_ALWAYS)
    try:
        process.start()
        yield process
    finally:
        process.stop()


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)


def _server_ms(server: RedisProcess) -> int:
    client = server.client()
    try:
        seconds, micros = client.time()
    finally:
        client.close()
    return int(seconds) * 1000 + int(micros) // 1000


def test_no_acknowledged_put_is_lost_when_redis_is_killed(server: RedisProcess) -> None:
    base = int(time.time()) + 3600
    producer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_PRODUCER), server.url, str(base), "1000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = Lines(producer)
        lines.wait_for("ok", BEFORE_KILL, f"{BEFORE_KILL} acknowledged puts")
        server.kill()  # mid-stream: the producer puts without pause
        acked_before_kill = lines.count("ok")
        lines.wait_for("err", 1, "the producer to meet the dead server")
        server.start()  # same port, same directory: loads the append-only file
        lines.wait_for("ok", acked_before_kill + AFTER_RESTART, "puts after the restart")
    finally:
        _stop(producer)
    lines.close()
    assert producer.stderr is not None
    producer.stderr.close()

    acked = [(words[1], int(words[2])) for words in lines.snapshot() if words[0] == "ok"]
    assert len(acked) >= acked_before_kill + AFTER_RESTART
    missing: list[str] = []
    changed: list[str] = []
    with Queue(server.url, name="acked") as q:
        for id, i in acked:
            message = q.get(id)
            if message is None:
                missing.append(id)
            elif (message.due_at, message.payload, message.state) != (
                (base + i) * 1000,
                i,
                State.SCHEDULED,
            ):
                changed.append(f"{id}: {message}")
        stats = q.stats()
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged puts lost: {missing[:5]}"
    assert not changed, changed[:5]
    # Nothing was stored twice: on top of the acknowledged puts there can only be those
    # that failed (cut off by the kill, maybe stored) and the one in flight when the
    # producer was stopped.
    assert len(acked) <= stats.scheduled <= len(acked) + lines.count("err") + 1


def test_acks_survive_and_held_messages_come_back_after_their_lease(
    server: RedisProcess,
) -> None:
    lease = 3.0
    later = int(time.time()) + 3600
    with Queue(server.url, name="leases") as q:
        q.put_many([{"payload": i, "id": f"m{i}"} for i in range(10)])
        q.put_many([{"payload": i, "id": f"later{i}", "at": later} for i in range(2)])
        reserved = q.reserve(max=10, lease=lease, wait=0)
        assert sorted(m.id for m in reserved) == sorted(f"m{i}" for i in range(10))
        acked, held = reserved[:6], reserved[6:]
        for message in acked:
            q.ack(message)
    lease_until = max(m.lease_expires_at or 0 for m in held)

    server.kill()
    server.start()

    with Queue(server.url, name="leases") as q:
        for message in acked:
            assert q.get(message.id) is None, f"acked {message.id} came back"
        stats = q.stats()
        assert (stats.active, stats.scheduled, stats.ready, stats.dead) == (4, 2, 0, 0)
        for message in held:
            stored = q.get(message.id)
            assert stored is not None
            assert stored.state is State.ACTIVE

        if _server_ms(server) < lease_until - 500:
            assert q.reserve(wait=0) == [], "a held message came back before its lease ended"

        back: list[tuple[str, int, str | None, int]] = []
        deadline = time.monotonic() + lease + PATIENCE
        while len(back) < len(held) and time.monotonic() < deadline:
            for message in q.reserve(max=10, lease=30, wait=1.0):
                back.append((message.id, message.attempts, message.last_error, _server_ms(server)))
                q.ack(message)
        assert sorted(id for id, *_ in back) == sorted(m.id for m in held)
        for id, attempts, error, seen_at in back:
            assert attempts == 2, id
            assert error == "lease expired", id
            assert seen_at >= lease_until, id
        # The lease from before the crash fences nothing any more.
        with pytest.raises(LeaseLost):
            q.ack(held[0])
        for message in acked:
            assert q.get(message.id) is None
        final = q.stats()
        assert (final.active, final.scheduled, final.ready, final.dead) == (0, 2, 0, 0)
