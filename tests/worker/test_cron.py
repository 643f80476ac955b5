"""Schedules, tick ids and the run-once rule of delayq.runtime._cron (pure, no I/O)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from delayq import FakeClock, Queue
from delayq.runtime._cron import (
    CronSchedule,
    EverySchedule,
    TickPlan,
    expected_due,
    plan_tick,
    tick_id,
)

BERLIN = ZoneInfo("Europe/Berlin")


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def ticks_between(schedule: CronSchedule | EverySchedule, start: int, end: int) -> list[int]:
    """Every tick in (start, end], each found from the one before (as the chain does)."""
    out = []
    tick = schedule.next_after(start)
    while tick <= end:
        out.append(tick)
        tick = schedule.next_after(tick)
    return out


def local(tick: int) -> str:
    return datetime.fromtimestamp(tick / 1000, BERLIN).strftime("%H:%M%z")


def day_ms(year: int, month: int, day: int) -> tuple[int, int]:
    start = datetime(year, month, day, tzinfo=BERLIN)
    end = datetime(year, month, day, 23, 59, 59, tzinfo=BERLIN)
    return ms(start) - 1, ms(end)


def test_every_is_aligned_to_the_epoch_and_strictly_after() -> None:
    every = EverySchedule("5m")
    assert every.next_after(0) == 300_000
    assert every.next_after(299_999) == 300_000
    assert every.next_after(300_000) == 600_000
    assert EverySchedule(0.25).next_after(1_000) == 1_250


def test_every_rejects_bad_intervals() -> None:
    with pytest.raises(ValueError, match="at least 1ms"):
        EverySchedule(0)
    with pytest.raises(ValueError, match="unknown duration"):
        EverySchedule("5 minutes")


def test_cron_rejects_bad_expressions_and_zones() -> None:
    with pytest.raises(ValueError, match="invalid cron expression"):
        CronSchedule("61 * * * *")
    with pytest.raises(ValueError, match="invalid cron expression"):
        CronSchedule("* * * * * *")
    with pytest.raises(ValueError, match="unknown time zone"):
        CronSchedule("0 1 * * *", tz="Mars/Olympus")


def test_cron_next_after_is_strictly_after_even_on_a_tick() -> None:
    daily = CronSchedule("0 1 * * *", tz="UTC")
    tick = ms(datetime(2024, 5, 1, 1, 0, tzinfo=timezone.utc))
    assert daily.next_after(tick - 1) == tick
    assert daily.next_after(tick) == tick + 86_400_000
    assert daily.next_after(tick - 500) == tick  # sub-second starts


def test_spring_forward_in_berlin() -> None:
    """2024-03-31: 02:00 CET jumps to 03:00 CEST."""
    start, end = day_ms(2024, 3, 31)
    hourly = ticks_between(CronSchedule("0 * * * *", tz="Europe/Berlin"), start, end)
    assert len(hourly) == 23  # no 02:00 that day
    assert [local(t) for t in hourly[:4]] == [
        "00:00+0100",
        "01:00+0100",
        "03:00+0200",
        "04:00+0200",
    ]
    # A daily time inside the gap fires once, at the first valid time after it.
    gap = ticks_between(CronSchedule("30 2 * * *", tz="Europe/Berlin"), start, end)
    assert [local(t) for t in gap] == ["03:00+0200"]
    # A daily time outside the gap keeps its wall-clock time on both sides.
    nightly = CronSchedule("0 1 * * *", tz="Europe/Berlin")
    week = ticks_between(nightly, start - 3 * 86_400_000, end + 3 * 86_400_000)
    assert {local(t)[:5] for t in week} == {"01:00"}
    assert len(week) == 7


def test_fall_back_in_berlin() -> None:
    """2024-10-27: 03:00 CEST falls back to 02:00 CET; 02:xx happens twice."""
    start, end = day_ms(2024, 10, 27)
    hourly = ticks_between(CronSchedule("0 * * * *", tz="Europe/Berlin"), start, end)
    assert len(hourly) == 25
    assert len({tick_id("h", t) for t in hourly}) == 25  # distinct ids: one run each
    assert [local(t) for t in hourly[1:5]] == [
        "01:00+0200",
        "02:00+0200",
        "02:00+0100",
        "03:00+0100",
    ]
    # croniter fires a repeated wall-clock time at both instants.
    repeated = ticks_between(CronSchedule("30 2 * * *", tz="Europe/Berlin"), start, end)
    assert [local(t) for t in repeated] == ["02:30+0200", "02:30+0100"]
    nightly = ticks_between(CronSchedule("0 1 * * *", tz="Europe/Berlin"), start, end)
    assert [local(t) for t in nightly] == ["01:00+0200"]


def test_tick_ids_are_utc_and_deterministic() -> None:
    tick = ms(datetime(2024, 3, 31, 1, 0, tzinfo=timezone.utc))
    assert tick_id("nightly", tick) == "cron:nightly:2024-03-31T01:00:00Z"
    assert tick_id("fast", tick + 250) == "cron:fast:2024-03-31T01:00:00.250Z"


@pytest.fixture(params=["Europe/Berlin", "America/Los_Angeles", "Asia/Kolkata"])
def local_zone(request: pytest.FixtureRequest) -> Iterator[str]:
    """The process's local time zone set to a non-UTC zone (``TZ`` and
    ``time.tzset()``), restored afterwards."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = str(request.param)
    time.tzset()
    try:
        assert time.localtime(1_700_000_000).tm_gmtoff != 0
        yield str(request.param)
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


