"""What is specific to ``sqlite:///`` (the shared contract is in tests/conformance).

URLs and options, the schema (WAL, the claim index), persistence across objects,
several processes on one file, cross-process wake-up, busy databases, fork, and the
async face's promises (the loop never blocks, a cancelled reserve claims nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import shutil
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends._given_back import given_back_by_the_close
from backends._window import woken_after_the_window
from delayq import DuplicateId, QueueClosed, UnsupportedURL
from delayq.backends.sqlite import AsyncSQLiteBackend, SQLiteBackend, _wakeup
from delayq.backends.sqlite import statements as sql
from delayq.backends.sqlite._url import parse_url
from delayq.durable import AsyncBackend, AsyncQueue, Backend, PutRequest, Queue, State

#: Generous bound for "promptly" in real time: these tests check that something
#: happens, never how fast (benchmarks/durable.py measures that).
PROMPTLY = 5.0


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A fresh database file."""
    return f"sqlite:///{tmp_path / 'q.db'}"


@pytest.fixture
def queue(url: str) -> Iterator[Queue]:
    """A sync queue on the fresh file."""
    with Queue(url, name="jobs") as q:
        yield q


def run_python(code: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; fail the test on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


# -- URLs and options ---------------------------------------------------------------


def test_url_paths_are_relative_with_three_slashes_and_absolute_with_four(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_url("sqlite:///sub/q.db")[0] == str(tmp_path / "sub" / "q.db")
    assert parse_url(f"sqlite:///{tmp_path}/abs.db")[0] == str(tmp_path / "abs.db")
    assert parse_url("sqlite:///with%20space.db")[0] == str(tmp_path / "with space.db")


@pytest.mark.parametrize(
    "bad",
    [
        "sqlite:///:memory:",
        "sqlite://",
        "sqlite:///",
        "sqlite://host/q.db",
        "sqlite:///q.db?colour=blue",
        "sqlite:///file:x?mode=memory",
    ],
)
def test_bad_urls_are_refused_clearly(bad: str) -> None:
    with pytest.raises(UnsupportedURL):
        parse_url(bad)


def test_memory_database_refusal_points_to_memory_scheme() -> None:
    with pytest.raises(UnsupportedURL, match="memory://"):
        Queue("sqlite:///:memory:")


def test_options_come_from_keywords_or_the_query() -> None:
    _, options = parse_url("sqlite:///q.db?synchronous=FULL&busy_timeout=2.5")
    assert options["synchronous"] == "full"
    assert options["busy_timeout"] == 2.5
    _, options = parse_url("sqlite:///q.db?synchronous=full", synchronous="normal")
    assert options["synchronous"] == "normal"
    with pytest.raises(TypeError, match="colour"):
        parse_url("sqlite:///q.db", colour="blue")
    with pytest.raises(ValueError, match="synchronous"):
        parse_url("sqlite:///q.db", synchronous="sometimes")
    for bad in (0, -1, float("nan"), "soon"):
        with pytest.raises(ValueError, match="poll_interval"):
            parse_url("sqlite:///q.db", poll_interval=bad)
    with pytest.raises(TypeError, match="busy_timeout"):
        parse_url("sqlite:///q.db", busy_timeout=True)


def test_unknown_option_raises_type_error_through_queue(url: str) -> None:
    with pytest.raises(TypeError):
        Queue(url, colour="blue")


def test_the_backend_implements_both_protocols(url: str) -> None:
    with Queue(url) as q:
        assert isinstance(q.backend, SQLiteBackend)
        assert isinstance(q.backend, Backend)
    backend = AsyncSQLiteBackend(url)
    assert isinstance(backend, AsyncBackend)
    asyncio.run(backend.close())


# -- schema --------------------------------------------------------------------------


def test_the_file_is_in_wal_mode_with_the_schema(queue: Queue, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "q.db")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert {"delayq_messages", "delayq_meta", "delayq_messages_due"} <= names
        plan = " ".join(
            str(row[-1])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN " + sql.CLAIM,
                {"queue": "jobs", "now": 0, "ceil": 0, "lease_ms": 1, "limit": 10},
            )
        )
        assert "delayq_messages_due" in plan
        assert "TEMP B-TREE" not in plan  # the index gives the order: no sort
    finally:
        conn.close()


def _plan(conn: sqlite3.Connection, statement: str, params: dict[str, object]) -> str:
    return " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + statement, params))


def test_inspection_reads_go_through_the_indexes(queue: Queue, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "q.db")
    try:
        params = {"queue": "jobs", "now": 0, "width": 1000, "end": 60_000, "limit": 10}
        # due_counts: one range scan of the claim index, no table scan.
        due = _plan(conn, sql.DUE_COUNTS, params)
        assert "SEARCH delayq_messages USING INDEX delayq_messages_due" in due
        assert "due_at>? AND due_at<?" in due
        # queues: one index seek per queue name, not a scan of every row.
        names = _plan(conn, sql.QUEUES, {})
        assert "SCAN delayq_messages" not in names
        assert "(queue>?)" in names
        # peek, first page or a later one (after a position of its order).
        position = {"after": 5, "after_key": 1000, "after_seq": 5}
        for state in (None, "ready", "scheduled", "active", "dead"):
            plan = _plan(conn, sql.PEEK[state], {**params, **position})
            assert "SCAN delayq_messages" not in plan
    finally:
        conn.close()


def test_opening_twice_and_from_many_threads_keeps_one_schema(url: str) -> None:
    errors: list[BaseException] = []

    def open_and_put(i: int) -> None:
        try:
            with Queue(url, name="t") as q:
                q.put(i, id=f"m{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_and_put, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with Queue(url, name="t") as q:
        assert q.stats().total == 8


def test_messages_and_due_times_survive_closing_and_reopening(url: str) -> None:
    with Queue(url, name="keep") as q:
        soon = q.put("soon", delay=0.05)
        later = q.put({"x": 1}, delay="1h", headers={"k": "v"})
        before = {id: q.get(id) for id in (soon, later)}
    with Queue(url, name="keep") as q:
        for id, message in before.items():
            again = q.get(id)
            assert again is not None
            assert message is not None
            assert (again.payload, again.due_at, again.headers) == (
                message.payload,
                message.due_at,
                message.headers,
            )


def test_seq_increases_across_backend_objects(url: str) -> None:
    """Two writers on one file, one due time: reserve returns them in put order."""
    at = time.time() - 1
    with Queue(url, name="fifo") as a, Queue(url, name="fifo") as b:
        ids = [(a if i % 2 else b).put(i, at=at) for i in range(10)]
        got = [m.id for m in a.reserve(max=10, wait=0)]
    assert got == ids


def test_put_many_mixes_conflict_modes_in_one_transaction(queue: Queue) -> None:
    queue.put("old", id="a")
    ids = queue.put_many(
        [
            {"payload": 1, "id": "a"},
            {"payload": 2, "id": "b"},
            {"payload": 3, "id": "a", "on_conflict": "replace"},
            {"payload": 4, "id": "b"},
        ]
    )
    assert ids == ["a", "b", "a", "b"]
    assert [queue.get(i).payload for i in "ab"] == [3, 2]  # type: ignore[union-attr]
    with pytest.raises(DuplicateId):
        queue.put_many(
            [{"payload": 5, "id": "c"}, {"payload": 6, "id": "b", "on_conflict": "error"}]
        )
    assert queue.get("c") is None


# -- several processes ------------------------------------------------------------------

_WORKER = """
import json, sys
from delayq.durable import Queue

url, me, per, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
acked = []
with Queue(url, name="shared") as q, Queue(url, name="done") as done:
    for start in range(0, per, 50):  # one by one and in batches
        if start % 100:
            q.put_many([{"payload": me, "id": f"{me}-{i}"} for i in range(start, start + 50)])
        else:
            for i in range(start, start + 50):
                q.put(me, id=f"{me}-{i}")
        for message in q.reserve(max=20, wait=0):
            q.ack(message)
            acked.append(message.id)
    done.put(me, id=me)
    while True:
        messages = q.reserve(max=20, wait=0.05, lease=60)
        for message in messages:
            q.ack(message)
            acked.append(message.id)
        if not messages and done.stats().total == workers and q.stats().total == 0:
            break
print(json.dumps(acked))
"""


def test_four_processes_produce_and_consume_one_file_exactly_once(url: str) -> None:
    workers, per = 4, 1000
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, f"w{n}", str(per), str(workers)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(workers)
    ]
    acked: Counter[str] = Counter()
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        assert "locked" not in err
        assert "busy" not in err
        acked.update(json.loads(out))
    expected = {f"w{n}-{i}" for n in range(workers) for i in range(per)}
    assert set(acked) == expected
    assert max(acked.values()) == 1


def test_a_waiting_consumer_gets_a_put_from_another_process(url: str, tmp_path: Path) -> None:
    consumer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import json, sys, time
                from delayq.durable import Queue
                with Queue(sys.argv[1], name="wake") as q:
                    q.stats()
                    print("waiting", flush=True)
                    got = q.reserve(wait=30)
                    print(json.dumps([m.payload for m in got]), time.time(), flush=True)
                """
            ),
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert consumer.stdout is not None
        assert consumer.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # let it settle into its wait
        with Queue(url, name="wake") as q:
            sent = time.time()
            q.put("hello")
        payloads, received = consumer.stdout.readline().split()
        assert json.loads(payloads) == ["hello"]
        assert float(received) - sent < PROMPTLY
    finally:
        consumer.kill()
        consumer.communicate()


# -- cross-process wake-ups (datagrams beside the file; the poll as the safety net) -----

_CONSUMER = """
import asyncio, sys, time
from delayq.durable import AsyncQueue, Queue

url, face, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])

