"""``amqp://``'s sync face sends its calls from the caller's thread (docs/rabbitmq.md,
"The sync face's path"): a request is published on the backend object's sync
connection by the thread that calls, which reads the reply there (that 16 threads'
calls leave from their threads, and together: test_amqp_coalesce.py). Checked here:
the sync connection closed by the broker under calls of four threads (each call
still returns, each put stored once); a new queue's first call and the calls after it
made from the caller's thread while the link's loop is held (no loop thread starts);
reserves, waiting ones too, served while the link's loop thread is blocked; a sync
consumer's loop of reserve and ack_many (its next reserve sent with its acks, taken
by its next call) made from its threads, no loop thread started; what that reserve
sent ahead claimed and nobody took given back uncharged; a waiting reserve
interrupted gives back what it claimed, whether its answer was on its way or not;
the sync connection closed under waiting reserves loses and doubles nothing.

The tests use the shared RabbitMQ under a namespace (``prefix``) of their own, deleted
afterwards; the schedulers are ``delayq scheduler`` processes of the test's own.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from backends.test_amqp_fastput import client, scheduler
from backends.test_amqp_thread_put import calls_under_closes
from conformance.conftest import amqp_url
from delayq.backends._replicated._link import ThreadLink, _core, _direct
from delayq.backends.amqp._blocking import BlockingClient
from delayq.durable import Queue, State

pytest.importorskip("pika")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace)


def test_the_sync_connection_closed_under_calls_loses_and_doubles_nothing(url: str) -> None:
    """The broker closes the sync connection three times while four threads put (plain
    puts) and read back: every call returns (sent again on a new connection), and each
    put is stored once."""
    with (
        scheduler(url),
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=30) as queue,
    ):
        queue.stats()

        def put_and_get(k: int, i: int) -> str:
            id = queue.put(i, id=f"{k}-{i}", delay=3600)
            assert queue.get(id) is not None
            return id

        acked = calls_under_closes(url, put_and_get)
        assert len(acked) == len(set(acked))
        assert queue.stats().scheduled == len(acked)


@pytest.fixture
def links(monkeypatch: pytest.MonkeyPatch) -> list[ThreadLink]:
    """The sync links (ThreadLink) the test's queues start, in order."""
    started: list[ThreadLink] = []
    start = ThreadLink._start

    def spy(self: ThreadLink) -> None:
        started.append(self)
        start(self)

    monkeypatch.setattr(ThreadLink, "_start", spy)
    return started


@contextlib.contextmanager
def loop_held(link: ThreadLink) -> Iterator[None]:
    """``link``'s loop held until the block ends, if it has one (a link makes its loop
    and the loop's thread when a call first needs them: none, nothing runs there)."""
    release = threading.Event()
    ran = threading.Event()

    def hold() -> None:
        ran.set()
        release.wait(60)

    loop = getattr(link, "_loop", None)
    if loop is not None:
        loop.call_soon_threadsafe(hold)
        assert ran.wait(10)
    try:
        yield
    finally:
        release.set()


def test_sync_reserves_go_from_the_callers_thread_while_the_loop_thread_is_blocked(
    url: str, links: list[ThreadLink]
) -> None:
    """Once a scheduler answered, a sync consumer's reserves (waiting, parked at the
    scheduler until a put; without wait; one held until a due time a moment ahead),
    acks and a fast put all go and come back while the link's loop thread cannot run
    (an ``ack_many`` after a waiting reserve, which sends the next reserve ahead, too:
    the consumer's loop below)."""
    with (
        scheduler(url),
        Queue(client(url), name="jobs", request_timeout=10) as queue,
        ThreadPoolExecutor(1) as pool,
    ):
        queue.stats()  # the first call: a scheduler answered this link
        with loop_held(links[-1]):  # the queue's (a scheduler's wait had one)
            waiting = pool.submit(queue.reserve, wait=10, max=5)
            time.sleep(0.5)  # parked at the scheduler
            assert not waiting.done()
            id = queue.put("now")  # a fast put, from this thread
            assert [m.id for m in waiting.result(timeout=5)] == [id]
            queue.ack(waiting.result()[0])
            started = time.monotonic()  # before the put: its due time counts from it
            later = queue.put("later", delay=0.3)
            got = pool.submit(queue.reserve, wait=5).result(timeout=6)
            assert [m.id for m in got] == [later]
            assert time.monotonic() - started >= 0.25  # held until its due time
            queue.ack(got[0])
            queue.put("plain", id="plain")
            got = pool.submit(queue.reserve, wait=0).result(timeout=5)
            assert [m.id for m in got] == ["plain"]
            queue.ack(got[0])
            assert queue.stats().ready == 0


