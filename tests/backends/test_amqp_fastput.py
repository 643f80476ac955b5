"""``amqp://``'s fast put (docs/rabbitmq.md, "Fast put"): ``put()`` with
``on_conflict="ignore"`` appends to the intake stream itself and returns on its confirm;
the scheduler folds it. Checked here: the fast and the plain path both match the
conformance suite's model, the same backend object reads its own writes at once
(scheduler in another process), a scheduler killed with puts in the intake that it has
not folded (and one put appended twice) loses and doubles nothing, a fast put made while
no scheduler runs is kept and delivered later, puts past the live bytes' limit turn
the clients back to the plain path, which refuses them, and puts the intake's retention
dropped before a scheduler folded them are said lost.

The tests use the shared RabbitMQ under a namespace (``prefix``) of their own, deleted
afterwards; the schedulers are ``delayq scheduler`` processes of the test's own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from backends.test_amqp_checkpoint import events, stream_messages
from backends.test_amqp_coalesce import scheduler_process
from conformance.conftest import amqp_url
from conformance.test_model import QueueModel
from delayq.backends._replicated import _scheduler as scheduler_module
from delayq.backends._replicated._link import _core
from delayq.backends._replicated._scheduler import _group_commit, _intake
from delayq.backends.amqp._transport import AmqpTransport
from delayq.durable import AsyncQueue, Queue
from delayq.errors import NoScheduler

pika = pytest.importorskip("pika")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace)


def client(url: str) -> str:
    """``url`` for a pure client (never a scheduler)."""
    return url.replace("scheduler=on", "scheduler=off")


def intake(url: str) -> list[tuple[bytes, Any]]:
    """``(body, the request ids of its puts)`` of every put message of the intake (not
    the markers of new schedulers, which look for its end)."""
    return [
        (body, [put[0] for put in msgpack.unpackb(body)[4]])
        for kind, body in stream_messages(url, "intake")
        if kind == "puts"
    ]


def append_to_intake(url: str, *bodies: bytes, kind: str | None = None) -> None:
    """Append ``bodies`` to the intake, as messages of type ``kind`` (None: puts)."""
    prefix = url.split("prefix=", 1)[1].split("&", 1)[0]
    connection = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(delivery_mode=2, type=kind)
        for body in bodies:
            channel.basic_publish("", f"{prefix}.intake", body, properties)
    finally:
        connection.close()


@contextlib.contextmanager
def scheduler(url: str) -> Iterator[Any]:
    process = scheduler_process(url)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


@pytest.mark.parametrize("fast_put", ["on", "on-loop", "off"])
def test_fast_and_plain_puts_match_the_model(
    url: str, fast_put: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conformance suite's state machine, on each path: the same observable results
    (what every call returns, stats at every step, get() of every id at the end). A
    fast put of the sync face is appended from its caller's thread (``on``) or, when the
    transport offers no publisher for that, through the link's loop (``on-loop``)."""
    if fast_put == "on-loop":
        monkeypatch.setattr(AmqpTransport, "blocking", lambda self, *_: None)
    # Each run on a queue of its own name, all on one client backend (its connections
    # opened once: what a run checks is the queue's calls).
    root_url = f"{client(url)}&fast_put={fast_put.removesuffix('-loop')}"
    runs = itertools.count()
    with scheduler(url), Queue(root_url, name="model", max_payload=None) as root:
        run_state_machine_as_test(
            lambda: QueueModel(root.named(f"model-{next(runs)}"), False),
            settings=settings(
                max_examples=25,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            ),
        )
    if fast_put != "off":
        assert intake(url)  # the model's puts went through the intake
    else:
        assert intake(url) == []


def test_the_same_queue_reads_its_own_fast_puts(url: str) -> None:
    """Put, then get and cancel by id at once, from a client whose scheduler runs in
    another process: every later call of the same object sees the put."""
    with scheduler(url), Queue(client(url), name="jobs") as queue:
        queue.stats()  # the scheduler is elected
        for i in range(100):
            id = queue.put(i, id=f"m{i}", delay=60)
            message = queue.get(id)
            assert message is not None
            assert message.payload == i
            if i % 2:
                assert queue.cancel(id) is True
            else:
                assert queue.put_outcome("again", id=id).created is False
        assert queue.stats().scheduled == 50
        assert sum(len(ids) for _, ids in intake(url)) == 100
        queue.purge()


