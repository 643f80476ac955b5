"""What a forked child must not inherit, known without a system call per use.

``os.getpid()`` is a system call each time (glibc stopped caching it), and on a
virtual machine a system call is no longer cheap: the hot paths compare
:func:`generation` instead, which a fork handler bumps in the child. Message ids come
from a pool of random bytes drawn :data:`ID_BATCH` ids at a time, which the child
empties: a child drawing from its parent's pool would repeat its ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["ID_BATCH", "generation", "new_id"]

#: Generated ids drawn from one ``os.urandom`` call (16 random bytes each).
ID_BATCH = 256

_generation = 0


#: The ids not yet handed out. ``next()`` of a list iterator is one step under the GIL,
#: so threads share it without a lock and never get the same id; two threads refilling
#: at once each draw fresh bytes, and the pool left over is simply dropped.
_ids: Iterator[str] = iter(())


def generation() -> int:
    """How many forks this process descends from (0 in the first process): a value
    saved before a fork differs from it in the child."""
    return _generation


def new_id() -> str:
    """A new message id: 128 random bits as 32 lowercase hex digits, as uuid4 has, from
    the process's pool (one ``os.urandom`` call per :data:`ID_BATCH` ids)."""
    try:
        return next(_ids)
    except StopIteration:
        return _refill()


def _refill() -> str:
    global _ids
    digits = os.urandom(16 * ID_BATCH).hex()
    ids = iter([digits[start : start + 32] for start in range(0, len(digits), 32)])
    _ids = ids
    return next(ids)


def _after_fork_in_child() -> None:
    global _generation, _ids
    _generation += 1
    _ids = iter(())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