def test_a_sync_producers_first_call_and_the_rest_go_from_its_thread(
    url: str, links: list[ThreadLink]
) -> None:
    """A new sync queue's first call (it declares the namespace, asks who stands) and
    the calls after it (fast and plain puts, reads, a reserve without wait, an ack, a
    cancel) are made from the caller's thread while the link's loop cannot run: a
    program that only puts and reads never needs the loop's thread (none starts)."""
    with (
        scheduler(url),
        Queue(client(url), name="jobs", request_timeout=10) as warm,
        ThreadPoolExecutor(1) as pool,
    ):
        warm.stats()  # the scheduler is elected
        with Queue(client(url), name="jobs", request_timeout=10) as queue:
            link = links[-1]
            with loop_held(link):

                def calls() -> tuple[str, list[str]]:
                    first = queue.put("fast")  # the first call: a fast put
                    plain = queue.put("plain", id="plain", delay=3600)
                    assert queue.get(first) is not None
                    assert queue.stats().scheduled == 1
                    got = queue.reserve(wait=0)
                    queue.ack(got[0])
                    assert queue.cancel(plain)
                    return first, [m.id for m in got]

                first, got = pool.submit(calls).result(timeout=20)
                assert got == [first]
            assert getattr(link, "_thread", None) is None  # no loop thread ever started


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The operations the sync connections publish (to the scheduler), in order."""
    ops: list[str] = []
    request = BlockingClient.request

    def spy(self: BlockingClient, op: str, *args: Any) -> None:
        ops.append(op)
        request(self, op, *args)

    monkeypatch.setattr(BlockingClient, "request", spy)
    return ops


def _consume_a_round(queue: Queue, sent: list[str]) -> None:
    """A sequential consumer's round: put, reserve (waiting), ack_many; the next
    reserve leaves with the acks."""
    id = queue.put("x")
    got = queue.reserve(wait=5, max=10)
    assert [m.id for m in got] == [id]
    queue.ack_many(got)
    assert sent[-1] == "reserve"  # sent ahead, before the caller asks


def test_a_sync_consumers_loop_goes_from_its_threads_and_starts_no_loop_thread(
    url: str, links: list[ThreadLink], sent: list[str]
) -> None:
    """A pure client's (``scheduler=off``) reserve and ack_many in a loop, each reserve
    after the first taking the answer of the one sent with the acks, go on from the
    caller's thread; then three threads consume on that object (reserve waiting,
    ack_many) what a fourth puts, while the link's loop could not run: each message
    is received once, and no loop thread ever started (nor its connection)."""
    with (
        scheduler(url),
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=10) as queue,
        ThreadPoolExecutor(4) as pool,
    ):
        queue.stats()
        link = links[-1]
        for _ in range(3):
            _consume_a_round(queue, sent)
        with loop_held(link):
            received: collections.Counter[str] = collections.Counter()
            stop = threading.Event()

            def consume() -> None:
                while not stop.is_set():
                    messages = queue.reserve(wait=0.2, max=3)
                    received.update(m.id for m in messages)
                    assert queue.ack_many(messages) == []

            def put() -> list[str]:
                return [queue.put(i) for i in range(60)]

            consumers = [pool.submit(consume) for _ in range(3)]
            put_ids = pool.submit(put).result(timeout=30)
            deadline = time.monotonic() + 30
            while sum(received.values()) < len(put_ids) and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            for consumer in consumers:
                consumer.result(timeout=10)
            assert sorted(received) == sorted(put_ids)
            assert set(received.values()) == {1}
            _consume_a_round(queue, sent)
        assert getattr(link, "_thread", None) is None  # no loop thread ever started
        stats = queue.stats()
        assert stats.ready == stats.active == 0


def test_what_a_sync_reserve_sent_ahead_claimed_and_nobody_took_is_given_back_uncharged(
    url: str, links: list[ThreadLink], sent: list[str]
) -> None:
    """The reserve a sequential sync consumer's ack_many sends ahead claims a message
    due now; the consumer then does something else (no call) while the link's loop
    could not run: the message is given back as if never claimed (ready, no attempt
    charged), and another consumer gets it at its first attempt."""
    with (
        scheduler(url),
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=10) as queue,
        Queue(client(url), name="jobs", request_timeout=10) as other,
        ThreadPoolExecutor(1) as pool,
    ):
        queue.stats()
        other.stats()
        link = links[-2]  # the first queue's
        _consume_a_round(queue, sent)

        def round() -> None:
            queue.put("a", id="a")
            first = queue.reserve(wait=5, max=10)
            other.put("b", id="b")  # due now: the reserve sent ahead claims it at once
            queue.ack_many(first)
            assert sent[-1] == "reserve"

        with loop_held(link):
            pool.submit(round).result(timeout=20)
            # Nobody takes what it claimed: given back, well before its lease (30 s).
            deadline = time.monotonic() + 10
            while (seen := other.get("b")) and seen.state != State.READY:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert seen is not None
            assert (seen.state, seen.attempts, seen.last_error) == (State.READY, 0, None)
            taken = other.reserve(wait=2, max=10, lease=60)
            assert [(m.id, m.attempts) for m in taken] == [("b", 1)]
            other.ack_many(taken)
        assert getattr(link, "_thread", None) is None


class _Interrupted(BaseException):
    """What a timeout's signal handler raises in the test's main thread."""


@contextlib.contextmanager
def interrupt_after(seconds: float) -> Iterator[None]:
    """Raise _Interrupted in this (main) thread after ``seconds``, as a timeout does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("put_before", [False, True])