def test_a_scheduler_killed_with_puts_it_has_not_folded_loses_and_doubles_nothing(
    url: str,
) -> None:
    """A scheduler frozen (SIGSTOP) while a client puts, then killed (SIGKILL): the
    puts confirmed by the intake and never folded by it are folded by its successor,
    with those it folded before and one intake message appended twice, each once."""
    first = scheduler_process(url)
    try:
        with Queue(client(url), name="jobs", request_timeout=30) as queue:
            queue.stats()  # the first process is elected
            acked = [queue.put(i) for i in range(200)]
            assert queue.stats().ready == 200  # folded (the request waited for them)
            first.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            acked += [queue.put(i) for i in range(200, 500)]
            put_seconds = time.monotonic() - started
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
            body, _ = intake(url)[-1]
            append_to_intake(url, body)  # as a client resending an unconfirmed append
            with scheduler(url):
                messages = queue.reserve(wait=5, max=1000)
                seen = [message.id for message in messages]
                while len(seen) < 500:
                    more = queue.reserve(wait=2, max=1000)
                    if not more:
                        break
                    seen += [message.id for message in more]
                    messages += more
                queue.ack_many(messages)
                assert queue.stats().ready == 0
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
            first.wait(10)
    assert put_seconds < 25  # the puts did not wait for the frozen scheduler
    assert len(seen) == len(set(seen)) == 500
    assert set(seen) == set(acked)


def test_a_fast_put_while_no_scheduler_runs_is_kept_and_delivered_later(url: str) -> None:
    """Puts made while no scheduler runs return (the intake keeps them) and reach a
    consumer once one runs; a close after that scheduler stopped, with a reserve sent
    ahead by the last acks, does not wait the request timeout for an answer."""
    with Queue(client(url), name="jobs", request_timeout=30) as queue:
        started = time.monotonic()
        ids = [queue.put(i, delay=0.2) for i in range(20)]
        assert time.monotonic() - started < 10  # no scheduler to wait for
        with scheduler(url), Queue(client(url), name="jobs") as other:
            got = queue.reserve(wait=10, max=100)
            while len(got) < 20:
                more = queue.reserve(wait=5, max=100)
                assert more
                got += more
            assert sorted(message.id for message in got) == sorted(ids)
            assert [message.payload for message in got] == list(range(20))
            queue.ack_many(got)
            assert other.stats().ready == other.stats().active == 0
        closing = time.monotonic()
    assert time.monotonic() - closing < 15  # bounded by CLOSE_SETTLE, not the 30 s


