"""What is specific to ``postgresql://``: its URLs, the claim's query plan, the schema's
versions and first use from many processes at once, waking across backend objects
(LISTEN/NOTIFY) and without it (``notify=off``).

Each test works in a schema of its own on the test server (``$DELAYQ_TEST_POSTGRES``,
by default ``postgresql://postgres@127.0.0.1:5432/test``), dropped afterwards.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from backends._given_back import given_back_by_the_close
from conformance.conftest import unavailable
from delayq import UnsupportedURL
from delayq.durable import AsyncQueue, Queue, State
from delayq.errors import QueueClosed

psycopg = pytest.importorskip("psycopg")

from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from delayq.backends.postgres import _schema, statements  # noqa: E402
from delayq.backends.postgres._url import TIMEOUTS, parse_url  # noqa: E402

BASE = os.environ.get("DELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def admin() -> Iterator[Any]:
    """An autocommit connection to the test server."""
    try:
        conn = psycopg.connect(BASE, autocommit=True, connect_timeout=2)
    except psycopg.Error as exc:
        unavailable("postgres", f"{BASE}: {exc}")
    with conn:
        yield conn


@pytest.fixture
def schema(admin: Any) -> Iterator[str]:
    """A fresh schema name, dropped afterwards."""
    name = f"delayq_test_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def url_of(schema: str, **params: str) -> str:
    query = "&".join(f"{key}={value}" for key, value in {"schema": schema, **params}.items())
    return f"{BASE}{'&' if '?' in BASE else '?'}{query}"


# -- URLs ---------------------------------------------------------------------------


def test_both_schemes_and_libpq_parameters_are_taken() -> None:
    settings = parse_url("postgres://u:p@db.example:5433/app?sslmode=require&schema=jobs")
    assert settings.schema == "jobs"
    assert "sslmode=require" in settings.conninfo
    assert "application_name=delayq" in settings.conninfo
    named = parse_url("postgresql://h/db?application_name=billing")
    assert "application_name=billing" in named.conninfo
    assert "application_name=delayq" not in named.conninfo


def test_a_dead_connection_is_bounded_by_default_and_each_timeout_can_be_set() -> None:
    """Without timeouts libpq waits for the kernel (~15 min) on a silent server."""
    params = conninfo_to_dict(parse_url("postgresql://h/db").conninfo)
    assert {key: params[key] for key in TIMEOUTS} == TIMEOUTS
    given = parse_url("postgresql://h/db?tcp_user_timeout=0&connect_timeout=30&pool_timeout=60")
    params = conninfo_to_dict(given.conninfo)
    assert (params["tcp_user_timeout"], params["connect_timeout"]) == ("0", "30")
    assert params["keepalives_idle"] == TIMEOUTS["keepalives_idle"]
    assert given.pool_timeout == 60.0


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("postgresql://h/db?no_such_parameter=1", UnsupportedURL),
        ("postgresql://h/db?schema=Bad-Name", ValueError),
        ("postgresql://h/db?notify=maybe", ValueError),
        ("postgresql://h/db?poll_interval=0", ValueError),
        ("postgresql://h/db?pool_size=0", ValueError),
        ("postgresql://h/db?pool_timeout=0", ValueError),
    ],
)
def test_a_bad_url_is_refused_before_any_connection(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        Queue(url)


def test_an_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="colour"):
        Queue("postgresql://h/db", colour="red")


# -- the claim's plan -----------------------------------------------------------------


def test_the_claim_takes_due_messages_through_the_partial_index(admin: Any, schema: str) -> None:
    with Queue(url_of(schema), name="plan") as q:
        for queue in ("plan", "other"):
            q.named(queue).put_many([{"payload": i, "delay": i % 50} for i in range(3000)])
        q.reserve(max=10)  # some active rows too
    admin.execute(f'ANALYZE "{schema}".messages')
    pick = statements.CLAIM_PICK.format(s=f'"{schema}"', q="%(q)s", f="%(f)s", n="%(n)s")
    rows = admin.execute(f"EXPLAIN {pick}", {"q": "plan", "f": 2**62, "n": 10}).fetchall()
    plan = "\n".join(row[0] for row in rows)
    assert "messages_due" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_a_put_resolves_its_due_time_by_the_server_clock_each_way_it_is_given(
    admin: Any, schema: str
) -> None:
    """A put one by one has a statement per way of giving its due time (none, a delay,
    a time): each resolves it as resolve_due() does, from the server's clock."""

    def server_ms() -> float:
        row = admin.execute("SELECT extract(epoch FROM clock_timestamp()) * 1000").fetchone()
        return float(row[0])

    with Queue(url_of(schema), name="due") as q:
        before = server_ms()
        ids = {
            "none": q.put("none"),
            "zero delay": q.put("zero", delay=0),
            "negative delay": q.put("negative", delay=-5),
            "past time": q.put("past", at=1.5),
            "delay": q.put("delay", delay=2),
            "time": q.put("time", at=4_000_000_000.25),
        }
        after = server_ms()
        due = {}
        for name, msg_id in ids.items():
            msg = q.get(msg_id)
            assert msg is not None
            due[name] = msg.due_at
    for name in ("none", "zero delay", "negative delay", "past time"):
        assert before - 1 <= due[name] <= after, (name, due)
    assert before + 2000 <= due["delay"] <= after + 2001, due
    assert due["time"] == 4_000_000_000_250


# -- the schema -------------------------------------------------------------------------


