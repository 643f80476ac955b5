"""``amqp://``'s sync fast put from its caller's thread (docs/rabbitmq.md, "Fast put
from a thread"): the sync face appends a put to the intake on a connection of its own
(``delayq.backends.amqp._blocking``), not through its loop thread. Checked here: the
same outcomes as the loop's path (the model test of test_amqp_fastput.py runs both),
the puts of many threads at once each stored once and folded in each thread's order,
the intake connection closed by the broker under puts (each put still returns, stored
once), a caller that gives up while it waits for its turn (its put is not appended,
the next puts are), and a close with puts still waiting (each appended and seen by
the next process).

The tests use the shared RabbitMQ under a namespace (``prefix``) of their own, deleted
afterwards; the schedulers are ``delayq scheduler`` processes of the test's own.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.test_amqp_checkpoint import connections, prefix_of
from backends.test_amqp_fastput import (
    append_to_intake,
    client,
    intake,
    logged_put_ids,
    scheduler,
)
from conformance.conftest import amqp_url
from delayq import QueueClosed
from delayq.backends.amqp import _blocking
from delayq.durable import Queue

pytest.importorskip("pika")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with contextlib.closing(amqp_url(tmp_path)) as namespace:
        yield next(namespace)


def test_many_threads_put_each_once_folded_in_each_threads_order(url: str) -> None:
    """16 threads put one by one into three queues through one backend object: every
    put is stored once, and each thread's puts into a queue were folded in the order
    it made them (their ``seq`` rises); several puts left in one intake message."""
    with scheduler(url), Queue(client(url), name="q0") as queue:
        queue.stats()  # the scheduler is elected
        queues = [queue, queue.named("q1"), queue.named("q2")]
        made: dict[int, list[tuple[int, str]]] = {k: [] for k in range(16)}

        def produce(k: int) -> None:
            for i in range(60):
                target = queues[i % 3]
                made[k].append((i % 3, target.put({"k": k, "i": i}, id=f"{k}-{i}", delay=60)))

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for k, puts in made.items():
            for index in range(3):
                seqs = []
                for which, id in puts:
                    if which == index:
                        message = queues[index].get(id)
                        assert message is not None
                        assert message.payload == {"k": k, "i": int(id.split("-")[1])}
                        seqs.append(message.seq)
                assert seqs == sorted(seqs)
        assert sum(q.stats().scheduled for q in queues) == 16 * 60
        messages = intake(url)
        assert sum(len(ids) for _, ids in messages) == 16 * 60  # each appended once
        assert len(messages) < 16 * 60  # and some together


def sync_connections(url: str) -> list[str]:
    """The pids of the namespace's sync connections (``delayq <prefix> sync``: the
    fast puts and the calls of the callers' threads)."""
    named = f'{{"connection_name","delayq {prefix_of(url)} sync"}}'
    return [
        line.split("\t", 1)[0] for line in connections("pid", "client_properties") if named in line
    ]


