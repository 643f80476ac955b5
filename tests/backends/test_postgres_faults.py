"""``postgresql://`` under server faults, on a private server started for this module
(tests/backends/_postgres_server.py): a SIGKILL of the server in the middle of a stream
of puts and acks, one right after a reserve, and a restart under a waiting consumer on
each face.

Skipped without the PostgreSQL binaries, or failed when ``$DELAYQ_REQUIRE`` lists
postgres.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conformance.conftest import unavailable
from delayq import LeaseLost
from delayq.durable import AsyncQueue, Queue

pytest.importorskip("psycopg")

from backends._postgres_server import PostgresUnavailable, PrivatePostgres
from delayq.backends.postgres import OUTAGE_ERRORS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    try:
        private = PrivatePostgres()
    except PostgresUnavailable as exc:
        unavailable("postgres", f"no private server: {exc}")
    try:
        yield private
    finally:
        private.stop()


def until(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_kill_9_under_puts_and_acks_loses_nothing_acknowledged(server: PrivatePostgres) -> None:
    url = f"{server.url}?schema=crash"
    with Queue(url, name="work") as work:
        work.put_many([{"payload": i, "id": f"w{i}"} for i in range(400)])
        holding = work.named("held")
        holding.put_many([{"payload": i, "id": f"h{i}"} for i in range(20)])
        # held across the crash: each comes back due at its lease's end, not before
        held = {m.id: m.lease_expires_at for m in holding.reserve(max=20, lease=3)}
    put_due: dict[str, int] = {}
    acked: set[str] = set()
    stop = threading.Event()
    base_ms = int(time.time() * 1000) + 3_600_000

    def produce() -> None:
        with Queue(url, name="in") as q:
            i = 0
            while not stop.is_set():
                due = base_ms + i
                try:
                    q.put(i, id=f"p{i}", at=due / 1000)
                except OUTAGE_ERRORS:
                    return
                put_due[f"p{i}"] = due
                i += 1

    def consume() -> None:
        with Queue(url, name="work") as q:
            while not stop.is_set():
                try:
                    for msg in q.reserve(max=5, wait=0):
                        q.ack(msg)
                        acked.add(msg.id)
                except OUTAGE_ERRORS:
                    return

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    until(lambda: len(put_due) > 200 and len(acked) > 50)
    server.kill()
    for thread in threads:
        thread.join(30)
    stop.set()
    server.start()
    with Queue(url, name="in") as q:
        for id, due in put_due.items():
            record = q.get(id)
            assert record is not None, id
            assert record.due_at == due, id
    with Queue(url, name="work") as q:
        for id in acked:
            assert q.get(id) is None, id
    with Queue(url, name="held") as q:
        back: dict[str, Any] = {}

        def held_ones_came_back() -> bool:
            for msg in q.reserve(max=400, wait=1):
                if msg.id in held:
                    back[msg.id] = msg
            return set(back) == set(held)

        until(held_ones_came_back)
        for id, msg in back.items():  # the lease expired: the attempt counted
            assert (msg.due_at, msg.attempts, msg.last_error) == (held[id], 2, "lease expired")


def put_when_back(url: str, queue: str, payload: str) -> None:
    """Put once the server answers again (the caller's own outage handling)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with Queue(url, name=queue) as q:
                q.put(payload, delay=0.2)
                return
        except OUTAGE_ERRORS:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_restart_under_a_waiting_sync_consumer(server: PrivatePostgres) -> None:
    url = f"{server.url}?schema=restart_sync"
    with Queue(url, name="w") as consumer:
        consumer.put("first")
        # connected, schema made; acked, as a claim alone may not outlive the crash below
        # (it commits without waiting for the disk: see the kill -9 test after a reserve)
        (first,) = consumer.reserve()
        consumer.ack(first)
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.extend(consumer.reserve(wait=25)))
        thread.start()
        time.sleep(0.3)  # it sleeps, listening
        server.restart()
        put_when_back(url, "w", "after")
        thread.join(30)
        assert [m.payload for m in got] == ["after"]


def test_a_restart_under_a_waiting_async_consumer(server: PrivatePostgres) -> None:
    url = f"{server.url}?schema=restart_async"

    async def main() -> list[Any]:
        async with AsyncQueue(url, name="w") as consumer:
            await consumer.put("first")
            (first,) = await consumer.reserve()
            await consumer.ack(first)  # as on the sync face
            waiting = asyncio.ensure_future(consumer.reserve(wait=25))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(server.restart)
            await asyncio.to_thread(put_when_back, url, "w", "after")
            return [m.payload for m in await waiting]

    assert asyncio.run(main()) == ["after"]


def test_kill_9_after_a_reserve_its_message_comes_back_and_no_acked_one_does() -> None:
    """A claim commits without waiting for the disk (``statements.claim_function``): a
    kill -9 of the server right after a reserve may lose it. Either way its message
    is delivered again, no later than at its lease's end (at once, its attempt not
    counted, when the claim was lost; at the lease's end, attempt 2, when it was
    not), and the lease from before the crash acks nothing any more. A claim
    followed by a synchronous commit (here an ack) is durable with it: that message
    stays held until its lease ends. A message acked never comes back. The server's
    WAL writer waits 10 s between flushes, so the last claim is usually lost."""
    try:
        server = PrivatePostgres(settings={"wal_writer_delay": "10s"})
    except PostgresUnavailable as exc:
        unavailable("postgres", f"no private server: {exc}")
    lease = 3.0
    try:
        url = f"{server.url}?schema=claims"
        with Queue(url, name="c") as q:
            q.put_many([{"payload": i, "id": f"m{i}"} for i in range(3)])
            acked, kept = q.reserve(max=2, lease=lease)
            q.ack(acked)  # a synchronous commit: the claim before it is on disk too
            (last,) = q.reserve(max=1, lease=lease)
            server.kill()
        server.start()
        with Queue(url, name="c") as q:
            back: dict[str, Any] = {}
            deadline = time.monotonic() + lease + 10.0
            while len(back) < 2 and time.monotonic() < deadline:
                for msg in q.reserve(max=10, lease=30, wait=1.0):
                    back[msg.id] = msg
            assert sorted(back) == sorted([kept.id, last.id])
            assert q.get(acked.id) is None
            again = back[kept.id]
            assert (again.attempts, again.last_error) == (2, "lease expired")
            assert again.due_at == kept.lease_expires_at
            lost = back[last.id]
            claim_lost = (lost.attempts, lost.last_error, lost.due_at) == (1, None, last.due_at)
            lease_ended = (lost.attempts, lost.last_error) == (2, "lease expired")
            assert claim_lost or lease_ended, lost
            for old in (kept, last):
                with pytest.raises(LeaseLost):
                    q.ack(old)
    finally:
        server.stop()