def test_a_schema_of_the_first_version_is_upgraded_and_keeps_its_messages(
    admin: Any, schema: str
) -> None:
    s = f'"{schema}"'
    with admin.transaction():
        for statement in _schema.MIGRATIONS[0](s):
            admin.execute(statement)
        admin.execute(f"INSERT INTO {s}.meta VALUES ('schema', 1)")
        admin.execute(
            f"INSERT INTO {s}.messages (queue, id, payload, encoding, due_at, seq, "
            "max_attempts, state) VALUES ('old', 'kept', '\"hi\"', 'json', 0, 1, 3, 'scheduled')"
        )
        admin.execute(f"SELECT setval('{s}.seq', 1)")
    with Queue(url_of(schema), name="old") as q:
        [msg] = q.reserve(wait=0)
        assert (msg.id, msg.payload, msg.attempts) == ("kept", "hi", 1)
        q.ack(msg)
        assert q.put("new") != "kept"
    version = admin.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema'").fetchone()
    assert version == (_schema.VERSION,)


def test_a_schema_of_version_2_gets_the_waiters_and_one_claim_function(
    admin: Any, schema: str
) -> None:
    """Version 3 changed the claim's arguments: the upgrade drops the old function (a
    second one would make the call ambiguous) and adds ``waiters``."""
    s = f'"{schema}"'
    with admin.transaction():
        for statement in _schema.MIGRATIONS[0](s):
            admin.execute(statement)
        admin.execute(
            f"CREATE FUNCTION {s}.claim(q text, n integer, lease_ms bigint, expired text) "
            "RETURNS void LANGUAGE sql AS ''"
        )
        admin.execute(f"INSERT INTO {s}.meta VALUES ('schema', 2)")
    with Queue(url_of(schema), name="v2") as q:
        q.put("after")
        assert [m.payload for m in q.reserve(wait=0)] == ["after"]
    claims = admin.execute(
        "SELECT count(*) FROM pg_proc WHERE proname = 'claim' AND pronamespace = %s::regnamespace",
        (s,),
    ).fetchone()
    assert claims == (1,)
    assert admin.execute(f"SELECT count(*) FROM {s}.waiters").fetchone() == (0,)


def _build_version(admin: Any, s: str, version: int) -> None:
    """Build schema ``s`` (quoted) as code of schema ``version`` left it."""
    for step in _schema.MIGRATIONS[:version]:
        for statement in step(s):
            admin.execute(statement)
    admin.execute(f"INSERT INTO {s}.meta VALUES ('schema', %s)", (version,))


def _build_version_with_message(admin: Any, s: str, version: int, queue: str) -> None:
    """:func:`_build_version`, with one message due now in ``queue``: id ``kept``,
    payload ``"hi"``."""
    _build_version(admin, s, version)
    admin.execute(
        f"INSERT INTO {s}.messages (queue, id, payload, encoding, due_at, seq, "
        "max_attempts, state) VALUES (%s, 'kept', '\"hi\"', 'json', 0, 1, 3, 'scheduled')",
        (queue,),
    )
    admin.execute(f"SELECT setval('{s}.seq', 1)")


def test_a_schema_of_version_9_gets_the_claim_that_fires_ahead_and_old_calls_still_claim(
    admin: Any, schema: str
) -> None:
    """Version 10 gave the claim ``ahead_ms`` (default 0) and a last column, ``now_us``:
    the upgrade drops version 9's six-argument function (one claim function is left),
    and a call in version 9's form, from a process not yet upgraded, still claims."""
    s = f'"{schema}"'
    with admin.transaction():
        _build_version_with_message(admin, s, 9, "v9")
        admin.execute(f"DROP FUNCTION {s}.claim(text, integer, bigint, text, text, bigint, bigint)")
        admin.execute(
            f"CREATE FUNCTION {s}.claim(q text, n integer, lease_ms bigint, expired text, "
            "w_id text, sleep_ms bigint) RETURNS void LANGUAGE sql AS ''"
        )
    with Queue(url_of(schema), name="v9") as q:
        q.put("soon", delay=0.05)
        claims = admin.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'claim' "
            "AND pronamespace = %s::regnamespace",
            (s,),
        ).fetchone()
        assert claims == (1,)
        row = admin.execute(
            f"SELECT id, now_us FROM {s}.claim('v9', 1, 1000, 'lease expired', NULL, 0)"
        ).fetchone()
        assert row is not None
        assert row[0] == "kept"
        assert abs(row[1] / 1e6 - time.time()) < 60
        [msg] = q.reserve(wait=2.0)
        assert msg.payload == "soon"
        assert time.time() * 1000 >= msg.due_at


def test_a_schema_of_version_3_is_upgraded_and_its_consumers_still_woken(
    admin: Any, schema: str
) -> None:
    """Version 4 changed how the claim keeps a waiter's row (marked awake, reused); a
    version-3 schema keeps its messages and its stale registrations do no harm."""
    s = f'"{schema}"'
    with admin.transaction():
        _build_version_with_message(admin, s, 3, "v3")
        admin.execute(f"INSERT INTO {s}.waiters VALUES ('v3', 'gone', 0)")
    url = url_of(schema)
    with Queue(url, name="v3") as consumer, Queue(url, name="v3") as producer:
        [msg] = consumer.reserve(wait=0)
        assert (msg.id, msg.payload) == ("kept", "hi")
        consumer.ack(msg)
        _woken(admin, schema, consumer, producer, "after")
    version = admin.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema'").fetchone()
    assert version == (_schema.VERSION,)
    options = admin.execute(
        "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (f"{s}.waiters",)
    ).fetchone()
    assert options == (["fillfactor=50"],)


