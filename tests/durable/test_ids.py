"""Generated message ids: 32 lowercase hex digits, never the same twice, in threads and
across a fork (each thread draws from a pool of its own; a forked child gets new ones)."""

from __future__ import annotations

import multiprocessing
import re
import threading

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
