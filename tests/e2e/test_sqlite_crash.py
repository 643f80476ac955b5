"""Crash tests of ``sqlite:///``: processes killed with SIGKILL lose nothing.

* a consumer killed while holding messages: they come back once the lease expires;
* a producer killed in the middle of ``put_many``'s transaction: the batch is all
  there or not at all, and the file is sound;
* after a restart every message put before is there with its due time.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from delayq.durable import Queue

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs kill -9")


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """Start ``code`` in a fresh interpreter, its stdout readable line by line."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_9(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` and reap it."""
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def expect_line(proc: subprocess.Popen[str], expected: str) -> str:
    """Read the next line of ``proc``; fail with its stderr if it is not ``expected``."""
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith(expected):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"expected {expected!r}, got {line!r}; stderr:\n{err}")
    return line


def integrity(path: Path) -> str:
    """``PRAGMA integrity_check`` of the file (``"ok"`` when sound)."""
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def test_a_killed_consumer_loses_none_of_its_messages(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    lease = 1.0
    with Queue(url, name="work") as q:
        ids = q.put_many([{"payload": i, "id": f"m{i}"} for i in range(20)])
        consumer = spawn(
            """
            import sys, time
            from delayq.durable import Queue
            q = Queue(sys.argv[1], name="work")
            held = q.reserve(max=15, lease=float(sys.argv[2]), wait=5)
            print("held", max(m.lease_expires_at for m in held), flush=True)
            time.sleep(600)
            """,
            url,
            str(lease),
        )
        lease_until = int(expect_line(consumer, "held").split()[1])
        kill_9(consumer)

        assert q.stats().active == 15
        seen: Counter[str] = Counter()
        late: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(ids) and time.monotonic() < deadline:
            for message in q.reserve(max=20, wait=2):
                seen[message.id] += 1
                if message.attempts == 2:  # one of the 15 the consumer held
                    late.append(int(time.time() * 1000))
                    assert message.last_error == "lease expired"
                q.ack(message)
        assert set(seen) == set(ids)
        assert max(seen.values()) == 1
        assert len(late) == 15
        assert min(late) >= lease_until  # not before the lease expired
        assert q.stats().total == 0


_FROZEN_PRODUCER = """
import sys, time
from delayq.backends.sqlite import _connection
from delayq.durable import Queue

# Observation hook only: once a put_many transaction has written part of its batch,
# say so and freeze, so the parent's SIGKILL lands inside the transaction.
opened = _connection.Pool._open
calls = [0]

def open_and_watch(pool):
    conn = opened(pool)

    def progress():
        if conn.in_transaction:
            calls[0] += 1
            if calls[0] == 1500:
                print("frozen", flush=True)
                time.sleep(600)
        return 0

    conn.set_progress_handler(progress, 1000)
    return conn

_connection.Pool._open = open_and_watch
q = Queue(sys.argv[1], name="batch")
size = int(sys.argv[2])
print("ids", q.put("before the batch", id="before"), flush=True)
q.put_many([{"payload": {"n": i, "pad": "x" * 1000}, "id": f"b{i}"} for i in range(size)])
print("committed", flush=True)
"""


def test_a_producer_killed_mid_put_many_leaves_all_or_nothing(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    url = f"sqlite:///{path}"
    size = 20_000  # big enough for SQLite to spill uncommitted pages to the WAL
    producer = spawn(_FROZEN_PRODUCER, url, str(size))
    expect_line(producer, "ids")
    expect_line(producer, "frozen")
    kill_9(producer)

    assert integrity(path) == "ok"
    with Queue(url, name="batch") as q:
        stats = q.stats()
        assert q.get("before") is not None
        assert stats.total == 1  # none of the batch
        q.put_many([{"payload": i, "id": f"b{i}"} for i in range(size)])
        assert q.stats().total == size + 1


def test_a_producer_killed_between_batches_leaves_whole_batches(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    url = f"sqlite:///{path}"
    size = 2_000
    producer = spawn(
        """
        import sys
        from delayq.durable import Queue
        q = Queue(sys.argv[1], name="batches")
        size = int(sys.argv[2])
        for k in range(1_000_000):
            q.put_many([{"payload": i, "id": f"{k}-{i}"} for i in range(size)])
            print("committed", k, flush=True)
        """,
        url,
        str(size),
    )
    for _ in range(3):
        expect_line(producer, "committed")
    time.sleep(0.05)
    kill_9(producer)

    assert integrity(path) == "ok"
    with Queue(url, name="batches") as q:
        counts: Counter[str] = Counter()
        while messages := q.reserve(max=1000, wait=0):
            for message in messages:
                counts[message.id.split("-")[0]] += 1
                q.ack(message)
    assert len(counts) >= 3
    assert set(counts.values()) == {size}


def test_messages_survive_a_killed_process_with_their_due_times(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    producer = spawn(
        """
        import json, sys, time
        from delayq.durable import Queue
        q = Queue(sys.argv[1], name="durable")
        ids = [q.put({"i": i}, delay=delay) for i, delay in enumerate([0, 0.5, 60, 86400])]
        ids += q.put_many([{"payload": i, "at": time.time() + 3600 * i} for i in range(5)])
        held = q.reserve(wait=0)
        due = {id: q.get(id).due_at for id in ids}
        print(json.dumps({"due": due, "held": [m.id for m in held]}), flush=True)
        time.sleep(600)
        """,
        url,
    )
    assert producer.stdout is not None
    before = json.loads(producer.stdout.readline())
    kill_9(producer)

    with Queue(url, name="durable") as q:
        for id, due_at in before["due"].items():
            message = q.get(id)
            assert message is not None, id
            if id in before["held"]:
                assert message.attempts == 1  # reserved once, its lease still runs
            else:
                assert message.due_at == due_at
        assert q.stats().total == len(before["due"])