def test_a_schema_of_version_4_is_upgraded_and_still_refuses_an_unknown_state(
    admin: Any, schema: str
) -> None:
    """Version 5 checks a message's state by its type (a domain, an enum from version
    7) instead of a CHECK constraint: a version-4 schema keeps its messages through
    the column's changes, and a row of an unknown state is refused as before."""
    s = f'"{schema}"'
    with admin.transaction():
        _build_version(admin, s, 4)
        for id, state, due in (("ready", "scheduled", 0), ("later", "scheduled", 2**50)):
            admin.execute(
                f"INSERT INTO {s}.messages (queue, id, payload, encoding, due_at, seq, "
                "max_attempts, state) VALUES ('v4', %s, '\"hi\"', 'json', %s, 1, 3, %s)",
                (id, due, state),
            )
        admin.execute(f"SELECT setval('{s}.seq', 1)")
    with Queue(url_of(schema), name="v4") as q:
        [msg] = q.reserve(wait=0)
        assert (msg.id, msg.payload) == ("ready", "hi")
        q.ack(msg)
        assert q.stats().scheduled == 1
        q.put("after")
        assert [m.payload for m in q.reserve(wait=0)] == ["after"]
    version = admin.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema'").fetchone()
    assert version == (_schema.VERSION,)
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        admin.execute(
            f"INSERT INTO {s}.messages (queue, id, payload, encoding, due_at, seq, "
            "max_attempts, state) VALUES ('v4', 'bad', '', 'json', 0, 2, 3, 'lost')"
        )


def test_a_schema_of_version_5_is_upgraded_and_a_consumer_asleep_through_it_still_notified(
    admin: Any, schema: str
) -> None:
    """Version 6 looks at ``waiters`` only when the ``sleep_hint`` says someone may
    sleep past a put, and compares queue names and ids bytewise: a version-5 schema
    keeps its messages, and a consumer registered asleep before the upgrade (which did
    not raise a hint) is still notified of a put due before it wakes."""
    s = f'"{schema}"'
    with admin.transaction():
        _build_version_with_message(admin, s, 5, "v5")
        admin.execute(f"INSERT INTO {s}.waiters VALUES ('v5', 'asleep', %s)", (2**50,))
    admin.execute(f'LISTEN "{statements.channel(schema)}"')
    with Queue(url_of(schema), name="v5") as q:
        [msg] = q.reserve(wait=0)
        assert (msg.id, msg.payload) == ("kept", "hi")
        q.ack(msg)
        q.put("after")
        heard = [n.payload for n in admin.notifies(timeout=1, stop_after=1)]
        assert [payload.split(" ", 1)[1] for payload in heard] == ["v5"]
        assert [m.payload for m in q.reserve(wait=0)] == ["after"]
    version = admin.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema'").fetchone()
    assert version == (_schema.VERSION,)
    collations = admin.execute(
        "SELECT attname, collname FROM pg_attribute JOIN pg_collation c ON c.oid = attcollation "
        "WHERE attrelid = %s::regclass AND attname IN ('queue', 'id') ORDER BY attname",
        (f"{s}.messages",),
    ).fetchall()
    assert collations == [("id", "C"), ("queue", "C")]


def test_a_schema_of_version_6_is_upgraded_and_its_messages_of_every_state_behave(
    admin: Any, schema: str
) -> None:
    """Version 7 makes ``state`` an enum and indexes active and dead rows in one partial
    index: a version-6 schema keeps its messages of every state through the column's
    change, each is seen and moved as before (a nack to dead sets the state from a text
    expression), and a consumer that goes to sleep after it is woken by a put (the
    queue's lock key changed with the functions)."""
    s = f'"{schema}"'
    rows = (
        # id, state, due_at, seq, attempts, max_attempts, lease, lease_until, last_error
        ("ready", "scheduled", 0, 1, 0, 3, None, None, None),
        ("later", "scheduled", 2**50, 2, 0, 3, None, None, None),
        ("held", "active", 0, 3, 1, 3, "tok", 2**50, None),
        ("expired", "active", 0, 4, 1, 1, "old", 1, None),
        ("dead", "dead", 0, 5, 3, 3, None, None, "boom"),
    )
    with admin.transaction():
        _build_version(admin, s, 6)
        for row in rows:
            admin.execute(
                f"INSERT INTO {s}.messages (queue, id, payload, encoding, state, due_at, seq, "
                "attempts, max_attempts, lease, lease_until, last_error) "
                "VALUES ('v6', %s, '\"hi\"', 'json', %s, %s, %s, %s, %s, %s, %s, %s)",
                row,
            )
        admin.execute(f"SELECT setval('{s}.seq', 5)")
    url = url_of(schema)
    with Queue(url, name="v6") as q:
        stats = q.stats()
        assert (stats.scheduled, stats.ready, stats.active, stats.dead) == (1, 1, 1, 2)
        assert [m.id for m in q.dead()] == ["expired", "dead"]
        assert [m.id for m in q.peek("active")] == ["held"]
        [msg] = q.reserve(wait=0)
        assert (msg.id, msg.payload) == ("ready", "hi")
        assert q.nack(msg, dead=True) == State.DEAD
        assert [m.id for m in q.dead()] == ["expired", "dead", "ready"]
        assert q.retry_dead(["dead"]) == 1
        retried = q.get("dead")
        assert retried is not None
        assert retried.state == State.READY
        assert q.cancel("later")
    version = admin.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema'").fetchone()
    assert version == (_schema.VERSION,)
    indexes = admin.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s ORDER BY 1", (schema,)
    ).fetchall()
    assert [name for (name,) in indexes if name.startswith("messages")] == [
        "messages_due",
        "messages_held",
        "messages_pkey",
    ]
    with Queue(url, name="v6") as consumer, Queue(url, name="v6") as producer:
        consumer.purge()
        _woken(admin, schema, consumer, producer, "after")