def report(got):
    print(time.time(), len(got), flush=True)

if face == "sync":
    with Queue(url, name="q0") as q0, Queue(url, name="q1") as q1:
        q0.stats()
        for i in range(rounds):
            q = (q0, q1)[i % 2]
            print("waiting", flush=True)
            got = q.reserve(wait=30)
            report(got)
            q.ack_many(got)
else:
    async def main():
        async with AsyncQueue(url, name="q0") as q0, AsyncQueue(url, name="q1") as q1:
            await q0.stats()
            for i in range(rounds):
                q = (q0, q1)[i % 2]
                print("waiting", flush=True)
                got = await q.reserve(wait=30)
                report(got)
                await q.ack_many(got)
    asyncio.run(main())
"""

#: The consumers' poll, the longest allowed: a wake-up that waited for it stands out.
_SLOW_POLL = 1.0


def _consumer(url: str, face: str = "sync", rounds: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CONSUMER, url, face, str(rounds)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _put_and_time(q: Queue, consumer: subprocess.Popen[str], before: Callable[[], None]) -> float:
    """Once ``consumer`` says it waits, settle, run ``before``, put one message; the
    seconds from just before the put until the consumer got it."""
    assert consumer.stdout is not None
    assert consumer.stdout.readline().strip() == "waiting"
    time.sleep(0.1)  # into its wait
    before()
    sent = time.time()
    q.put("wake up")
    received, count = consumer.stdout.readline().split()
    assert count == "1"
    return float(received) - sent


def _bound_a_socket(wake_dir: Path) -> None:
    """Wait until a consumer has a socket in ``wake_dir``."""
    deadline = time.monotonic() + PROMPTLY
    while not (wake_dir.exists() and any(wake_dir.iterdir())):
        assert time.monotonic() < deadline, "the consumer bound no socket"
        time.sleep(0.01)


def _wake_times(url: str, face: str, rounds: int, before: Callable[[], None]) -> list[float]:
    consumer = _consumer(f"{url}?poll_interval={_SLOW_POLL}", face, rounds)
    times: list[float] = []
    try:
        with Queue(url, name="q0") as q0, Queue(url, name="q1") as q1:
            for i in range(rounds):
                times.append(_put_and_time((q0, q1)[i % 2], consumer, before))
        assert consumer.wait(30) == 0
        return times
    except sqlite3.DatabaseError as exc:
        # Seen once in CI ("file is not a database" at a put's BEGIN IMMEDIATE) and
        # never since: say what was on disk, should it come again.
        raise AssertionError(f"round {len(times)}: {exc}; {_on_disk(parse_url(url)[0])}") from exc
    finally:
        consumer.kill()
        consumer.communicate()


def _on_disk(path: str) -> str:
    """The database file's header and sizes, and what a connection of its own finds."""
    files = {
        suffix: Path(path + suffix).stat().st_size if Path(path + suffix).exists() else None
        for suffix in ("", "-wal", "-shm")
    }
    header = Path(path).read_bytes()[:100].hex() if Path(path).exists() else None
    try:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            check = conn.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.Error as exc:
        check = [repr(exc)]
    return f"SQLite {sqlite3.sqlite_version}, sizes {files}, header {header}, check {check}"


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_put_wakes_a_consumer_in_another_process_long_before_its_poll(
    url: str, tmp_path: Path, face: str
) -> None:
    """A consumer blocked in ``reserve(wait=30)`` in another process, polling only
    every second, gets each of 20 puts in a small fraction of that second (the
    median, against a quarter of the poll: waiting for the poll makes it about half),
    waiting on two queues in turn (so each is one writers are asked for while the
    consumer's socket exists). Once the consumer closed, no socket or directory is
    left beside the file."""
    times = _wake_times(url, face, 20, lambda: None)
    assert statistics.median(times) < _SLOW_POLL / 4, times
    assert sorted(p.name for p in tmp_path.iterdir() if "wake" in p.name) == []