def calls_under_closes(url: str, call: Callable[[int, int], str]) -> list[str]:
    """What four threads' ``call(k, i)`` returned (k: the thread, i: its count), made one
    after another while the broker closes the namespace's sync connection three times
    (each time one is open, 0.3 s apart); every call returned (an error fails)."""
    stop = threading.Event()
    returned: list[str] = []
    errors: list[BaseException] = []

    def calls(k: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                returned.append(call(k, i))
            except BaseException as exc:
                errors.append(exc)
                return
            i += 1

    threads = [threading.Thread(target=calls, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    closed = 0
    deadline = time.monotonic() + 60
    while closed < 3:
        assert time.monotonic() < deadline
        time.sleep(0.3)
        for pid in sync_connections(url):
            subprocess.run(
                ["rabbitmqctl", "close_connection", pid, "closed by the test"],
                capture_output=True,
                timeout=60,
                check=True,
            )
            closed += 1
    time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []
    return returned


def test_an_intake_connection_closed_under_puts_loses_and_doubles_nothing(url: str) -> None:
    """The broker closes the sync connection three times while four threads put:
    every put returns (appended again on a new connection), each stored once, and
    folded once (counted in the log), even the puts of an intake message appended
    twice (as a client does that saw no confirm before its connection closed)."""
    with scheduler(url), Queue(client(url), name="jobs", request_timeout=30) as queue:
        queue.stats()
        acked = calls_under_closes(url, lambda k, i: queue.put(i, id=f"{k}-{i}", delay=3600))
        assert len(acked) == len(set(acked))
        entries = intake(url)
        body, _ = entries[-1]
        append_to_intake(url, body)  # as a client resending an append it saw no confirm of
        queue.put("last", id="last", delay=3600)  # folded after that copy
        assert queue.get("last") is not None  # behind the folds: they are logged
        assert queue.stats().scheduled == len(acked) + 1
        for id in acked[:: max(1, len(acked) // 50)]:
            assert queue.get(id) is not None
    # Each put folded once, whether its client appended it twice (a confirm lost with
    # its connection) or not.
    appended = collections.Counter(rid for _, rids in entries for rid in rids)
    assert len(appended) == len(acked)  # one request id per put, however often appended
    folded = logged_put_ids(url)
    assert {rid: folded[rid] for rid in appended} == dict.fromkeys(appended, 1)


def test_a_put_given_up_while_it_waits_is_not_appended_and_the_next_ones_are(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put waits behind another thread's slow append and its caller gives up (an
    alarm's exception): it is not appended, the slow one is, and the lead goes on to
    the next puts."""
    append = _blocking.BlockingClient.append
    slow = threading.Event()

    def slow_append(self: Any, body: bytes, *, nudge: bool, deadline: float) -> None:
        if slow.is_set():
            time.sleep(1.0)
        append(self, body, nudge=nudge, deadline=deadline)

    class GaveUp(Exception):
        pass

    def give_up(signum: int, frame: Any) -> None:
        raise GaveUp

    monkeypatch.setattr(_blocking.BlockingClient, "append", slow_append)
    previous = signal.signal(signal.SIGALRM, give_up)
    try:
        with scheduler(url), Queue(client(url), name="jobs") as queue:
            queue.stats()
            queue.put("warm", id="warm")  # the intake connection is open
            slow.set()
            leader = threading.Thread(target=lambda: queue.put("slow", id="slow"))
            leader.start()
            time.sleep(0.2)  # the leader is in its append
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(GaveUp):
                queue.put("given up", id="given-up")
            leader.join()
            slow.clear()
            queue.put("next", id="next")
            assert queue.get("slow") is not None
            assert queue.get("next") is not None
            assert queue.get("given-up") is None
            assert "given-up" not in {id for _, ids in intake(url) for id in ids}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_close_appends_the_puts_still_waiting_and_refuses_later_ones(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts of eight threads wait behind a slow append when the queue is closed: the
    close waits for them (each returns, and another process sees it), and a put after
    the close is refused."""
    append = _blocking.BlockingClient.append

    def slow_append(self: Any, body: bytes, *, nudge: bool, deadline: float) -> None:
        time.sleep(0.2)
        append(self, body, nudge=nudge, deadline=deadline)

    with scheduler(url):
        queue = Queue(client(url), name="jobs")
        queue.stats()
        monkeypatch.setattr(_blocking.BlockingClient, "append", slow_append)
        returned: list[str] = []
        threads = [
            threading.Thread(target=lambda k=k: returned.append(queue.put(k, id=f"p{k}")))
            for k in range(8)
        ]
        for thread in threads:
            thread.start()
        waiting = queue._backend._link._waiting  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while len(waiting) < 7:  # the first one is being appended
            assert time.monotonic() < deadline
            time.sleep(0.005)
        queue.close()
        for thread in threads:
            thread.join()
        assert sorted(returned) == [f"p{k}" for k in range(8)]
        with pytest.raises(QueueClosed):
            queue.put("late")
        monkeypatch.undo()
        with Queue(client(url), name="jobs") as other:
            assert {m.id for m in other.reserve(max=10, wait=5)} == set(returned)