def test_fast_puts_past_the_limit_turn_clients_to_the_plain_path(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A fast put cannot be refused once the intake confirmed it: the scheduler takes
    it past the live bytes' limit (a quarter of the retention) and tells the clients,
    whose next puts take the plain path and get LogFull; once there is room again, a
    plain put is taken and the fast path comes back."""
    small = f"{url}&retention_bytes=1000000"
    with Queue(small, name="jobs") as queue:
        # Elected first, so that its reader tails the intake from the first put on: a
        # slow election (a loaded machine) could leave 1 MB of fast puts to the
        # intake's retention before any scheduler read them (said lost: below).
        queue.stats()
        stored = 0
        refused: OSError | None = None
        for _ in range(200):
            try:
                queue.put("z" * 10_000)
            except OSError as exc:
                refused = exc
                break
            stored += 1
        assert refused is not None
        assert "quarter of the log's retention" in str(refused)
        assert 20 <= stored < 200
        assert queue.stats().ready == stored  # every put that returned is kept
        assert any(r.getMessage().startswith("put_over_limit") for r in caplog.records)
        before = len(intake(url))
        queue.purge()
        queue.put("z" * 10_000)  # the plain path (the client was told) takes it
        queue.put("z" * 10_000)  # and the next one is fast again
        assert len(intake(url)) == before + 1
        assert queue.stats().ready == 2
        queue.purge()


def test_a_client_the_scheduler_forgot_is_not_held_forever(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request waits behind its client's fast puts; a scheduler that no longer knows
    the client (it remembers CLIENTS_KEPT of them, here 1) appends a marker to the
    intake and releases the request once it reads it back."""
    monkeypatch.setattr(_intake, "CLIENTS_KEPT", 1)
    with Queue(url, name="jobs") as scheduling:
        scheduling.stats()  # this process is elected
        with (
            Queue(client(url), name="jobs", request_timeout=5) as first,
            Queue(client(url), name="jobs", request_timeout=5) as second,
        ):
            first.put(1, id="first")
            second.put(2, id="second")
            assert second.get("second") is not None  # folded: the first is forgotten
            message = first.get("first")  # waits behind a marker, not forever
            assert message is not None
            assert message.payload == 1
        scheduling.purge()


def test_fast_puts_the_intake_dropped_before_they_were_folded_are_said_lost(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No scheduler runs while the intake outgrows its retention: the stream drops its
    oldest segments, with puts nobody folded. The next scheduler says so (an error,
    ``intake_lost``, and the count in ``scheduler_elected``) and folds what is left."""
    caplog.set_level(logging.INFO, logger="delayq")
    small = f"{url}&retention_bytes=1000000"  # segments of 125 kB
    with Queue(small, name="jobs") as queue:
        queue.put("kept", id="kept")
        assert queue.get("kept") is not None  # folded: the log says up to where
    with Queue(client(small), name="jobs", request_timeout=5) as producer:
        producer.put("lost", id="lost")  # confirmed by the intake, not folded
    # 2.5 MB of markers (nothing to fold) after it: the retention drops its segment.
    append_to_intake(url, *[b"\x00" * 100_000] * 25, kind="marker")
    assert all("lost" not in str(body) for body, _ in intake(url))  # dropped
    assert not events(caplog, "intake_lost")
    with Queue(small, name="jobs") as queue:
        queue.put("after", id="after")
        assert queue.get("after") is not None
        assert queue.get("kept") is not None
        assert queue.get("lost") is None
        [lost] = events(caplog, "intake_lost")
        assert lost["offsets"] > 1
        assert events(caplog, "scheduler_elected")[-1]["intake_lost"] == lost["offsets"]
        queue.purge()


def test_fast_puts_dropped_before_any_scheduler_read_the_intake_are_said_lost(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A namespace no scheduler has read yet: a client's fast puts go to the intake, and
    its retention drops them before the first scheduler is elected. That scheduler
    reads the intake from its start (offset 0), so it finds them gone and says so, as
    for a scheduler that had folded before (rather than begin at the first offset
    left, and lose them unsaid)."""
    caplog.set_level(logging.INFO, logger="delayq")
    small = f"{url}&retention_bytes=1000000"  # segments of 125 kB
    with Queue(client(small), name="jobs", request_timeout=5) as producer:
        producer.put("lost", id="lost")  # confirmed by the intake; no scheduler yet
    append_to_intake(url, *[b"\x00" * 100_000] * 25, kind="marker")
    assert all("lost" not in str(body) for body, _ in intake(url))  # dropped
    with Queue(small, name="jobs") as queue:
        queue.put("after", id="after")
        assert queue.get("after") is not None
        assert queue.get("lost") is None
        [lost] = events(caplog, "intake_lost")
        assert lost["expected"] == 0
        assert lost["offsets"] > 1
        assert events(caplog, "scheduler_elected")[-1]["intake_lost"] == lost["offsets"]
        queue.purge()


def publish_request(url: str, kind: str, body: bytes) -> None:
    """Publish ``body`` to the scheduler's request exchange as a request ``kind``."""
    prefix = url.split("prefix=", 1)[1].split("&", 1)[0]
    connection = pika.BlockingConnection(pika.URLParameters(url.split("?", 1)[0]))
    try:
        channel = connection.channel()
        properties = pika.BasicProperties(type=kind, correlation_id="bad", reply_to="nobody")
        channel.basic_publish(f"{prefix}.rpc", "rpc", body, properties)
    finally:
        connection.close()


def test_bytes_that_are_no_put_or_request_are_said_and_skipped(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who may publish to the namespace can append bytes to the intake, or send
    the scheduler a request, that delayq never wrote. The scheduler logs each
    (``intake_bad``, ``fast_put_dropped``, ``request_bad``) and goes on folding puts and
    serving requests."""
    caplog.set_level(logging.INFO, logger="delayq")
    with Queue(url, name="jobs") as queue:
        queue.put("before", id="before")
        assert queue.get("before") is not None
        append_to_intake(url, b"\xc1 not msgpack", msgpack.packb([1, 2]))
        append_to_intake(url, msgpack.packb(["c", 1, 0, 0, [["r", "jobs", "no"]]]))
        publish_request(url, "put", b"\xc1 not msgpack")
        publish_request(url, "batch", msgpack.packb([["put", 1]]))
        publish_request(url, "cancel", msgpack.packb([]))
        with Queue(client(url), name="jobs") as producer:
            producer.put("after", id="after")  # folded after the bad ones (close waits)
        assert queue.get("after") is not None
        assert [m.payload for m in queue.reserve(max=10, wait=1)] == ["before", "after"]
        assert len(events(caplog, "intake_bad")) == 2
        assert len(events(caplog, "fast_put_dropped")) == 1  # a message, its put bad
        assert len(events(caplog, "request_bad")) == 3


def nudge(url: str, body: bytes) -> None:
    """Send ``body`` (an intake message) to the scheduler alone, as the copy a fast put
    due soon routes to it (here without the intake's)."""
    publish_request(url, "puts", body)


def logged_puts(url: str, request_id: str) -> int:
    """How many put operations of the log carry ``request_id``."""
    return sum(
        1
        for kind, body in stream_messages(url, "log")
        if kind == "entry"
        for op in msgpack.unpackb(body)
        if op[0] == "put" and op[2] == request_id
    )


def test_a_nudged_put_is_folded_at_once_once_and_in_its_clients_order(url: str) -> None:
    """A client sends an intake message that puts something due now to the scheduler
    too (a nudge): the scheduler folds it before the intake holds it, but only once
    every earlier message of that client is folded (a nudge that would overtake one is
    ignored: first put wins for one id); the intake's copy is then skipped by request
    id, the put is logged once, and a successor replays the same state."""
    with Queue(client(url), name="jobs", request_timeout=30) as queue:
        with scheduler(url) as first:
            queue.stats()  # the scheduler is elected
            queue.put("template", id="template")
            template = msgpack.unpackb(intake(url)[-1][0])
            queue.purge()
            _, _, floor, ceil, [[_, name, [request]]] = template

            def message(seq: int, parts: list[tuple[str, str, str]]) -> bytes:
                puts = [
                    [rid, name, [[id, json.dumps(payload).encode(), *request[2:]]]]
                    for rid, id, payload in parts
                ]
                return msgpack.packb(["nudging-client", seq, floor, ceil, puts])

            one = message(1, [("r1", "x", "a")])
            two = message(2, [("r2", "x", "b"), ("r3", "y", "c")])
            nudge(url, two)  # message 1 is not folded: ignored
            nudge(url, one)  # folded at once, before the intake holds it
            deadline = time.monotonic() + 10
            while queue.get("x") is None:
                assert time.monotonic() < deadline, "the nudged put was not folded"
                time.sleep(0.01)
            assert queue.get("x").payload == "a"  # type: ignore[union-attr]
            assert queue.get("y") is None
            append_to_intake(url, one)
            append_to_intake(url, two)
            while queue.get("y") is None:
                assert time.monotonic() < deadline, "the intake was not folded"
                time.sleep(0.01)
            assert queue.get("x").payload == "a"  # type: ignore[union-attr]
            assert queue.stats().ready == 2
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        assert [logged_puts(url, rid) for rid in ("r1", "r2", "r3")] == [1, 1, 1]
        with scheduler(url):
            messages = queue.reserve(wait=10, max=10)
            assert sorted((m.id, m.payload) for m in messages) == [("x", "a"), ("y", "c")]
            queue.ack_many(messages)
            assert queue.reserve(wait=0.5, max=10) == []


def logged_put_ids(url: str) -> collections.Counter[str]:
    """How many put operations of the log carry each request id."""
    return collections.Counter(
        op[2]
        for kind, body in stream_messages(url, "log")
        if kind == "entry"
        for op in msgpack.unpackb(body)
        if op[0] == "put"
    )


def test_folded_puts_linger_but_no_caller_waits_for_them_and_a_successor_folds_them(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler (in this process) holds the log append of what it folded from the
    intake for a while, made far longer than any call's wait here (60 s): a request
    behind the puts is answered all the same, its append carrying them; a waiting
    consumer gets a put due now at once; a scheduler stopped while its folds linger
    leaves them to its successor, which folds each once."""
    monkeypatch.setattr(_group_commit, "LINGER_MS", 60_000)
    with Queue(client(url), name="jobs", request_timeout=10) as queue:
        with Queue(url, name="jobs", request_timeout=10) as elected:
            elected.stats()  # this process's scheduler is elected
            ids = [queue.put(i, delay=60) for i in range(20)]
            time.sleep(0.5)  # the tail folds them; their append lingers
            first = [rid for _, rids in intake(url) for rid in rids]
            assert not set(first) & set(logged_put_ids(url))
            assert queue.get(ids[-1]) is not None  # behind the puts, not behind the linger
            logged = logged_put_ids(url)  # one read of the log (each takes a second)
            assert all(logged[rid] == 1 for rid in first)

            with (
                ThreadPoolExecutor(1) as pool,
                Queue(client(url), name="jobs", request_timeout=10) as consumer,
            ):
                waiting = pool.submit(consumer.reserve, wait=10)
                time.sleep(0.3)  # parked
                now = queue.put("now")
                assert [m.id for m in waiting.result()] == [now]

            late = [queue.put(i, delay=60) for i in range(20, 40)]
            time.sleep(0.5)
            lingering = [rid for _, rids in intake(url) for rid in rids if rid not in first]
            assert len(lingering) == 21
            logged = logged_put_ids(url)
            assert sum(logged[rid] for rid in lingering) == 1  # "now"
        with scheduler(url):
            assert queue.stats().scheduled == 40
            assert all(queue.get(id) is not None for id in ids + late)
    logged = logged_put_ids(url)
    assert all(logged[rid] == 1 for rid in first + lingering)


def test_schedulers_killed_right_after_puts_one_at_a_time_lose_and_double_nothing(
    url: str,
) -> None:
    """Three schedulers in turn, each killed (SIGKILL) as soon as the last of 100 puts
    one at a time returned, with folds of them not yet appended to the log: the next
    one folds those again; each message is stored once."""
    acked: list[str] = []
    with Queue(client(url), name="jobs", request_timeout=30) as queue:
        for _ in range(3):
            process = scheduler_process(url)
            try:
                queue.stats()  # elected, and what came before is folded
                acked += [queue.put(i) for i in range(100)]
            finally:
                process.send_signal(signal.SIGKILL)
                process.wait(10)
        with scheduler(url):
            seen: list[str] = []
            while len(seen) < 300:
                messages = queue.reserve(wait=5, max=1000)
                if not messages:
                    break
                seen += [message.id for message in messages]
                queue.ack_many(messages)
            assert queue.stats().ready == 0
    assert len(seen) == len(set(seen)) == 300
    assert set(seen) == set(acked)


def test_a_put_due_now_is_copied_to_the_scheduler_only_while_a_reserve_waits(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no reserve waiting, the scheduler (in this process) tells the clients
    ``quiet`` on the first copy of a put due now (a nudge) and they stop copying: the
    intake's tail brings their puts (all stored); once a reserve parks they copy again,
    and the waiting consumer gets the put."""
    nudges: list[bytes] = []
    on_nudge = scheduler_module.Scheduler._on_nudge

    def spy(self: scheduler_module.Scheduler, body: bytes) -> None:
        nudges.append(body)
        on_nudge(self, body)

    monkeypatch.setattr(scheduler_module.Scheduler, "_on_nudge", spy)
    monkeypatch.setattr(_core, "QUIET_HOLD", 60.0)  # longer than the test
    with (
        Queue(url, name="jobs", request_timeout=10) as elected,
        Queue(client(url), name="jobs", request_timeout=10) as queue,
    ):
        elected.stats()  # this process's scheduler is elected
        queue.put("first")
        assert queue.stats().ready == 1
        assert len(nudges) == 1
        time.sleep(0.5)  # ``quiet`` reaches the client
        for i in range(20):
            queue.put(i)
        assert queue.stats().ready == 21
        assert len(nudges) == 1
        queue.purge()
        with ThreadPoolExecutor(1) as pool, Queue(client(url), name="jobs") as consumer:
            waiting = pool.submit(consumer.reserve, wait=10)
            time.sleep(0.5)  # parked; ``nudge`` reaches the client
            now = queue.put("now")
            assert [m.id for m in waiting.result()] == [now]
        assert len(nudges) == 2


def _slow_fold(monkeypatch: pytest.MonkeyPatch, every: float | None) -> None:
    """Make the scheduler of this process take each intake message ``every`` s after
    the one before it (None: never), markers included, in the intake's order: as a
    scheduler whose fold lags behind a burst of fast puts or a slow broker."""
    last = [0.0]

    def slowed(take: Any) -> Any:
        def slow(self: scheduler_module.Scheduler, *message: Any) -> None:
            if every is None:
                return
            loop = asyncio.get_running_loop()
            last[0] = max(last[0], loop.time()) + every
            loop.call_at(last[0], take, self, *message)

        return slow

    for name in ("_on_intake", "_on_marker"):
        monkeypatch.setattr(
            scheduler_module.Scheduler, name, slowed(getattr(scheduler_module.Scheduler, name))
        )


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_request_behind_a_long_fold_waits_while_the_fold_advances(
    url: str, monkeypatch: pytest.MonkeyPatch, face: str
) -> None:
    """A request made after fast puts waits until the scheduler folded them (read
    your writes). A fold that takes longer than the client's request timeout but
    advances (one intake message every 0.5 s: six puts, 3 s; a request timeout of
    1.5 s) is said to the client every second, and the request is answered once the
    fold reaches it, every put seen, instead of failing at its timeout."""
    _slow_fold(monkeypatch, 0.5)
    with Queue(url, name="jobs", request_timeout=10) as elected:
        elected.stats()  # this process's scheduler is elected
        if face == "sync":
            with Queue(client(url), name="jobs", request_timeout=1.5) as queue:
                for i in range(6):
                    queue.put(i)
                started = time.monotonic()
                purged = queue.purge()
                took = time.monotonic() - started
        else:

            async def puts_then_purge() -> tuple[int, float]:
                async with AsyncQueue(client(url), name="jobs", request_timeout=1.5) as queue:
                    for i in range(6):
                        await queue.put(i)
                    started = time.monotonic()
                    purged = await queue.purge()
                    return purged, time.monotonic() - started

            purged, took = asyncio.run(puts_then_purge())
    assert purged == 6
    assert took > 1.5  # it waited past its request timeout, for the fold


def test_a_request_behind_a_fold_that_does_not_advance_still_times_out(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait past the request timeout lasts only while the fold advances: a
    scheduler whose fold is stuck says nothing, and the request fails at its
    timeout as any request that gets no answer."""
    _slow_fold(monkeypatch, None)
    with (
        Queue(url, name="jobs", request_timeout=10) as elected,
        Queue(client(url), name="jobs", request_timeout=1.5) as queue,
    ):
        elected.stats()
        queue.put("never folded")
        started = time.monotonic()
        with pytest.raises(NoScheduler):
            queue.stats()
        took = time.monotonic() - started
    assert 1.4 < took < 6.0
