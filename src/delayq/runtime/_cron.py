"""Cron and interval schedules, and the rule that makes a tick run once, pure.

How "exactly one run per tick, on any number of machines, without a leader" works:

* Tick ``T`` of schedule ``name`` is the message ``cron:<name>:<T as UTC ISO>``,
  put ``at=T`` with ``on_conflict="ignore"``. Every worker's producer puts the next
  tick about one period ahead, and the worker that runs tick ``T`` first puts the
  tick after it (a chain), so the next tick exists even when producers lag.
* While tick ``T``'s message exists, more puts of it are ignored. The danger is a
  put that lands *after* ``T`` ran and was acked (deleted): it would create ``T``
  again. Such a put can only land after ``T``, because a message is reserved only
  once its due time has passed. The backend stores ``due_at = max(at, now)`` with
  its own clock, so a put that landed late carries ``due_at > T``. Rule: on its
  first attempt, a tick whose ``due_at`` is later than ``T`` is not run (it may be
  a second copy); it only continues the chain. A retry (attempt > 1) always runs.
* The ack of a run waits until ``T`` + 2 ms (:data:`CRON_ACK_GUARD`), so a put in
  the very millisecond of ``T`` (which gives ``due_at == T``) cannot follow an ack.
* Catch-up: a worker that was down finds the last tick the producers or the chain
  put before the outage, overdue. With ``catch_up=True`` that one message runs once
  (the catch-up run) and the chain resumes at the next tick after now; with
  ``catch_up=False`` a tick whose successor has also passed is skipped.

Tick times are epoch milliseconds. Cron expressions are evaluated by croniter in
the schedule's time zone (daylight-saving gaps and repeats as croniter handles
them: a time skipped by spring-forward fires at the first valid time after it, a
time repeated by fall-back fires twice, once per UTC instant); ``every`` ticks are
multiples of the interval since the Unix epoch, so every process agrees on them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter  # type: ignore[import-untyped]

from .._duration import delay_to_seconds, seconds_to_ms

__all__ = [
    "CronSchedule",
    "EverySchedule",
    "Schedule",
    "TickPlan",
    "expected_due",
    "plan_tick",
    "tick_id",
]


class Schedule(Protocol):
    """When a schedule fires: tick times in epoch milliseconds."""

    def next_after(self, ms: int) -> int:
        """The first tick strictly after ``ms``."""
        ...

    def describe(self) -> str:
        """A short human description (for logs)."""
        ...


def _seconds_hint(fields: list[str]) -> str:
    """For six fields (seconds first, as some crons take): what to use instead."""
    if len(fields) != 6:
        return ""
    step = re.fullmatch(r"\*/([1-9][0-9]*)", fields[0])
    if step and fields[1:] == ["*"] * 5:
        return (
            f'; cron has no seconds: for every {step.group(1)} s use @app.every("{step.group(1)}s")'
        )
    return '; cron has no seconds: for a schedule in seconds use @app.every("2s") and the like'


class CronSchedule:
    """A five-field cron expression (``"0 1 * * *"``) in the time zone ``tz``."""

    def __init__(self, expression: str, tz: str = "UTC") -> None:
        if not isinstance(expression, str):
            raise TypeError(f"a cron expression is a str, not {type(expression).__name__}")
        if not isinstance(tz, str):
            raise TypeError(f"tz must be a time zone name like 'Europe/Berlin', not {tz!r}")
        fields = expression.split()
        if len(fields) != 5 or not croniter.is_valid(expression):
            raise ValueError(
                f"invalid cron expression {expression!r}: use five fields, "
                "minute hour day-of-month month day-of-week, e.g. '0 1 * * *'"
                + _seconds_hint(fields)
            )
        try:
            self._zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {tz!r} (use an IANA name like 'Europe/Berlin')"
            ) from None
        self.expression = expression
        self.tz = tz

    def next_after(self, ms: int) -> int:
        """See :meth:`Schedule.next_after`."""
        start = datetime.fromtimestamp(ms / 1000.0, self._zone)
        moment: datetime = croniter(self.expression, start).get_next(datetime)
        tick = math.floor(moment.timestamp()) * 1000
        # croniter works in whole seconds; never hand back a tick at or before ``ms``.
        return tick if tick > ms else self.next_after(math.floor(ms / 1000.0) * 1000 + 999)

    def describe(self) -> str:
        """See :meth:`Schedule.describe`."""
        return f"cron {self.expression!r} ({self.tz})"

    def __repr__(self) -> str:
        return f"CronSchedule({self.expression!r}, tz={self.tz!r})"


class EverySchedule:
    """A fixed interval (``"5m"``, ``90``, a timedelta), aligned to the Unix epoch."""

    def __init__(self, interval: object) -> None:
        seconds = delay_to_seconds(interval, "interval")
        period = seconds_to_ms(seconds)
        if period < 1:
            raise ValueError(f"an interval must be at least 1ms, got {interval!r}")
        self.period_ms = period

    def next_after(self, ms: int) -> int:
        """See :meth:`Schedule.next_after`."""
        return (ms // self.period_ms + 1) * self.period_ms

    def describe(self) -> str:
        """See :meth:`Schedule.describe`."""
        return f"every {self.period_ms}ms"

    def __repr__(self) -> str:
        return f"EverySchedule({self.period_ms / 1000.0!r})"


def tick_id(name: str, tick_ms: int) -> str:
    """The message id of one tick: ``cron:<name>:<UTC ISO time>``, e.g.
    ``cron:nightly:2024-03-31T00:00:00Z`` (milliseconds shown only when not zero)."""
    moment = datetime.fromtimestamp(tick_ms // 1000, timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if tick_ms % 1000:
        text += f".{tick_ms % 1000:03d}"
    return f"cron:{name}:{text}Z"


def expected_due(tick_ms: int) -> int:
    """The ``due_at`` a put of ``at=tick_ms / 1000`` gets when it lands in time (the
    facade's own rounding of ``at=``)."""
    return seconds_to_ms(tick_ms / 1000.0)


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What a worker does with a reserved tick: run it or not (and why not), and
    which tick it puts next (the chain)."""

    run: bool
    reason: str
    next_tick: int


def plan_tick(
    schedule: Schedule,
    *,
    tick_ms: int,
    due_at: int,
    attempts: int,
    now_ms: int,
    catch_up: bool,
) -> TickPlan:
    """Decide about tick ``tick_ms`` reserved at ``now_ms`` (see the module docstring)."""
    next_tick = schedule.next_after(max(tick_ms, now_ms))
    if attempts <= 1:
        if due_at > expected_due(tick_ms):
            return TickPlan(False, "put after its tick: it may have run already", next_tick)
        if not catch_up and schedule.next_after(tick_ms) <= now_ms:
            return TickPlan(False, "missed while no worker ran (catch_up=False)", next_tick)
    missed = schedule.next_after(tick_ms) <= now_ms
    return TickPlan(True, "catch-up" if missed else "on time", next_tick)