@pytest.mark.parametrize("lost", ["notify=off", "directory removed", "socket path too long"])
def test_a_lost_notification_still_wakes_the_consumer_at_its_poll(
    url: str, tmp_path: Path, lost: str
) -> None:
    """Without a notification (the producer has ``notify=off``, the directory of the
    consumer's socket was removed under it, or the file's path is too long for a
    Unix socket's), the consumer still gets the put from its poll; nothing is left
    beside the file."""
    if lost == "socket path too long":
        deep = tmp_path / ("d" * 110)
        deep.mkdir()
        url = f"sqlite:///{deep / 'q.db'}"
    wake_dir = Path(f"{parse_url(url)[0]}-wake")
    producer_url = f"{url}?notify=off" if lost == "notify=off" else url

    def before_the_put() -> None:
        if lost == "directory removed":
            _bound_a_socket(wake_dir)
            shutil.rmtree(wake_dir)

    consumer = _consumer(f"{url}?poll_interval=0.3")
    try:
        with Queue(producer_url, name="q0") as q:
            took = _put_and_time(q, consumer, before_the_put)
        assert took < PROMPTLY
        assert consumer.wait(30) == 0
        assert not wake_dir.exists()
    finally:
        consumer.kill()
        consumer.communicate()


def test_the_socket_of_a_killed_consumer_does_not_break_later_puts(
    url: str, tmp_path: Path
) -> None:
    """A consumer killed while it waits leaves its socket beside the file; the next
    put succeeds and removes it, and a new consumer is woken as promptly as ever."""
    wake_dir = tmp_path / "q.db-wake"
    consumer = _consumer(url)
    try:
        assert consumer.stdout is not None
        assert consumer.stdout.readline().strip() == "waiting"
        _bound_a_socket(wake_dir)
    finally:
        consumer.kill()
        consumer.communicate()
    assert any(wake_dir.iterdir())  # the killed process's leftovers
    with Queue(url, name="q0") as q:
        q.put("for nobody", delay="1h")
        assert not wake_dir.exists()
        assert q.stats().scheduled == 1
    times = _wake_times(url, "sync", 3, lambda: None)
    assert statistics.median(times) < _SLOW_POLL / 4, times


