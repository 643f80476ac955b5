"""A backend that stops answering: how the long-running consumers (the Worker, the
callback dispatcher of ``delayq serve``) ride it out.

:class:`Outage` is shared by the loops of one consumer. The first failure starts an
outage; every try fails again until the backend answers, each after twice the pause
of the one before (from ``first`` up to ``longest``), and each new pause is one log
line naming the backend's URL without its password: a lost Redis logs 0.5 s, 1 s,
2 s ... then one line every ``longest`` seconds, not one per failed call. The first
call that succeeds ends it with one line saying how long it lasted. Which errors are
an outage is the backend's to say (:func:`~delayq.durable.registry.outage_errors`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .._log import log_event, log_raised
from ..durable.registry import outage_errors, redact_url
from .constants import BACKEND_RETRY_MAX

__all__ = ["Outage", "error_kind"]


def error_kind(exc: BaseException) -> str:
    """What went wrong, without its text (which holds addresses and paths): the
    exception's class name, or ``timeout``."""
    return "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__


def _detail(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


class Outage:
    """The state of one backend as the loops of one consumer see it: up, or down
    since when, and how long to pause before the next try.

    ``url`` is logged redacted (:func:`~delayq.durable.registry.redact_url`); its
    backend's module is imported for its outage errors. Events
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
        self._errors = outage_errors(url)
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
        pause waits for the same moment, unlogged. An exception that is not one of
        the backend's outage errors is rather a bug: it is backed off the same way
        but logged as ``failed_event`` with ``fields`` and its traceback.
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
        if not isinstance(exc, self._errors):
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
