"""What a forked child must not inherit, known without a system call per use.

``os.getpid()`` is a system call each time (glibc stopped caching it), and on a
virtual machine a system call is no longer cheap: the hot paths compare
:func:`generation` instead, which a fork handler bumps in the child. Message ids come
from a per-thread pool of random bytes drawn :data:`ID_BATCH` ids at a time, which the
child replaces: a child drawing from its parent's pool would repeat its ids.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

__all__ = ["ID_BATCH", "generation", "new_id"]

#: Generated ids drawn from one ``os.urandom`` call (16 random bytes each).
ID_BATCH = 256

_generation = 0


class _Pool(threading.local):
    """The ids this thread has not handed out yet (a pool per thread: one shared
    iterator would need a lock where threads truly run at once)."""

    ids: Iterator[str] = iter(())


_pool = _Pool()


def generation() -> int:
    """How many forks this process descends from (0 in the first process): a value
    saved before a fork differs from it in the child."""
    return _generation


def new_id() -> str:
    """A new message id: 128 random bits as 32 lowercase hex digits, as uuid4 has, from
    the thread's pool (one ``os.urandom`` call per :data:`ID_BATCH` ids)."""
    try:
        return next(_pool.ids)
    except StopIteration:
        return _refill()


def _refill() -> str:
    digits = os.urandom(16 * ID_BATCH).hex()
    ids = _pool.ids = iter([digits[start : start + 32] for start in range(0, len(digits), 32)])
    return next(ids)


def _after_fork_in_child() -> None:
    global _generation, _pool
    _generation += 1
    _pool = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