def test_notify_is_an_on_off_option(url: str) -> None:
    assert parse_url(f"{url}?notify=off")[1]["notify"] is False
    assert parse_url(url, notify=True)[1]["notify"] is True
    with pytest.raises(ValueError, match="notify"):
        Queue(url, notify="sometimes")


def test_a_waiting_thread_wakes_for_a_put_through_the_same_queue(queue: Queue) -> None:
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.extend(queue.reserve(wait=30)))
    waiter.start()
    time.sleep(0.2)
    queue.put("now")
    waiter.join(PROMPTLY)
    assert not waiter.is_alive()
    assert [m.payload for m in got] == ["now"]


def test_a_waiting_thread_wakes_for_a_put_through_another_queue_object(url: str) -> None:
    with Queue(url, name="x") as waiting, Queue(url, name="x") as other:
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.extend(waiting.reserve(wait=30)))
        waiter.start()
        time.sleep(0.2)
        other.put("via the file")
        waiter.join(PROMPTLY)
        assert not waiter.is_alive()
        assert [m.payload for m in got] == ["via the file"]


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_commit_before_the_watchers_first_reading_wakes_the_waiting_reserve(
    url: str, face: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher that a waiting reserve starts is held before its first reading of
    ``data_version`` while another queue object commits a put: that reading already
    counts the commit, so only the wake-up that follows it brings the message. The
    reserve must return well within its wait (a quarter of it) once the watcher
    goes on, not at its end."""
    read = _wakeup._data_version
    reading, go_on = threading.Event(), threading.Event()

    def held_first_reading(conn: sqlite3.Connection) -> int:
        if not reading.is_set():
            reading.set()
            go_on.wait(10)
        return read(conn)

    monkeypatch.setattr(_wakeup, "_data_version", held_first_reading)

    def reserve(wait: float) -> list[Any]:
        if face == "sync":
            return waiting.reserve(wait=wait)

        async def main() -> list[Any]:
            async with AsyncQueue(url, name="w") as q:
                return await q.reserve(wait=wait)

        return asyncio.run(main())

    def held() -> None:
        assert reading.wait(10), "no watcher started"

    with Queue(url, name="w") as waiting, Queue(url, name="w") as other:
        waiting.stats()  # the schema is in place
        woken_after_the_window(
            reserve,
            12.0,
            held,
            lambda: other.put("x", id="x"),
            go_on.set,
            "the watcher's first reading",
        )


def test_close_wakes_a_waiting_reserve(url: str) -> None:
    q = Queue(url, name="c")
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            q.reserve(wait=30)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)
    q.close()
    waiter.join(PROMPTLY)
    assert not waiter.is_alive()
    assert [type(e) for e in errors] == [QueueClosed]


# -- busy databases ------------------------------------------------------------------


def _hold_write_lock(path: Path, seconds: float) -> threading.Thread:
    locked = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    locked.wait()
    return thread


def test_a_busy_database_is_waited_for_not_reported(queue: Queue, tmp_path: Path) -> None:
    holder = _hold_write_lock(tmp_path / "q.db", 1.3)  # longer than one busy_timeout try
    started = time.monotonic()
    queue.put("patient")
    assert time.monotonic() - started >= 1.0
    holder.join()
    assert queue.stats().ready == 1


def test_a_database_busy_beyond_busy_timeout_raises_timeout_error(tmp_path: Path) -> None:
    with Queue(f"sqlite:///{tmp_path / 'q.db'}", busy_timeout=0.2) as q:
        holder = _hold_write_lock(tmp_path / "q.db", 1.0)
        with pytest.raises(TimeoutError, match="busy"):
            q.put("impatient")
        holder.join()
        assert q.stats().total == 0


# -- fork --------------------------------------------------------------------------


def _child(queue: Queue) -> None:
    """In a forked child: write through the inherited queue, then wait for a put of
    the parent (which needs the child's own change watcher)."""
    queue.put("from the child", id="child", delay="1h")
    got = queue.reserve(wait=20)
    queue.close()
    if [m.id for m in got] != ["ping"]:
        raise SystemExit(3)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_opens_its_own_connections(queue: Queue) -> None:
    assert queue.reserve(wait=0.05) == []  # the parent's watcher runs at fork time
    child = multiprocessing.get_context("fork").Process(target=_child, args=(queue,))
    child.start()
    deadline = time.monotonic() + 20
    while queue.get("child") is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # into its wait
    queue.put("from the parent", id="ping")
    child.join(30)
    assert child.exitcode == 0
    ping = queue.get("ping")
    assert ping is not None
    assert ping.state is State.ACTIVE  # the child holds it
    queue.put("parent still fine", id="after")
    assert queue.stats().total == 3


def _child_after_the_parent(queue: Queue, go: Any) -> None:
    """In a forked child: put, wait until the parent closed its queue and another
    process put and closed, put again."""
    queue.put("first from the child", id="c1")
    go.wait(30)
    queue.put("second from the child", id="c2")
    queue.close()


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_childs_puts_are_kept_after_the_parent_closed(url: str) -> None:
    """A child forked from a process that had the file open (a pool connection, the
    change watcher) keeps every put, even those it makes after the parent closed its
    queue and another process wrote and closed (which must not checkpoint the WAL away
    under the child: SQLite's lock table, inherited from the parent, holds no lock of
    the child's own unless the parent closed its connections before the fork)."""
    context = multiprocessing.get_context("fork")
    go = context.Event()
    with Queue(url, name="jobs") as parent:
        parent.put("from the parent", id="p")
        assert [m.id for m in parent.reserve(wait=0.05)] == ["p"]  # the watcher opened
        child = context.Process(target=_child_after_the_parent, args=(parent, go))
        child.start()
        deadline = time.monotonic() + 20
        while parent.get("c1") is None and time.monotonic() < deadline:
            time.sleep(0.02)
    # The parent's queue is closed (its watcher's connection too): another process
    # writes and closes, the last to hold a lock it can see.
    run_python(
        f"from delayq import Queue\nwith Queue({url!r}, name='jobs') as q: q.put('t', id='t')"
    )
    go.set()
    child.join(30)
    assert child.exitcode == 0
    with Queue(url, name="jobs") as after:
        assert sorted(m.id for m in after.peek(limit=10)) == ["c1", "c2", "t"]
        assert after.get("p") is not None


def _child_of_a_busy_parent(queue: Queue) -> None:
    try:
        queue.put("unsafe")
    except RuntimeError as exc:
        raise SystemExit(0 if "another thread" in str(exc) else 4) from None
    raise SystemExit(5)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_child_forked_while_a_connection_is_in_use_refuses_the_file(queue: Queue) -> None:
    """A connection lent to another thread at the fork cannot be closed before it: the
    child refuses the file with a RuntimeError that says why, rather than write without
    locks; the parent goes on."""
    queue.put("before")
    pool = queue.backend._core.pool  # type: ignore[attr-defined]
    lent = pool._borrow()  # as a call in another thread holds it
    try:
        child = multiprocessing.get_context("fork").Process(
            target=_child_of_a_busy_parent, args=(queue,)
        )
        child.start()
        child.join(30)
    finally:
        pool._give_back(lent)
    assert child.exitcode == 0
    queue.put("after")
    assert queue.stats().total == 2


# -- the async face ------------------------------------------------------------------


def test_async_reserve_cancelled_while_waiting_claims_nothing(url: str) -> None:
    async def main() -> None:
        async with AsyncQueue(url, name="cancel") as q:
            task = asyncio.ensure_future(q.reserve(wait=30))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await q.put("left alone")
            await asyncio.sleep(0.1)
            stats = await q.stats()
            assert (stats.ready, stats.active) == (1, 0)

    asyncio.run(main())


def test_async_reserve_cancelled_mid_claim_gives_the_claim_back(url: str) -> None:
    """The claim runs in a thread; cancelled while it runs, the claimed message goes
    back exactly as it was (no attempt counted)."""

    async def main() -> None:
        async with AsyncQueue(url, name="mid") as q:
            await q.put("x", id="x")
            backend = q.backend
            assert isinstance(backend, AsyncSQLiteBackend)
            core = backend._core
            claim = core.claim
            entered = threading.Event()

            def slow_claim(*args: Any) -> Any:
                entered.set()
                time.sleep(0.3)
                return claim(*args)

            core.claim = slow_claim  # type: ignore[method-assign,assignment]
            task = asyncio.ensure_future(q.reserve(wait=0))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            core.claim = claim  # type: ignore[method-assign]
            for _ in range(100):
                message = await q.get("x")
                if message is not None and message.state is State.READY:
                    break
                await asyncio.sleep(0.02)
            assert message is not None
            assert (message.state, message.attempts) == (State.READY, 0)

    asyncio.run(main())


def test_async_claim_cancelled_just_before_a_close_is_given_back(url: str) -> None:
    """A reserve cancelled while its claim runs in the pool, and the queue closed at
    once: the close waits for the claim and gives back what it took, so the message
    is ready for the next process, not held until its lease runs out."""

    def linger(backend: Any, claimed: threading.Event) -> None:
        assert isinstance(backend, AsyncSQLiteBackend)
        claim = backend._core.claim

        def claim_then_linger(*args: Any) -> Any:
            result = claim(*args)
            claimed.set()
            time.sleep(0.3)  # the close comes while this claim has not returned
            return result

        backend._core.claim = claim_then_linger  # type: ignore[method-assign]

    given_back_by_the_close(url, linger)


def test_async_operations_never_block_the_loop(url: str, tmp_path: Path) -> None:
    """A put waiting for the write lock waits in a thread: the loop goes on running
    other tasks meanwhile. The lock is held until the loop has shown it runs (ten
    turns of another task while the put is pending), or 10 s."""
    release = threading.Event()
    released_in_time: list[bool] = []
    locked = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        released_in_time.append(release.wait(10))
        conn.execute("COMMIT")
        conn.close()

    async def main() -> None:
        async with AsyncQueue(url, name="loop") as q:
            await q.put("warm up")
            holder = threading.Thread(target=hold)
            holder.start()
            locked.wait()
            put = asyncio.ensure_future(q.put("waits for the lock in a thread"))
            turns = 0
            while turns < 10 and not put.done():
                await asyncio.sleep(0.01)
                turns += 1
            pending = not put.done()
            release.set()
            await put
            holder.join()
            assert (turns, pending) == (10, True)
            assert released_in_time == [True]
            assert len(await q.reserve(wait=0.3, max=5)) == 2

    asyncio.run(main())


def test_async_backend_opens_lazily_and_serves_sync_writers(tmp_path: Path) -> None:
    path = tmp_path / "lazy.db"
    backend = AsyncSQLiteBackend(f"sqlite:///{path}")
    assert not path.exists()

    async def main() -> None:
        request = PutRequest(id="r", payload=b"raw", encoding="bytes", max_attempts=3)
        assert await backend.put("q", [request]) == []  # stored: no request kept
        records = await backend.reserve("q", limit=1, lease_ms=1000, wait=0)
        assert [r.id for r in records] == ["r"]
        await backend.close()

    asyncio.run(main())
    assert path.exists()


def test_a_file_that_cannot_be_opened_names_its_path(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "q.db"
    with pytest.raises(sqlite3.OperationalError, match="no/such/dir"):
        Queue(f"sqlite:///{missing}")