def test_an_interrupted_waiting_sync_reserve_gives_back_what_it_claimed(
    url: str, put_before: bool
) -> None:
    """A waiting sync reserve is interrupted (a timeout's exception in its thread)
    while it is parked, or about when a put claims a message for it (its answer on its
    way, or read already): the message is not kept for the abandoned reserve until its
    lease ends; another consumer gets it at once, its first attempt. Rounds at several
    delays between the put and the interrupt (a reserve that returned the message
    before the interrupt acks it)."""
    with (
        scheduler(url),
        Queue(client(url), name="jobs", request_timeout=10) as queue,
        Queue(client(url), name="jobs", request_timeout=10) as producer,
        Queue(client(url), name="jobs", request_timeout=10) as other,
        ThreadPoolExecutor(1) as pool,
    ):
        queue.stats()
        producer.stats()

        def put_after(seconds: float, id: str) -> None:
            time.sleep(seconds)
            producer.put(id, id=id)

        interrupted = 0
        for round in range(10):
            id = f"m{round}"
            put = pool.submit(put_after, 0.28 + 0.003 * round, id) if put_before else None
            got: list[Any] | None = None
            try:
                with interrupt_after(0.3):
                    got = queue.reserve(wait=10, lease=60)
            except _Interrupted:
                interrupted += 1
            if put is None:
                producer.put(id, id=id)
            else:
                put.result()
            if got is not None:
                assert [m.id for m in got] == [id]
                queue.ack(got[0])
                continue
            started = time.monotonic()
            # Given back, not kept for the 60 s lease (a loaded CI machine once took
            # more than 5 s).
            taken = other.reserve(wait=15, lease=60)
            assert [(m.id, m.attempts) for m in taken] == [(id, 1)], round
            assert time.monotonic() - started < 15, round
            other.ack(taken[0])
            stats = queue.stats()
            assert stats.ready == stats.active == 0
        assert interrupted >= 3


#: The consumers' lease: an answer read by nobody before its connection closed comes
#: back after it; the calls between a reserve and its ack take well under it.
LEASE = 10