def test_a_schema_newer_than_the_code_is_refused(admin: Any, schema: str) -> None:
    with Queue(url_of(schema), name="x") as q:
        q.put(1)
    admin.execute(f'UPDATE "{schema}".meta SET value = {_schema.VERSION + 1}')
    with Queue(url_of(schema), name="x") as q, pytest.raises(RuntimeError, match="newer"):
        q.stats()


def test_many_processes_creating_the_schema_at_once_all_succeed(schema: str) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def first_use(n: int) -> None:
        try:
            start.wait()
            with Queue(url_of(schema), name="race") as q:
                q.put(n, id=f"m{n}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    with Queue(url_of(schema), name="race") as q:
        assert q.stats().ready == 6


# -- waking -----------------------------------------------------------------------------


def test_a_put_by_another_backend_object_wakes_a_waiting_consumer(schema: str) -> None:
    """The consumer waits longer than a test may take (its safety re-check is 30 s
    away), so only the notification can bring the message."""
    url = url_of(schema)
    with Queue(url, name="w") as consumer, Queue(url, name="w") as producer:
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.extend(consumer.reserve(wait=20)))
        thread.start()
        threading.Event().wait(0.3)  # let it sleep
        producer.put("ping", delay=0.1)
        thread.join(20)
        assert [m.payload for m in got] == ["ping"]


def test_the_async_face_is_woken_by_another_process_put(schema: str) -> None:
    url = url_of(schema)

    async def main() -> list[Any]:
        async with AsyncQueue(url, name="a") as consumer:
            waiting = asyncio.ensure_future(consumer.reserve(wait=20))
            await asyncio.sleep(0.3)

            def put() -> None:
                with Queue(url, name="a") as producer:
                    producer.put("pong")

            # In a thread: a put on the loop's thread would block the loop, and with it
            # the consumer's first connection, whose schema upgrade holds the lock the
            # producer's own upgrade then waits for (on a loaded machine, past 0.3 s).
            await asyncio.to_thread(put)
            return [m.payload for m in await waiting]

    assert asyncio.run(main()) == ["pong"]


def test_with_notify_off_a_waiting_consumer_polls(schema: str) -> None:
    url = url_of(schema)
    with (
        Queue(url, name="p", notify="off", poll_interval=0.05) as consumer,
        Queue(url, name="p") as producer,
    ):
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.extend(consumer.reserve(wait=20)))
        thread.start()
        threading.Event().wait(0.2)
        producer.put("polled")
        thread.join(20)
        assert [m.payload for m in got] == ["polled"]


def test_no_wake_up_is_lost_when_puts_race_a_consumer_going_to_sleep(schema: str) -> None:
    """A put notifies only when a registered consumer sleeps past it, so each round
    puts while the consumer (another backend object: only a notification reaches it)
    is on its way to sleep: claiming nothing, registering, arming. A lost wake-up
    leaves it asleep for its 30 s safety interval, far beyond the round's 10 s."""
    url = url_of(schema)
    rounds = 150
    rng = random.Random(19)
    got: queue.Queue[Any] = queue.Queue()
    ready = threading.Semaphore(0)
    with Queue(url, name="race") as consumer, Queue(url, name="race") as producer:

        def consume() -> None:
            for _ in range(rounds):
                ready.release()
                for message in consumer.reserve(wait=30):
                    consumer.ack(message)
                    got.put(message.payload)

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        for i in range(rounds):
            assert ready.acquire(timeout=10)
            threading.Event().wait(rng.random() * 0.004)  # somewhere in its claim
            producer.put(i)
            try:
                assert got.get(timeout=10) == i
            except queue.Empty:
                pytest.fail(f"round {i}: the consumer slept past a due message")
    thread.join(10)


def _now_ms(admin: Any) -> int:
    row = admin.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)").fetchone()
    return int(row[0])


def _sleepers(admin: Any, schema: str) -> list[str]:
    """The tokens of the consumers registered to sleep past now (none before the
    schema exists)."""
    exists = admin.execute("SELECT to_regclass(%s)", (f'"{schema}".waiters',)).fetchone()
    if exists is None or exists[0] is None:
        return []
    rows = admin.execute(
        f'SELECT waiter FROM "{schema}".waiters WHERE until > %s', (_now_ms(admin),)
    ).fetchall()
    return [row[0] for row in rows]


def _until_asleep(admin: Any, schema: str) -> list[str]:
    """Wait until a consumer is registered asleep; the sleepers' tokens."""
    while not (sleepers := _sleepers(admin, schema)):
        threading.Event().wait(0.01)
    return sleepers


