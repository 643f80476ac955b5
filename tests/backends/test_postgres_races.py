"""``postgresql://`` under the races the plain tests never open: rows another
transaction holds locked (a claim skips them, no read waits for them) and a put made
while the LISTEN connection of the waiting consumer's backend object is on its way
(first connect or reconnect), held at a TCP proxy of the test's own.

Each test works in a schema of its own on the test server (``$DELAYQ_TEST_POSTGRES``),
dropped afterwards.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from backends._window import woken_after_the_window
from backends.test_postgres import BASE, admin, schema, url_of
from delayq.durable import Queue, State

psycopg = pytest.importorskip("psycopg")

from delayq.backends.postgres import statements  # noqa: E402

__all__ = ["admin", "schema"]  # fixtures

# -- rows another transaction holds -----------------------------------------------------


@contextlib.contextmanager
def holding(schema: str, queue: str, *ids: str) -> Iterator[Any]:
    """A transaction of another session that holds the rows of messages ``ids``
    locked (``SELECT ... FOR UPDATE``) until the block ends; the connection."""
    with psycopg.connect(BASE, connect_timeout=5) as conn:
        rows = conn.execute(
            f'SELECT id FROM "{schema}".messages WHERE queue = %s AND id = ANY(%s) FOR UPDATE',
            (queue, list(ids)),
        ).fetchall()
        assert sorted(row[0] for row in rows) == sorted(ids)
        try:
            yield conn
        finally:
            conn.rollback()


def while_held(holder: Any, call: Callable[[], Any]) -> Any:
    """``call()``'s result, which must come while ``holder`` still holds its lock: a
    call that waits for the lock fails the test (after 10 s, the lock then let go so
    that it ends)."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    waited = thread.is_alive()
    assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    if waited:
        holder.rollback()
        thread.join(10)
    assert not waited, "the call waited for a row lock another transaction held"
    if errors:
        raise errors[0]
    return result[0]


def test_a_claim_skips_due_messages_another_transaction_holds(admin: Any, schema: str) -> None:
    """The earliest due message is locked by another transaction: ``reserve(wait=0)``
    returns the next ones at once, and the held one once the lock is gone."""
    with Queue(url_of(schema), name="held") as q:
        for i in range(3):
            q.put(i, id=f"m{i}")
        with holding(schema, "held", "m0") as holder:
            first = while_held(holder, lambda: q.reserve(wait=0))
            assert [m.id for m in first] == ["m1"]
            rest = while_held(holder, lambda: q.reserve(max=5, wait=0))
            assert [m.id for m in rest] == ["m2"]
            assert while_held(holder, lambda: q.reserve(wait=0)) == []
        assert [m.id for m in q.reserve(wait=0)] == ["m0"]


def test_two_consumers_claiming_at_once_skip_each_others_rows(admin: Any, schema: str) -> None:
    """A claim in flight (its transaction holds the rows it picked, here held open by
    a lock on the last of them) does not stop another consumer taking the rest."""
    with Queue(url_of(schema), name="pair") as q, Queue(url_of(schema), name="pair") as other:
        q.put_many([{"payload": i, "id": f"p{i}"} for i in range(4)])
        with holding(schema, "pair", "p0") as holder:
            got = while_held(holder, lambda: other.reserve(max=10, wait=0))
            assert sorted(m.id for m in got) == ["p1", "p2", "p3"]
            other.ack_many(got)
        assert [m.id for m in q.reserve(max=10, wait=0)] == ["p0"]


def test_a_claim_skips_an_expired_lease_another_transaction_holds(admin: Any, schema: str) -> None:
    """A message whose lease expired while another transaction holds its row: a claim
    takes the other due messages at once; a consumer waiting meanwhile does not spin
    on the held one (its CPU over a one-second wait stays near that of a wait on an
    empty queue) and takes it, attempt counted, soon after the lock is gone."""
    url = url_of(schema)
    with Queue(url, name="expired") as q, Queue(url, name="empty") as empty:
        q.put("first", id="m0")
        assert [m.id for m in q.reserve(wait=0, lease=0.05)] == ["m0"]
        time.sleep(0.15)  # m0's lease has expired: its row is active until settled
        q.put("next", id="m1")
        cpu = time.process_time()
        assert empty.reserve(wait=1.0) == []
        quiet = time.process_time() - cpu
        waiter: list[tuple[float, list[Any]]] = []
        with holding(schema, "expired", "m0") as holder:
            got = while_held(holder, lambda: q.reserve(max=5, wait=0))
            assert [m.id for m in got] == ["m1"]
            q.ack(got[0])
            cpu = time.process_time()
            assert while_held(holder, lambda: q.reserve(wait=1.0)) == []
            spent = time.process_time() - cpu
            thread = threading.Thread(
                target=lambda: waiter.append((time.monotonic(), q.reserve(wait=10))),
                daemon=True,
            )
            thread.start()
            time.sleep(0.3)  # it sleeps on the held row
            released = time.monotonic()
        thread.join(15)
        assert spent < 10 * quiet + 0.15, f"{spent:.3f} s of CPU against {quiet:.3f} s"
        woken, messages = waiter[0]
        assert [(m.id, m.attempts) for m in messages] == [("m0", 2)]
        assert woken - released < 2.0, f"taken {woken - released:.2f} s after the lock went"


