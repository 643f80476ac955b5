"""Generated message ids: 32 lowercase hex digits, time-ordered (the clock's milliseconds
then 80 random bits), never the same twice, in threads and across a fork (each thread
draws from a pool of its own; a forked child gets new ones)."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time

import pytest

from delayq._fork import ID_BATCH, new_id

HEX32 = re.compile(r"[0-9a-f]{32}")


def test_threads_drawing_at_once_never_share_an_id() -> None:
    drawn: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(8)

    def draw(into: list[str]) -> None:
        start.wait()
        into.extend(new_id() for _ in range(3 * ID_BATCH + 7))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [id for into in drawn for id in into]
    assert len(set(ids)) == len(ids) == 8 * (3 * ID_BATCH + 7)
    assert all(HEX32.fullmatch(id) for id in ids)


def _draw_in_child(out: multiprocessing.connection.Connection) -> None:
    out.send([new_id() for _ in range(ID_BATCH)])


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_id()  # the parent's pool holds ids not handed out yet when it forks
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_draw_in_child, args=(sender,))
    child.start()
    parents = [new_id() for _ in range(ID_BATCH)]
    childs = receiver.recv()
    child.join(30)
    assert child.exitcode == 0
    assert not set(parents) & set(childs)


def _ms_of(id: str) -> int:
    return int(id[:12], 16)


def test_an_id_starts_with_the_milliseconds_it_was_drawn_at() -> None:
    before = time.time_ns() // 1_000_000
    id = new_id()
    after = time.time_ns() // 1_000_000
    assert HEX32.fullmatch(id)
    assert before <= _ms_of(id) <= after


def _next_millisecond() -> None:
    start = time.time_ns() // 1_000_000
    while time.time_ns() // 1_000_000 <= start:
        pass


def test_a_threads_ids_rise_within_and_across_milliseconds() -> None:
    drawn = [new_id()]
    for _ in range(4):
        _next_millisecond()
        drawn += [new_id() for _ in range(ID_BATCH + 3)]  # many in one millisecond
    assert drawn == sorted(drawn)
    assert len(set(drawn)) == len(drawn)
    assert len({_ms_of(id) for id in drawn}) >= 5


def test_each_millisecond_of_a_thread_starts_at_random() -> None:
    """What keeps threads and processes apart: the 80 bits after the timestamp start
    each millisecond at random (79 random bits), not at a count."""
    starts = []
    for _ in range(40):
        _next_millisecond()
        starts.append(int(new_id()[12:], 16))
    assert len(set(starts)) == len(starts)
    assert all(start < 2**79 for start in starts)
    assert max(starts) - min(starts) > 2**70
    assert any(start >= 2**78 for start in starts)
