"""What a forked child must not inherit, known without a system call per use.

``os.getpid()`` is a system call each time (glibc stopped caching it), and on a
virtual machine a system call is no longer cheap: the hot paths compare
:func:`generation` instead, which a fork handler bumps in the child.

Message ids are time-ordered, as UUIDv7 and ULID lay them out: the wall clock in
milliseconds (48 bits) then 80 bits, as 32 lowercase hex digits. A store keyed by id
(PostgreSQL's and SQLite's btrees) then inserts at the end of its index, in pages that
are in cache and that split full, rather than at a random place in the whole index.
Within one millisecond a thread's ids keep rising too (UUIDv7's counter methods): the
first takes 79 random bits, each next one is the last plus 1, so a batch drawn in one
millisecond is inserted in order as well (with random bits only, its ids would land in
random order in the last pages and split them half empty). A random step instead of
1 would make the next id harder to guess, which nothing relies on (a caller may name
its messages ``order-42``), and would cost a draw per id. Threads and processes draw
from pools of their own and start each millisecond at random, which is what keeps
their ids apart (the 79 random bits would have to fall within a run's length of each
other); a thread whose clock steps back keeps its last millisecond until the clock
passes it, so its ids never go back. The random starts come from a per-thread pool
drawn :data:`ID_BATCH` at a time, which a forked child replaces with a fresh one: a
child drawing from its parent's pool, or going on from its parent's last id, would
repeat its ids.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator

__all__ = ["ID_BATCH", "generation", "new_id", "new_ids"]

#: Random starts drawn from one ``os.urandom`` call (10 bytes each).
ID_BATCH = 256

_generation = 0
_time_ns = time.time_ns
_START = (1 << 79) - 1  # the random bits a millisecond's first id starts from


class _Pool(threading.local):
    """This thread's millisecond and count of ids, and its random starts not used yet
    (a pool per thread: one shared iterator would need a lock where threads truly run
    at once). The count holds whole ids (timestamp and tail) as numbers, and taking
    one is one C call: a signal handler that draws an id in the middle of a draw gets
    another one."""

    ms = -1
    count: Iterator[int] = iter(())
    starts: Iterator[int] = iter(())


_pool = _Pool()


def generation() -> int:
    """How many forks this process descends from (0 in the first process): a value
    saved before a fork differs from it in the child."""
    return _generation


def new_id() -> str:
    """A new message id, 32 lowercase hex digits: the wall clock's milliseconds (12
    digits) then 80 bits (20 digits), 79 random bits for the thread's first id in
    that millisecond and the last one plus 1 after it (one ``os.urandom`` call per
    :data:`ID_BATCH` milliseconds the thread draws ids in)."""
    pool = _pool
    ms = _time_ns() // 1_000_000
    if ms > pool.ms:
        pool.ms = ms
        pool.count = itertools.count(ms << 80 | _start(pool))
    return next(pool.count).to_bytes(16, "big").hex()


def new_ids(count: int) -> list[str]:
    """``count`` new ids, as ``count`` calls of :func:`new_id` in one millisecond would
    draw them (a batch's: the clock read once, a third of the cost of an id). They are
    taken from the thread's count in one C call, so a signal handler that draws an id
    meanwhile gets another one."""
    pool = _pool
    ms = _time_ns() // 1_000_000
    if ms > pool.ms:
        pool.ms = ms
        pool.count = itertools.count(ms << 80 | _start(pool))
    return [n.to_bytes(16, "big").hex() for n in list(itertools.islice(pool.count, count))]


def _start(pool: _Pool) -> int:
    """A random 79-bit start, from the thread's pool of them."""
    try:
        return next(pool.starts)
    except StopIteration:
        raw = os.urandom(10 * ID_BATCH)
        at = range(0, len(raw), 10)
        starts = pool.starts = iter([int.from_bytes(raw[i : i + 10], "big") & _START for i in at])
        return next(starts)


def _after_fork_in_child() -> None:
    global _generation, _pool
    _generation += 1
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