READS: dict[str, Callable[[Queue], Any]] = {
    "stats": lambda q: q.stats().ready,
    "peek": lambda q: sorted(m.id for m in q.peek()),
    "peek ready": lambda q: sorted(m.id for m in q.peek(State.READY)),
    "peek scheduled": lambda q: sorted(m.id for m in q.peek(State.SCHEDULED)),
    "get": lambda q: q.get("m0") is not None,
    "due_counts": lambda q: sum(q.due_counts()[1]),
    "dead": lambda q: q.dead(),
    "queues": lambda q: q.queues(),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_read_does_not_wait_for_a_row_another_transaction_holds(
    admin: Any, schema: str, read: str
) -> None:
    """Every read of a queue answers while another transaction holds its rows locked
    (a ready one and a scheduled one), and sees them."""
    with Queue(url_of(schema), name="held") as q:
        q.put("now", id="m0")
        q.put("later", id="m1", delay=60)
        expected = READS[read](q)
        with holding(schema, "held", "m0", "m1") as holder:
            assert while_held(holder, lambda: READS[read](q)) == expected


def test_changes_of_other_messages_do_not_wait_for_a_row_another_transaction_holds(
    admin: Any, schema: str
) -> None:
    """Acks (one, many), nack, extend, release, reschedule and cancel of other
    messages of the queue go through while another transaction holds one row."""
    with Queue(url_of(schema), name="held") as q:
        q.put_many([{"payload": i, "id": f"m{i}"} for i in range(8)])
        q.put("later", id="later", delay=60)
        q.put("gone", id="gone", delay=60)
        by_id = {m.id: m for m in q.reserve(max=8, wait=0)}
        # m0 is claimed (active) and then locked by someone else.
        with holding(schema, "held", "m0") as holder:
            while_held(holder, lambda: q.ack(by_id["m1"]))
            assert while_held(holder, lambda: q.ack_many([by_id["m2"], by_id["m3"]])) == []
            while_held(holder, lambda: q.nack(by_id["m4"], delay=60))
            while_held(holder, lambda: q.extend(by_id["m5"]))
            while_held(holder, lambda: q.release(by_id["m6"]))
            assert while_held(holder, lambda: q.reschedule("later", delay=120)) is True
            assert while_held(holder, lambda: q.cancel("gone")) is True
        assert q.stats().active == 3  # m0, m5, m7
        q.ack_many([by_id["m0"], by_id["m5"], by_id["m7"]])


# -- a put while the listener connects -------------------------------------------------


class HoldingProxy:
    """A TCP proxy to the test server whose gate can be closed: a connection made
    while it is closed is accepted but not forwarded until :meth:`release`
    (``held`` is set once one waits there)."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._gate = threading.Event()
        self._gate.set()
        self.held = threading.Event()
        self._sockets: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.held.clear()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def close(self) -> None:
        self._gate.set()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self._sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        if not self._gate.is_set():
            self.held.set()
            self._gate.wait()
        try:
            upstream = socket.create_connection(self._upstream, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._sockets.append(upstream)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)


def _pipe(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


@pytest.fixture
def proxy(admin: Any) -> Iterator[HoldingProxy]:
    parts = urlsplit(BASE)
    held = HoldingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    try:
        yield held
    finally:
        held.close()


def proxied(url: str, proxy: HoldingProxy) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) > 1 else host))


def listener_pid(admin: Any, schema: str) -> int:
    """The server process of the connection that LISTENs on the schema's channel,
    once there is one (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = %s",
            (f'LISTEN "{statements.channel(schema)}"',),
        ).fetchone()
        if row is not None:
            return int(row[0])
        assert time.monotonic() < deadline, "nobody listens"
        time.sleep(0.01)


def until_asleep(admin: Any, schema: str, queue: str) -> None:
    """Wait (10 s at most) until a consumer of ``queue`` is registered asleep for more
    than a second (not a short sleep before it): a put due now notifies then."""
    deadline = time.monotonic() + 10
    while True:
        row = admin.execute(
            f'SELECT count(*) FROM "{schema}".waiters WHERE queue = %s '
            "AND until > floor(extract(epoch FROM clock_timestamp()) * 1000) + 1000",
            (queue,),
        ).fetchone()
        if row is not None and row[0] > 0:
            return
        assert time.monotonic() < deadline, "the consumer did not register asleep"
        time.sleep(0.01)


@pytest.mark.parametrize("connect", ["first", "again"])
def test_a_put_while_the_listener_connects_wakes_the_waiting_consumer(
    admin: Any, schema: str, proxy: HoldingProxy, connect: str
) -> None:
    """The consumer's backend object reaches the server through the proxy; its LISTEN
    connection is held at the proxy's gate when it first connects, or when it
    connects again after the server dropped it. Meanwhile the consumer is registered
    asleep (for its whole wait: its safety re-check is 30 s away) and another backend
    object puts: its notification reaches nobody. Once the listener is through it
    must wake the consumer, which then finds the message: well within its wait (a
    quarter of it), not at its end."""
    with (
        Queue(proxied(url_of(schema), proxy), name="w") as consumer,
        Queue(url_of(schema), name="w") as producer,
    ):
        if connect == "first":
            consumer.stats()  # the schema, and the connection its calls keep
            proxy.hold()
        else:
            consumer.stats()  # the schema first: the sleep below is not spent creating it
            assert consumer.reserve(wait=0.2) == []  # starts the listener
            pid = listener_pid(admin, schema)
            proxy.hold()
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

        def held() -> None:
            until_asleep(admin, schema, "w")
            assert proxy.held.wait(10), "the listener did not connect"

        woken_after_the_window(
            lambda wait: consumer.reserve(wait=wait),
            12.0,
            held,
            lambda: producer.put("x", id="x"),  # notified while nobody listens
            proxy.release,
            "the listener was back",
        )