def test_tick_ids_and_schedules_ignore_the_local_time_zone(local_zone: str) -> None:
    """Every machine names a tick alike, whatever its TZ: the id is the UTC time."""
    tick = ms(datetime(2024, 3, 31, 1, 0, tzinfo=timezone.utc))
    assert tick_id("nightly", tick) == "cron:nightly:2024-03-31T01:00:00Z"
    assert tick_id("fast", tick + 250) == "cron:fast:2024-03-31T01:00:00.250Z"
    # A cron schedule without tz= is UTC, not the machine's zone.
    start = ms(datetime(2024, 3, 30, 12, 0, tzinfo=timezone.utc))
    assert CronSchedule("0 1 * * *").next_after(start) == tick
    assert EverySchedule("1h").next_after(tick - 1) == tick


EVERY = EverySchedule(10)  # ticks at multiples of 10 s
T = 1_700_000_000_000


def plan(due_at: int = T, attempts: int = 1, now: int = T + 5, catch_up: bool = True) -> TickPlan:
    return plan_tick(
        EVERY, tick_ms=T, due_at=due_at, attempts=attempts, now_ms=now, catch_up=catch_up
    )


def test_an_on_time_tick_runs_and_chains_the_next() -> None:
    result = plan()
    assert result.run
    assert result.next_tick == T + 10_000


def test_a_tick_put_after_its_time_does_not_run_on_its_first_attempt() -> None:
    result = plan(due_at=T + 3)
    assert not result.run
    assert "put after its tick" in result.reason
    assert result.next_tick == T + 10_000  # the chain goes on
    assert plan(due_at=T + 3, attempts=2).run  # a retry runs


def test_expected_due_matches_the_facade_rounding_of_at() -> None:
    """A tick put with ``at=tick / 1000`` in time is stored due exactly at the tick
    (no float rounding up by a millisecond), and ``expected_due`` says so."""
    ticks = [T, T + 1, T + 7, T + 250, T + 999, 1_711_846_800_123, 4_102_444_799_999]
    clock = FakeClock(wall=1_600_000_000.0)  # before every tick: each put is in time
    with Queue(f"memory://expected-due-{uuid.uuid4().hex}", clock=clock) as q:
        for tick in ticks:
            assert expected_due(tick) == tick
            assert q.get(q.put(tick, at=tick / 1000)).due_at == tick


def test_missed_ticks_catch_up_once_or_not_at_all() -> None:
    late = T + 45_000  # four later ticks have passed
    caught = plan(now=late)
    assert caught.run
    assert caught.reason == "catch-up"
    assert caught.next_tick == T + 50_000  # resumes after now
    skipped = plan(now=late, catch_up=False)
    assert not skipped.run
    assert skipped.next_tick == T + 50_000
    # Late but before the next tick: not a missed tick, it runs either way.
    assert plan(now=T + 9_000, catch_up=False).run


def test_schedules_describe_themselves() -> None:
    assert repr(EverySchedule("1.5s")) == "EverySchedule(1.5)"
    assert EverySchedule("1.5s").describe() == "every 1500ms"
    nightly = CronSchedule("0 1 * * *", tz="Europe/Berlin")
    assert repr(nightly) == "CronSchedule('0 1 * * *', tz='Europe/Berlin')"
    assert nightly.describe() == "cron '0 1 * * *' (Europe/Berlin)"


def test_plans_say_exactly_what_they_decide() -> None:
    late_put = plan(due_at=T + 3)
    assert (late_put.run, late_put.reason) == (False, "put after its tick: it may have run already")
    on_time = plan()
    assert (on_time.run, on_time.reason) == (True, "on time")
    # The next tick due exactly now: this one was missed (the boundary is inclusive).
    edge = plan(now=T + 10_000, catch_up=False)
    assert (edge.run, edge.reason) == (False, "missed while no worker ran (catch_up=False)")
    caught = plan(now=T + 10_000)
    assert (caught.run, caught.reason) == (True, "catch-up")
    assert plan(now=T + 9_999, catch_up=False).reason == "on time"


def test_cron_next_after_a_tick_is_the_next_tick() -> None:
    hourly = CronSchedule("0 * * * *")
    tick = ms(datetime(2024, 3, 31, 1, 0, tzinfo=timezone.utc))
    assert hourly.next_after(tick - 1) == tick
    assert hourly.next_after(tick) == tick + 3_600_000
    assert hourly.next_after(tick + 999) == tick + 3_600_000
    assert CronSchedule("0 1 * * *", tz="Europe/Berlin").tz == "Europe/Berlin"


def test_cron_refuses_what_is_not_text_with_its_type() -> None:
    with pytest.raises(TypeError, match="a cron expression is a str, not int"):
        CronSchedule(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tz must be a time zone name like 'Europe/Berlin', not 1"):
        CronSchedule("0 1 * * *", tz=1)  # type: ignore[arg-type]


def test_an_interval_of_one_millisecond_is_the_shortest() -> None:
    assert EverySchedule("1ms").period_ms == 1
    assert EverySchedule(0.001).next_after(5) == 6
