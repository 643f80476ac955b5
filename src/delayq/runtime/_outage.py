"""A backend that stops answering: which errors say so, and how the long-running
consumers (the Worker, the callback dispatcher of ``delayq serve``) ride it out.

:class:`Outage` is shared by the loops of one consumer. The first failure starts an
outage; every try fails again until the backend answers, each after twice the pause
of the one before (from ``first`` up to ``longest``), and each new pause is one log
line naming the backend's URL without its password: a lost Redis logs 0.5 s, 1 s,
2 s ... then one line every ``longest`` seconds, not one per failed call. The first
call that succeeds ends it with one line saying how long it lasted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import sys
import time
from collections.abc import Callable

from .._log import log_event, log_raised
from ..durable.registry import redact_url
from ._constants import BACKEND_RETRY_MAX

__all__ = ["Outage", "backend_outages", "error_kind", "is_outage"]


#: The outages of every backend; redis-py's are added by :func:`backend_outages`.
_BASE_OUTAGES: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncio.TimeoutError,  # not TimeoutError before Python 3.11
    sqlite3.OperationalError,
)


@functools.cache
def backend_outages() -> tuple[type[Exception], ...]:
    """The exceptions that mean "the backend does not answer" (Redis down, a SQLite
    file locked or gone), not a bug of delayq: an outage to wait out, or a 503 over
    HTTP, never a 500. Imports redis-py when it is installed."""
    types = list(_BASE_OUTAGES)
    try:
        from redis import exceptions as redis_errors  # noqa: PLC0415
    except ImportError:  # pragma: no cover  (redis is optional)
        return tuple(types)
    types += [
        redis_errors.ConnectionError,
        redis_errors.TimeoutError,
        redis_errors.BusyLoadingError,
        redis_errors.ReadOnlyError,
    ]
    for name in ("ClusterDownError", "TryAgainError", "MasterDownError"):
        extra = getattr(redis_errors, name, None)
        if isinstance(extra, type) and issubclass(extra, Exception):
            types.append(extra)
    return tuple(types)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :func:`backend_outages` (redis-py is not imported
    for it: none of its errors can have been raised before it was)."""
    if isinstance(exc, _BASE_OUTAGES):
        return True
    return "redis.exceptions" in sys.modules and isinstance(exc, backend_outages())


def error_kind(exc: BaseException) -> str:
    """What went wrong, without its text (which holds addresses and paths): the
    exception's class name, or ``timeout``."""
    return "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__


def _detail(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


class Outage:
    """The state of one backend as the loops of one consumer see it: up, or down
    since when, and how long to pause before the next try.

    ``url`` is logged redacted (:func:`~delayq.durable.registry.redact_url`). Events
    are ``<event_prefix>.backend_unavailable url=... error=... detail=...
    retry_in=...`` at each step (ERROR) and ``<event_prefix>.backend_back url=...
    after=...`` (WARNING). ``on_change`` is called with the error's kind at each step
    of an outage (not for a bug) and with None when it ends.
    """

    def __init__(
        self,
        url: str,
        *,
        event_prefix: str,
        first: float,
        longest: float = BACKEND_RETRY_MAX,
        on_change: Callable[[str | None], None] | None = None,
    ) -> None:
        if not 0 < first <= longest:
            raise ValueError(f"need 0 < first <= longest, got {first!r} and {longest!r}")
        self._url = redact_url(url)
        self._prefix = event_prefix
        self._first, self._longest = float(first), float(longest)
        self._on_change = on_change
        self._since: float | None = None
        self._pause = 0.0
        self._retry_at = 0.0

    @property
    def down(self) -> bool:
        """True from a failure to the next success."""
        return self._since is not None

    def failed(self, exc: Exception, *, failed_event: str, **fields: object) -> float:
        """Note a failed call; the seconds to pause before trying again.

        The first failure, and the first one after each pause, takes the next step
        (the pause doubles) and logs it; a failure of another loop within the same
        pause waits for the same moment, unlogged. An exception that is not an
        outage (:func:`is_outage`) is rather a bug: it is backed off the same
        way but logged as ``failed_event`` with ``fields`` and its traceback.
        """
        now = time.monotonic()
        if self._since is None:
            self._since, self._pause = now, self._first
        elif now >= self._retry_at - self._pause / 10:  # a loop's sleep may end early
            self._pause = min(self._pause * 2, self._longest)
        else:
            return self._retry_at - now
        self._retry_at = now + self._pause
        retry_in = f"{self._pause:g}s"
        if not is_outage(exc):
            log_raised(logging.ERROR, failed_event, exc, **fields, retry_in=retry_in)
            return self._pause
        kind = error_kind(exc)
        log_event(
            logging.ERROR,
            f"{self._prefix}.backend_unavailable",
            url=self._url,
            error=kind,
            detail=_detail(exc),
            retry_in=retry_in,
        )
        if self._on_change is not None:
            self._on_change(kind)
        return self._pause

    def answered(self) -> None:
        """Note a call that succeeded: the end of an outage, if there was one."""
        if self._since is None:
            return
        after = time.monotonic() - self._since
        self._since = None
        # A warning, not info: the end of an outage belongs with its error lines, in a
        # log that keeps warnings only too (`delayq serve` shows no info of its own).
        log_event(
            logging.WARNING, f"{self._prefix}.backend_back", url=self._url, after=f"{after:.1f}s"
        )
        if self._on_change is not None:
            self._on_change(None)