def test_the_sync_connection_closed_under_waiting_reserves_loses_and_doubles_nothing(
    url: str,
) -> None:
    """The broker closes the sync connection three times while four threads put and
    reserve (waiting) and ack on one queue object: every call returns; every message
    put is received by a consumer once and acked (one whose answer went with a closed
    connection is given back, or comes back after its lease), none twice."""
    received: collections.Counter[str] = collections.Counter()
    lost: list[str] = []
    with (
        scheduler(url),
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=30) as queue,
    ):
        queue.stats()

        def put_and_take(k: int, i: int) -> str:
            id = queue.put(i, id=f"{k}-{i}")
            messages = queue.reserve(wait=0.5, max=3, lease=LEASE)
            received.update(m.id for m in messages)
            lost.extend(queue.ack_many(messages))
            return id

        put = calls_under_closes(url, put_and_take)
        deadline = time.monotonic() + 4 * LEASE
        while sum(received.values()) < len(put) and time.monotonic() < deadline:
            messages = queue.reserve(wait=1, max=100, lease=LEASE)
            received.update(m.id for m in messages)
            lost.extend(queue.ack_many(messages))
        assert lost == []
        assert sorted(received) == sorted(put)
        assert set(received.values()) == {1}
        stats = queue.stats()
        assert stats.ready == stats.active == stats.scheduled == 0


def test_the_sync_connection_closed_under_reserves_sent_ahead_loses_and_doubles_nothing(
    url: str,
) -> None:
    """The broker closes the sync connections three times while a sequential consumer
    (one thread: reserve waiting, then ack_many, which sends its next reserve ahead)
    takes what three threads of another queue object put: every call returns; every
    message put is received once and acked (one claimed by a reserve sent ahead whose
    connection went is given back, or comes back after its lease), none twice."""
    received: collections.Counter[str] = collections.Counter()
    lost: list[str] = []
    with (
        scheduler(url),
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=30) as consumer,
        Queue(f"{client(url)}&fast_put=off", name="jobs", request_timeout=30) as producer,
    ):
        consumer.stats()
        producer.stats()

        def take() -> None:
            messages = consumer.reserve(wait=0.5, max=3, lease=LEASE)
            received.update(m.id for m in messages)
            lost.extend(consumer.ack_many(messages))

        def put_or_take(k: int, i: int) -> str:
            if k == 0:
                take()
                return ""
            return producer.put(i, id=f"{k}-{i}")

        put = [id for id in calls_under_closes(url, put_or_take) if id]
        deadline = time.monotonic() + 4 * LEASE
        while sum(received.values()) < len(put) and time.monotonic() < deadline:
            take()
        assert lost == []
        assert sorted(received) == sorted(put)
        assert set(received.values()) == {1}
        stats = consumer.stats()
        assert stats.ready == stats.active == stats.scheduled == 0


@pytest.mark.parametrize("where", ["decoding its answer", "after its answer"])
def test_a_sync_reserve_interrupted_once_its_answer_was_read_gives_it_back(
    url: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interruption that lands after a waiting reserve's answer was read, as it is
    decoded or once it is (a timeout's exception at any bytecode: the CI run that found
    it hit one), still gives back what the answer claimed: another consumer gets it at
    once, its first attempt, not after the abandoned reserve's 60 s lease."""
    owner, name = (
        (_direct.Direct, "_outcome")
        if where == "decoding its answer"
        else (_core.LinkCore, "called")
    )
    original = getattr(owner, name)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if args[1] == "reserve" or (len(args) > 2 and args[2] == "reserve"):
            raise _Interrupted
        return original(*args, **kwargs)

    with (
        scheduler(url),
        Queue(client(url), name="jobs", request_timeout=10) as queue,
        Queue(client(url), name="jobs", request_timeout=10) as other,
    ):
        queue.stats()
        other.stats()
        queue.put("m", id="m")
        monkeypatch.setattr(owner, name, interrupted)
        with pytest.raises(_Interrupted):
            queue.reserve(wait=1, lease=60)
        monkeypatch.setattr(owner, name, original)
        taken = other.reserve(wait=5, lease=60)
        assert [(m.id, m.attempts) for m in taken] == [("m", 1)]
