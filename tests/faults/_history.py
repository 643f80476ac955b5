"""A history of the calls a fault test made, and the checker of what delayq promises.

Every ``put``, ``reserve``, ``ack``, ``nack``, ``release``, ``extend`` and ``cancel`` is
recorded with the wall-clock times it was called and returned (``time.time()``: the
servers of these tests run on this machine's clock, which is the one due times and
lease expiries are read on) and its outcome: ``ok``, ``failed`` (it raised, and by
delayq's word nothing happened: a ``LeaseLost``, a connection error before sending) or
``unknown`` (it raised an error that says its fate is unknown: it may have happened).

:func:`check` then finds, whatever the faults were:

* **lost**: a put that succeeded, never cancelled, whose message was never delivered
  (a test drains its queue before checking);
* **early**: a delivery before the message could be due: before its put was called
  plus its delay (or its nack plus the nack's delay, when a nack explains it);
* **acked back**: a delivery asked for after an ack (or a cancel) of that message had
  succeeded;
* **phantom**: a delivery of a message no put succeeded in storing, or may have (a put
  reported as failed that was stored after all);
* **duplicates**: a message delivered again without a nack or release of the first
  delivery in between. Each is *explained* when the first delivery's lease had
  expired by the time the second reserve returned (``lease_expires_at``, moved by any
  ``extend``); one that is not is a violation. Deliveries are taken in the order the
  server granted them (their attempt numbers), not the order they arrived in: a
  reply a partition held up can arrive after the message's lease ran out and another
  consumer got it.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Delivery", "History", "Op", "Report", "check"]

#: Slack (s) for the millisecond rounding of due times and lease expiries.
TOLERANCE = 0.002


@dataclass
class Delivery:
    """One message a reserve returned: its id, lease token and lease expiry (epoch s)."""

    id: str
    token: str
    lease_expires_at: float
    attempts: int = 1


@dataclass
class Op:
    """One call: ``kind``, when it was called and returned (epoch s), its outcome and
    what it was about (``id``, ``token``, a put's or nack's ``delay``), what it
    returned (``result``) and, for a reserve, the messages delivered."""

    kind: str
    start: float
    end: float = 0.0
    outcome: str = "ok"
    id: str | None = None
    token: str | None = None
    delay: float = 0.0
    result: Any = None
    error: str | None = None
    delivered: list[Delivery] = field(default_factory=list)

    def deliver(self, messages: Iterable[Any]) -> None:
        """Note what a reserve returned (delayq ``Message`` objects)."""
        for msg in messages:
            self.delivered.append(
                Delivery(msg.id, msg.lease, msg.lease_expires_at / 1000, msg.attempts)
            )


class History:
    """The calls of one test, from any thread or task. ``unknown``: the exceptions
    whose call may or may not have happened; ``clock``: the wall clock calls are timed
    on (``time.time``; a test that moves the clock of the code under test passes the
    true one)."""

    def __init__(
        self,
        unknown: Sequence[type[BaseException]] = (),
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.ops: list[Op] = []
        self._unknown = tuple(unknown)
        self._clock = clock or time.time
        self._lock = threading.Lock()

    def add(self, op: Op) -> Op:
        """Record a finished call."""
        with self._lock:
            self.ops.append(op)
        return op

    @contextmanager
    def call(
        self, kind: str, id: str | None = None, *, token: str | None = None, delay: float = 0.0
    ) -> Iterator[Op]:
        """Around one call: records it when the block ends, ``ok`` or, when it raises,
        ``unknown`` or ``failed`` (the exception goes on)."""
        op = Op(kind, self._clock(), id=id, token=token, delay=delay)
        try:
            yield op
        except BaseException as exc:
            op.outcome = "unknown" if isinstance(exc, self._unknown) else "failed"
            op.error = type(exc).__name__
            raise
        finally:
            op.end = self._clock()
            self.add(op)


@dataclass
class Report:
    """What :func:`check` found."""

    messages: int = 0
    deliveries: int = 0
    lost: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    acked_back: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    duplicates: int = 0
    explained: int = 0
    unexplained: list[str] = field(default_factory=list)
    #: Calls whose outcome is unknown (they may or may not have happened).
    unknown: int = 0

    def violations(self) -> list[str]:
        """One line for each broken promise."""
        return [
            *(f"lost: {item}" for item in self.lost),
            *(f"early: {item}" for item in self.early),
            *(f"acked, then delivered again: {item}" for item in self.acked_back),
            *(f"delivered without a stored put: {item}" for item in self.phantom),
            *(f"delivered twice under a live lease: {item}" for item in self.unexplained),
        ]

    def assert_ok(self) -> None:
        """AssertionError listing every violation, if any."""
        found = self.violations()
        assert not found, "\n".join(found)


@dataclass
class _Seen:
    """One delivery of a message, with the reserve that made it."""

    delivery: Delivery
    reserve: Op


def check(history: History | Iterable[Op]) -> Report:
    """Check a history (see the module docstring)."""
    ops = list(history.ops if isinstance(history, History) else history)
    by_id: dict[str, list[Op]] = defaultdict(list)
    seen: dict[str, list[_Seen]] = defaultdict(list)
    for op in ops:
        if op.id is not None:
            by_id[op.id].append(op)
        if op.kind == "reserve" and op.outcome == "ok":
            for delivery in op.delivered:
                seen[delivery.id].append(_Seen(delivery, op))
    report = Report(
        deliveries=sum(len(items) for items in seen.values()),
        unknown=sum(op.outcome == "unknown" for op in ops),
    )
    for id in sorted(set(by_id) | set(seen)):
        # In the order the server granted them (each claim counts an attempt), then of
        # arrival: a reply held up by a fault may arrive after a later grant's.
        order = sorted(seen[id], key=lambda s: (s.delivery.attempts, s.reserve.end))
        _check_message(id, by_id[id], order, report)
    return report


def _happened(op: Op) -> bool:
    return op.outcome in ("ok", "unknown")


def _check_message(id: str, ops: list[Op], seen: list[_Seen], report: Report) -> None:
    puts = [op for op in ops if op.kind == "put" and _happened(op)]
    if puts:
        report.messages += 1
    if not puts:
        if seen:
            report.phantom.append(id)
        return
    stored = [op for op in puts if op.outcome == "ok"]
    cancelled = any(op.kind == "cancel" and op.outcome == "ok" and op.result for op in ops)
    if stored and not seen and not cancelled:
        report.lost.append(id)
    due = min(op.start + op.delay for op in puts)
    expiry = {s.delivery.token: s.delivery.lease_expires_at for s in seen}
    for op in ops:  # an extend moves its lease's expiry
        if op.kind == "extend" and op.outcome == "ok" and op.token in expiry:
            expiry[op.token] = max(expiry[op.token], op.result / 1000)
    ended = [
        op.end
        for op in ops
        if op.outcome == "ok" and (op.kind == "ack" or (op.kind == "cancel" and op.result))
    ]
    previous: _Seen | None = None
    for current in seen:
        if previous is not None:
            due = _again(id, ops, previous, current, expiry, report)
        arrived = current.reserve.end
        if arrived < due - TOLERANCE:
            report.early.append(f"{id}: {due - arrived:.3f} s before it was due")
        if any(end <= current.reserve.start for end in ended):
            report.acked_back.append(id)
        previous = current


def _again(
    id: str,
    ops: list[Op],
    previous: _Seen,
    current: _Seen,
    expiry: dict[str, float],
    report: Report,
) -> float:
    """Count a delivery after another (a duplicate unless a nack or release of the
    first came between); the earliest the message could have been due again."""
    token, arrived = previous.delivery.token, current.reserve.end
    handed_back = [
        op
        for op in ops
        if op.kind in ("nack", "release")
        and op.token == token
        and _happened(op)
        and op.start <= arrived
    ]
    if handed_back:
        return min(op.start + op.delay for op in handed_back)
    report.duplicates += 1
    if arrived >= expiry[token] - TOLERANCE:
        report.explained += 1
    else:
        report.unexplained.append(
            f"{id}: again {expiry[token] - arrived:.3f} s before the first lease expired"
        )
    return 0.0