def _woken(admin: Any, schema: str, consumer: Any, producer: Any, payload: Any) -> list[str]:
    """``consumer`` waits (up to 20 s) until it is registered asleep, then ``producer``
    puts ``payload``: the consumer's reserve must return just that. The sleepers'
    tokens."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.extend(consumer.reserve(wait=20)))
    thread.start()
    sleepers = _until_asleep(admin, schema)
    producer.put(payload)
    thread.join(20)
    assert [m.payload for m in got] == [payload]
    return sleepers


def test_a_consumer_sleeping_again_and_again_keeps_one_row_and_is_woken_each_time(
    admin: Any, schema: str
) -> None:
    """A backend object reuses its waiter token: each sleep updates the same row of
    ``waiters``, awake it sleeps until now (no put notifies it), and a put by another
    backend object (only its notification reaches the consumer) still wakes it."""
    url = url_of(schema)
    admin.execute(f'LISTEN "{statements.channel(schema)}"')
    with Queue(url, name="r") as consumer, Queue(url, name="r") as producer:
        tokens = set()
        for i in range(4):
            tokens.update(_woken(admin, schema, consumer, producer, i))
            assert _sleepers(admin, schema) == []
        assert len(tokens) == 1
        rows = admin.execute(f'SELECT waiter FROM "{schema}".waiters').fetchall()
        assert rows == [(tokens.pop(),)]
        list(admin.notifies(timeout=0.3))  # those of the rounds
        producer.put("nobody sleeps")
        assert [n.payload for n in admin.notifies(timeout=0.3)] == []


def test_a_closed_backend_object_leaves_no_waiter_rows(admin: Any, schema: str) -> None:
    """Each face's consumers that slept register rows in ``waiters``; closing the
    backend object deletes its own, and only its own."""
    url = url_of(schema)
    with Queue(url, name="w") as other:
        assert other.reserve(wait=0.2) == []
        with Queue(url, name="w") as consumer:
            assert consumer.reserve(wait=0.2) == []
            assert admin.execute(f'SELECT count(*) FROM "{schema}".waiters').fetchone() == (2,)

        async def sleep_async() -> None:
            async with AsyncQueue(url, name="a") as q:
                assert await q.reserve(wait=0.2) == []
                rows = admin.execute(f'SELECT queue FROM "{schema}".waiters ORDER BY 1')
                assert rows.fetchall() == [("a",), ("w",)]

        asyncio.run(sleep_async())
        rows = admin.execute(f'SELECT queue FROM "{schema}".waiters').fetchall()
        assert rows == [("w",)]
    assert admin.execute(f'SELECT count(*) FROM "{schema}".waiters').fetchone() == (0,)


@pytest.fixture
def silent_server() -> Iterator[tuple[str, socket.socket]]:
    """The URL of a server that takes the TCP connection and never answers (a first
    connection stays in libpq's startup until its ``connect_timeout``), and its
    listening socket: closing it ends those connections at once."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        yield f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=60", listener


@pytest.mark.parametrize("call", ["reserve", "put"])
def test_a_close_under_a_call_waiting_for_its_first_connection_raises_queue_closed(
    silent_server: tuple[str, socket.socket], call: str
) -> None:
    """The pool is still opening its first connection when the queue closes: the call
    waiting for it gets QueueClosed, as any call after a close does, not the pool's own
    error (the flake of test_close_wakes_a_waiting_reserve[postgres-sync] in a CI run).
    The pool fails its waiting callers once its connecting worker has stopped: the
    server goes away with the close, so that the test does not wait for the pool's
    close timeout (5 s)."""
    url, listener = silent_server
    q = Queue(url, name="c")
    outcome: queue.Queue[BaseException | None] = queue.Queue()

    def run() -> None:
        try:
            q.reserve(wait=30) if call == "reserve" else q.put("x")
        except BaseException as exc:
            outcome.put(exc)
        else:
            outcome.put(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    threading.Event().wait(0.3)  # waiting for the pool's first connection
    threading.Thread(target=q.close, daemon=True).start()
    listener.close()
    assert isinstance(outcome.get(timeout=10), QueueClosed)


def test_an_async_close_under_a_reserve_waiting_for_its_first_connection(
    silent_server: tuple[str, socket.socket],
) -> None:
    """The asyncio face of the test above."""
    url, listener = silent_server

    async def main() -> None:
        q = AsyncQueue(url, name="c")
        waiting = asyncio.create_task(q.reserve(wait=30))
        await asyncio.sleep(0.3)
        closing = asyncio.create_task(q.close())
        await asyncio.sleep(0)
        listener.close()
        with pytest.raises(QueueClosed):
            await asyncio.wait_for(waiting, 10)
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)

    asyncio.run(main())


def test_two_reserves_of_one_backend_object_sleep_under_two_tokens(admin: Any, schema: str) -> None:
    """Tokens are reused, never shared: two reserves waiting at once on one backend
    object register apart, and two puts from another backend object wake both."""
    url = url_of(schema)
    with Queue(url, name="t") as consumer, Queue(url, name="t") as producer:
        got: queue.Queue[Any] = queue.Queue()
        threads = [
            threading.Thread(target=lambda: [got.put(m.payload) for m in consumer.reserve(wait=20)])
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        while len(_sleepers(admin, schema)) < 2:
            threading.Event().wait(0.01)
        producer.put("one")
        producer.put("two")
        for thread in threads:
            thread.join(20)
        assert sorted([got.get(timeout=1), got.get(timeout=1)]) == ["one", "two"]


def test_no_wake_up_is_lost_when_many_producers_race_a_consumer_going_to_sleep(
    schema: str,
) -> None:
    """Eight producers (backend objects of their own: only a notification reaches the
    consumer) put at once, each round, while the consumer claims, registers and
    sleeps again between their puts. A lost wake-up leaves a message waiting for the
    consumer's 30 s safety interval, far beyond the 10 s allowed."""
    url = url_of(schema)
    producers, rounds = 8, 25
    got: queue.Queue[Any] = queue.Queue()
    start = threading.Barrier(producers + 1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        rng = random.Random(p)
        try:
            with Queue(url, name="many") as producer:
                for r in range(rounds):
                    start.wait(30)
                    threading.Event().wait(rng.random() * 0.01)
                    producer.put([r, p])
        except BaseException as exc:  # reported below
            errors.append(exc)
            start.abort()

    with Queue(url, name="many") as consumer:

        def consume() -> None:
            while not stop.is_set():
                for message in consumer.reserve(max=4, wait=30):
                    consumer.ack(message)
                    got.put(tuple(message.payload))

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
        for thread in threads:
            thread.start()
        consumer_thread = threading.Thread(target=consume, daemon=True)
        consumer_thread.start()
        try:
            for r in range(rounds):
                start.wait(30)
                came = set()
                for _ in range(producers):
                    try:
                        came.add(got.get(timeout=10))
                    except queue.Empty:
                        pytest.fail(f"round {r}: the consumer slept past a due message")
                assert came == {(r, p) for p in range(producers)}
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert not errors
        with Queue(url, name="many") as waker:
            waker.put("stop")  # the consumer's last reserve returns
        consumer_thread.join(30)


def test_a_put_notifies_only_when_a_consumer_sleeps_past_it(admin: Any, schema: str) -> None:
    """Most puts have nobody to wake: they send no NOTIFY (a notifying transaction
    holds a cluster-wide lock through its commit, so concurrent puts could not share
    a WAL flush); a sleeping consumer registers, and then a put notifies it."""
    url = url_of(schema)
    admin.execute(f'LISTEN "{statements.channel(schema)}"')
    with Queue(url, name="n") as consumer, Queue(url, name="n") as producer:
        producer.put("nobody waits")
        assert [n.payload for n in admin.notifies(timeout=0.3)] == []
        assert [m.payload for m in consumer.reserve()] == ["nobody waits"]
        _woken(admin, schema, consumer, producer, "wake up")
        heard = [n.payload for n in admin.notifies(timeout=1, stop_after=1)]
        assert [payload.split(" ", 1)[1] for payload in heard] == ["n"]
        # Awake, it sleeps no longer: the next put notifies nobody.
        producer.put("nobody waits again")
        assert [n.payload for n in admin.notifies(timeout=0.3)] == []


def test_a_put_notifies_only_when_it_is_due_before_what_the_sleeper_waits_for(
    admin: Any, schema: str
) -> None:
    """A consumer asleep until its queue's next message (due in 15 s) is not notified
    of one due after that, even by a few milliseconds (it will look then anyway), and
    is of one due now."""
    url = url_of(schema)
    admin.execute(f'LISTEN "{statements.channel(schema)}"')
    with Queue(url, name="e") as consumer, Queue(url, name="e") as producer:
        first = producer.get(producer.put("first", delay=15))
        assert first is not None
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.extend(consumer.reserve(wait=20)))
        thread.start()
        _until_asleep(admin, schema)
        producer.put("just after the first", at=(first.due_at + 5) / 1000)
        assert [n.payload for n in admin.notifies(timeout=0.3)] == []
        producer.put("now")
        thread.join(20)
        assert [m.payload for m in got] == ["now"]
        heard = [n.payload for n in admin.notifies(timeout=1, stop_after=1)]
        assert [payload.split(" ", 1)[1] for payload in heard] == ["e"]


def test_a_put_of_a_drawn_id_already_stored_keeps_the_stored_message(schema: str) -> None:
    """A put whose id the facade drew skips the conflict check (no stored message can
    have an id drawn now); should one have it all the same, the put stores nothing and
    reports the stored message kept, as ``on_conflict="ignore"`` does."""
    from delayq.backends.postgres import open_backend  # noqa: PLC0415
    from delayq.durable.message import put_request  # noqa: PLC0415

    def drawn(payload: bytes) -> Any:
        return put_request(
            id="0123456789abcdef0123456789abcdef", payload=payload, encoding="json",
            max_attempts=3, headers={}, delay_ms=None, at_ms=None, on_conflict="ignore",
            generated_id=True,
        )  # fmt: skip

    backend = open_backend(url_of(schema))
    try:
        assert backend.put("d", [drawn(b'"first"')]) == []
        assert backend.put("d", [drawn(b'"second"')]) == [0]
    finally:
        backend.close()
    with Queue(url_of(schema), name="d") as q:
        assert [m.payload for m in q.reserve(max=10, wait=0)] == ["first"]
        assert q.put_outcome("drawn").created


def test_a_batch_of_drawn_ids_one_already_stored_keeps_it_and_stores_the_rest(
    schema: str,
) -> None:
    """A batch whose ids the facade drew is one plain insert, without the conflict
    check; should an id be stored all the same, the insert fails and the batch is put
    as any other: the stored message stays, reported kept, and the others are stored,
    as ``on_conflict="ignore"`` does."""
    from delayq.backends.postgres import open_backend  # noqa: PLC0415
    from delayq.durable.message import put_request  # noqa: PLC0415

    def drawn(id: str, payload: bytes) -> Any:
        return put_request(
            id=id, payload=payload, encoding="json", max_attempts=3, headers={},
            delay_ms=None, at_ms=None, on_conflict="ignore", generated_id=True,
        )  # fmt: skip

    ids = [f"{n:032x}" for n in range(5)]
    backend = open_backend(url_of(schema))
    try:
        assert backend.put("d", [drawn(ids[2], b'"first"')]) == []
        batch = [drawn(id, b'"batch %d"' % n) for n, id in enumerate(ids)]
        assert backend.put("d", batch) == [2]
        assert backend.put("d", [drawn(id, b'"new"') for id in ids[:2]]) == [0, 1]
    finally:
        backend.close()
    with Queue(url_of(schema), name="d") as q:
        got = {m.id: m.payload for m in q.reserve(max=10, wait=0)}
    assert got == {ids[0]: "batch 0", ids[1]: "batch 1", ids[2]: "first",
                   ids[3]: "batch 3", ids[4]: "batch 4"}  # fmt: skip


def test_a_put_of_one_stores_what_a_batch_put_stores(schema: str) -> None:
    """The put of one message runs as a statement prepared on its connection and sent
    through libpq with its parameters as bytes; a batch goes through psycopg. Both
    store the same message: text beyond ASCII, headers, max_attempts, a stored id kept,
    and each way of giving the due time."""
    import datetime  # noqa: PLC0415

    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
    items: list[dict[str, Any]] = [
        {"payload": {"t": "é☃\u0000", "n": [1, 2]}, "id": "é-☃-1", "headers": {"k": "ü"},
         "max_attempts": 7},
        {"payload": "later", "id": "two", "delay": 3600},
        {"payload": [None, 1.5], "id": "three", "at": at},
        {"payload": "again", "id": "two"},  # kept: the stored one stays
    ]  # fmt: skip
    with Queue(url_of(schema), name="one") as one, Queue(url_of(schema), name="many") as many:
        assert [one.put(**item) for item in items] == ["é-☃-1", "two", "three", "two"]
        assert many.put_many(items) == ["é-☃-1", "two", "three", "two"]
        for id in ("é-☃-1", "two", "three"):
            a, b = one.get(id), many.get(id)
            assert a is not None
            assert b is not None
            assert (a.payload, a.headers, a.max_attempts, a.attempts, a.state) == (
                b.payload, b.headers, b.max_attempts, b.attempts, b.state,
            )  # fmt: skip
            assert abs(a.due_at - b.due_at) < 60_000
        assert one.stats().total == many.stats().total == 3


def test_a_put_prepares_its_statement_again_when_the_server_forgot_it(schema: str) -> None:
    """A prepared statement the connection lost (``DEALLOCATE ALL``, or ``DISCARD ALL``
    by a pooler) is prepared again by the next put, which stores its message; on both
    faces. One the backend did not know it had prepared (a call cut short before the
    reply) is used as it is."""
    with Queue(url_of(schema), name="p") as q:
        q.put("before")
        kept = q.backend._kept  # type: ignore[attr-defined]
        assert kept is not None
        kept.execute("DEALLOCATE ALL")
        q.put("after")
        q.backend._prepared.clear()  # type: ignore[attr-defined]
        q.put("unknown")
        assert [m.payload for m in q.reserve(max=10, wait=0)] == ["before", "after", "unknown"]

    async def async_face() -> None:
        async with AsyncQueue(url_of(schema), name="a") as aq:
            await aq.put("before")
            kept = aq.backend._kept  # type: ignore[attr-defined]
            assert kept is not None
            await kept.execute("DISCARD ALL")
            await aq.put("after")
            assert [m.payload for m in await aq.reserve(max=10, wait=0)] == ["before", "after"]

    asyncio.run(async_face())


def test_an_async_put_cancelled_while_the_server_holds_it_leaves_the_backend_usable(
    schema: str,
) -> None:
    """The put of one message waits for libpq's reply on the loop. Cancelled while the
    server holds it (another session locks the table), it leaves its connection in the
    middle of the command: that connection is never used again, and the next put, which
    another connection serves, stores its message. The cancelled put may or may not be
    stored (the server runs it once the lock goes); nothing else is lost."""

    async def main() -> None:
        async with AsyncQueue(url_of(schema), name="c") as aq:
            await aq.put("first")
            with psycopg.connect(BASE) as locker:
                locker.execute(f'LOCK TABLE "{schema}".messages IN EXCLUSIVE MODE')
                held = asyncio.ensure_future(aq.put("held"))
                await asyncio.sleep(0.3)
                assert not held.done()
                held.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await held
                locker.rollback()
            await aq.put("next")
            payloads = sorted(m.payload for m in await aq.reserve(max=10, wait=1))
            assert payloads in (["first", "next"], ["first", "held", "next"])

    asyncio.run(main())


# -- a put inside the caller's transaction ------------------------------------------------


def test_enqueue_in_a_committed_transaction_stores_the_message(admin: Any, schema: str) -> None:
    from delayq.backends.postgres import enqueue  # noqa: PLC0415

    with Queue(url_of(schema), name="tx") as q:
        q.put("warm")  # the schema exists; enqueue would create it otherwise
        q.reserve()
        with psycopg.connect(BASE) as conn:
            with conn.transaction():
                conn.execute("SELECT 1")  # the caller's own work
                id = enqueue(conn, "tx", {"order": 42}, schema=schema, headers={"k": "v"})
                assert q.get(id) is None  # not committed: nobody else sees it
            [msg] = q.reserve(wait=10)
        assert (msg.id, msg.payload, msg.headers) == (id, {"order": 42}, {"k": "v"})


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(schema: str) -> None:
    from delayq.backends.postgres import enqueue  # noqa: PLC0415

    with psycopg.connect(BASE) as conn:
        try:
            with conn.transaction():
                enqueue(conn, "tx", "never", schema=schema, id="gone")
                raise ZeroDivisionError  # the caller's work fails: rolled back
        except ZeroDivisionError:
            pass
        with pytest.raises(ValueError, match="on_conflict"):
            enqueue(conn, "tx", "bad", schema=schema, on_conflict="maybe")  # type: ignore[arg-type]
    with Queue(url_of(schema), name="tx") as q:
        assert q.get("gone") is None
        assert q.stats().total == 0


def test_enqueue_async_on_an_async_connection(schema: str) -> None:
    from delayq.backends.postgres import enqueue_async  # noqa: PLC0415

    async def main() -> str:
        async with await psycopg.AsyncConnection.connect(BASE) as conn, conn.transaction():
            return await enqueue_async(conn, "tx", "hello", schema=schema, delay=0.05)

    id = asyncio.run(main())
    with Queue(url_of(schema), name="tx") as q:
        [msg] = q.reserve(wait=10)
        assert (msg.id, msg.payload) == (id, "hello")


def test_a_producer_putting_one_by_one_holds_one_connection(admin: Any, schema: str) -> None:
    """The pool opens connections only as calls need them: one producer, its puts
    one after another, holds one server connection (and reuses one server process,
    whose caches stay warm), not the pool's first one plus another opened while the
    first was on its way."""
    name = f"delayq-test-{uuid.uuid4().hex[:8]}"
    with Queue(url_of(schema, application_name=name), name="one") as q:
        for i in range(20):
            q.put(i)
        count = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchone()
        assert count == (1,)
        assert q.stats().ready == 20


def test_a_connection_the_server_dropped_is_replaced_after_one_failed_call(
    admin: Any, schema: str
) -> None:
    """A lone caller runs on the connection the last call left; when the server has
    dropped it meanwhile, that call fails (as on a pooled connection found broken) and
    the next one runs on a new connection, on both faces."""
    name = f"delayq-test-{uuid.uuid4().hex[:8]}"
    url = url_of(schema, application_name=name)

    def drop() -> None:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        )

    with Queue(url, name="k") as q:
        q.put("before")
        drop()
        with pytest.raises(psycopg.OperationalError):
            q.put("lost")
        q.put("after")
        assert [m.payload for m in q.reserve(max=10, wait=0)] == ["before", "after"]

    async def async_face() -> None:
        async with AsyncQueue(url, name="a") as aq:
            await aq.put("before")
            drop()
            with pytest.raises(psycopg.OperationalError):
                await aq.put("lost")
            await aq.put("after")
            assert [m.payload for m in await aq.reserve(max=10, wait=0)] == ["before", "after"]

    asyncio.run(async_face())


def test_a_url_without_host_keeps_its_slashes() -> None:
    assert parse_url("postgresql:///app").conninfo.startswith("postgresql:///app?")


# -- the delayq command -------------------------------------------------------------------


def test_the_cli_works_on_a_postgresql_url(schema: str) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from delayq.cli import main  # noqa: PLC0415

    url = url_of(schema)

    def delayq(*args: str) -> str:
        result = CliRunner().invoke(main, [*args, "--url", url])
        assert result.exit_code == 0, result.output
        return result.stdout

    assert delayq("put", "jobs", '{"order": 42}', "--id", "o-42", "--delay", "1h") == "o-42\n"
    assert '"order": 42' in delayq("get", "jobs", "o-42", "--json")
    assert "jobs" in delayq("stats")
    delayq("cancel", "jobs", "o-42")
    with Queue(url, name="jobs") as q:
        assert q.get("o-42") is None


def test_an_async_claim_cancelled_just_before_a_close_is_given_back(schema: str) -> None:
    """A reserve cancelled while its claim is on the wire, and the queue closed at
    once: the close waits for the claim's reply and gives back what it took, so the
    next consumer finds the message ready, not held until its lease runs out."""
    from delayq.backends.postgres import AsyncPostgresBackend  # noqa: PLC0415

    def linger(backend: Any, claimed: threading.Event) -> None:
        assert isinstance(backend, AsyncPostgresBackend)
        read = backend._read

        async def claim_then_linger(statement: str, params: Any, change: Any = None) -> Any:
            rows = await read(statement, params, change)
            if change == "reserve":
                claimed.set()
                await asyncio.sleep(0.3)  # the close comes before this reply
            return rows

        backend._read = claim_then_linger  # type: ignore[method-assign]

    given_back_by_the_close(url_of(schema), linger)


def test_a_task_cancelled_as_the_pool_hands_it_a_connection_ends_cancelled() -> None:
    """A waiting client of psycopg_pool waits with ``asyncio.wait_for``, which before
    Python 3.12 drops a cancellation that comes as the connection is handed over: the
    task got the connection and ran on (here, with the pool's own getconn, about one in
    two of these cancellations). The backend takes its connections through
    ``getconn_async``: every task cancelled while it waited ends cancelled, and the
    connection is back in the pool."""
    from psycopg_pool import AsyncConnectionPool  # noqa: PLC0415

    from delayq.backends.postgres._runner import getconn_async  # noqa: PLC0415

    async def main() -> tuple[int, int]:
        cancelled = ran_on = 0
        async with AsyncConnectionPool(BASE, min_size=1, max_size=1, open=False) as pool:
            await pool.open(wait=True, timeout=10)
            for trial in range(300):
                held = await pool.getconn()

                async def take() -> None:
                    await pool.putconn(await getconn_async(pool, 10))

                task = asyncio.create_task(take())
                for _ in range(3):
                    await asyncio.sleep(0)  # waiting in the pool's queue
                await pool.putconn(held)  # handed over to the waiting task...
                for _ in range(trial % 6):
                    await asyncio.sleep(0)
                if not task.cancel():  # ...which is cancelled on its way back
                    continue
                try:
                    await task
                except asyncio.CancelledError:
                    cancelled += 1
                else:
                    ran_on += 1
            async with pool.connection(timeout=5) as conn:  # none was lost
                await conn.execute("SELECT 1")
        return cancelled, ran_on

    try:
        cancelled, ran_on = asyncio.run(main())
    except psycopg.OperationalError as exc:
        unavailable("postgres", f"{BASE}: {exc}")
    assert cancelled > 0
    assert ran_on == 0
