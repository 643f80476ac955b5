"""Parsing of delays and deadlines (_duration.py): what a user may write, and what not."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone, tzinfo
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq import _duration
from delayq._duration import (
    at_to_epoch,
    bounded_seconds,
    deadline_from,
    delay_to_seconds,
    due_at_ms,
    seconds_to_ms,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("90s", 90.0),
        ("30m", 1_800.0),
        ("1h30m", 5_400.0),
        ("1.5h", 5_400.0),
        ("2d", 172_800.0),
        ("500us", 0.0005),
        ("1d2h3m4s5ms6us", 86_400 + 7_200 + 180 + 4 + 0.005 + 0.000006),
        ("0s", 0.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("1h1ms", 3_600.001),
        ("10m0.5s", 600.5),
        # seconds as a string, a sign, spaces around: as the CLI and HTTP always took them
        ("5", 5.0),
        ("90", 90.0),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        (" 5s", 5.0),
        ("5s ", 5.0),
        ("-5", -5.0),
        ("-5s", -5.0),
        ("+5s", 5.0),
        ("-1h30m", -5_400.0),
    ],
)
def test_duration_strings(text: str, seconds: float) -> None:
    assert delay_to_seconds(text) == pytest.approx(seconds, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-",
        "--5",
        "5 minutes",
        "5min",
        "1m1h",  # smallest unit first
        "1h1h",  # a unit twice
        "30m1h",
        "1h 30m",
        "1e3s",
        "nan",
        "inf",
        "1_000",
        "- 5s",
        "s",
        "ms",
        "5S",
        "1,5h",
        "inf s",
        "nans",
        "5ms5us5ms",
    ],
)
def test_unknown_duration_strings_raise_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        delay_to_seconds(text)


@pytest.mark.parametrize("kind", ["wait", "lease", "horizon", "interval"])
def test_every_message_names_the_argument(kind: str) -> None:
    for bad in (math.nan, math.inf, 10**400, "soon", "9" * 400 + "d"):
        with pytest.raises(ValueError, match=kind):
            delay_to_seconds(bad, kind)
    with pytest.raises(TypeError, match=kind):
        delay_to_seconds(True, kind)


def test_a_duration_too_large_for_a_float_raises() -> None:
    with pytest.raises(ValueError, match="too large"):
        delay_to_seconds("9" * 400 + "d")


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [
        (0, 0.0),
        (2, 2.0),
        (1.5, 1.5),
        (-3, -3.0),
        (-0.5, -0.5),
        (timedelta(minutes=2), 120.0),
        (timedelta(milliseconds=-5), -0.005),
        (timedelta(days=365 * 100), 100 * 365 * 86_400.0),
    ],
)
def test_numbers_and_timedeltas(delay: object, seconds: float) -> None:
    assert delay_to_seconds(delay) == seconds


def test_int_and_float_subclasses_are_delays() -> None:
    class MyFloat(float):
        pass

    class MyInt(int):
        pass

    assert delay_to_seconds(MyFloat(1.25)) == 1.25
    assert delay_to_seconds(MyInt(3)) == 3.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, float("-nan")])
def test_non_finite_delays_raise_value_error(bad: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        delay_to_seconds(bad)


@pytest.mark.parametrize("bad", [True, False, None, [1], b"5s", object(), 1j])
def test_other_types_raise_type_error(bad: object) -> None:
    with pytest.raises(TypeError):
        delay_to_seconds(bad)


def test_at_to_epoch() -> None:
    aware = datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=timezone.utc)
    assert at_to_epoch(aware) == aware.timestamp()
    plus2 = aware.astimezone(timezone(timedelta(hours=2)))
    assert at_to_epoch(plus2) == aware.timestamp()
    assert at_to_epoch(1_700_000_000) == 1_700_000_000.0
    assert at_to_epoch(1.5) == 1.5
    with pytest.raises(ValueError, match="aware"):
        at_to_epoch(datetime(2030, 1, 1))  # naive
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="finite"):
            at_to_epoch(bad)
    for wrong in (True, "2030-01-01", None, timedelta(1)):
        with pytest.raises(TypeError):
            at_to_epoch(wrong)


def test_at_with_a_tzinfo_that_gives_no_offset_is_naive() -> None:
    class Floating(tzinfo):
        def utcoffset(self, dt: datetime | None) -> timedelta | None:
            return None

    with pytest.raises(ValueError, match="aware"):
        at_to_epoch(datetime(2030, 1, 1, tzinfo=Floating()))


MONO, WALL = 500.0, 1_700_000_000.0


def test_deadline_from() -> None:
    assert deadline_from(None, None, MONO, WALL) == MONO
    assert deadline_from(2.5, None, MONO, WALL) == MONO + 2.5
    assert deadline_from("1m", None, MONO, WALL) == MONO + 60
    assert deadline_from(timedelta(seconds=3), None, MONO, WALL) == MONO + 3
    # at= goes through the gap between wall and monotonic time, once.
    assert deadline_from(None, WALL + 10, MONO, WALL) == MONO + 10
    when = datetime.fromtimestamp(WALL + 90, tz=timezone.utc)
    assert deadline_from(None, when, MONO, WALL) == pytest.approx(MONO + 90)
    # The past and negative delays mean now, never earlier.
    assert deadline_from(-5, None, MONO, WALL) == MONO
    assert deadline_from("0s", None, MONO, WALL) == MONO
    assert deadline_from(None, WALL - 3_600, MONO, WALL) == MONO
    assert deadline_from(None, 0, MONO, WALL) == MONO


def test_deadline_from_rejects_both_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="not both"):
        deadline_from(1, WALL, MONO, WALL)
    with pytest.raises(ValueError, match="not both"):
        deadline_from(0, 0, MONO, WALL)
    with pytest.raises(ValueError, match="range"):
        deadline_from(1e308, None, 1e308, WALL)


def test_due_at_ms_rounds_up() -> None:
    now = 1_700_000_000_000
    assert due_at_ms(None, None, now) == now
    assert due_at_ms(1, None, now) == now + 1_000
    assert due_at_ms(0.0001, None, now) == now + 1  # 0.1 ms: a whole ms later, never 0
    assert due_at_ms(0.0011, None, now) == now + 2
    assert due_at_ms("250ms", None, now) == now + 250
    assert due_at_ms(0.001, None, now) == now + 1  # float noise does not add a ms
    assert due_at_ms(timedelta(milliseconds=7), None, now) == now + 7
    assert due_at_ms(-5, None, now) == now
    assert due_at_ms(None, (now + 1_234) / 1000, now) == now + 1_234
    assert due_at_ms(None, (now + 1_234.5) / 1000, now) == now + 1_235
    assert due_at_ms(None, 1.0001, 0) == 1_001
    assert due_at_ms(None, 0, now) == now  # the past: now
    when = datetime.fromtimestamp((now + 10_000.25) / 1000, tz=timezone.utc)
    assert due_at_ms(None, when, now) == now + 10_001
    with pytest.raises(ValueError, match="not both"):
        due_at_ms(1, 1, now)
    with pytest.raises(ValueError, match="finite"):
        due_at_ms(math.nan, None, now)
    with pytest.raises(ValueError, match="aware"):
        due_at_ms(None, datetime(2030, 1, 1), now)


@settings(max_examples=300, deadline=None)
@given(
    now_ms=st.integers(min_value=0, max_value=4_000_000_000_000),
    delay=st.floats(min_value=-1e6, max_value=1e7, allow_nan=False),
)
def test_due_at_ms_is_never_early_for_delays(now_ms: int, delay: float) -> None:
    due = due_at_ms(delay, None, now_ms)
    assert isinstance(due, int)
    assert due >= now_ms
    # Never early: at least the delay (up to the float's own noise, far below a ms)...
    assert due - now_ms >= delay * 1000 - 1e-6
    # ...and never more than a ms late.
    assert due - now_ms <= max(delay, 0.0) * 1000 + 1


@settings(max_examples=300, deadline=None)
@given(
    now_ms=st.integers(min_value=0, max_value=4_000_000_000_000),
    at=st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False),
)
def test_due_at_ms_is_never_early_for_deadlines(now_ms: int, at: float) -> None:
    due = due_at_ms(None, at, now_ms)
    assert due >= now_ms
    exact = Fraction(at) * 1000
    # Within the float's noise of `at` (its last ulp), never before it.
    assert due >= exact - Fraction(1, 1_000)
    assert due <= max(exact, Fraction(now_ms)) + 1


def test_the_module_exports() -> None:
    assert set(_duration.__all__) >= {"delay_to_seconds", "at_to_epoch", "deadline_from"}


def test_whole_milliseconds_stay_whole() -> None:
    """A delay of N ms is N ms, not N + 1 through float noise (9 * 1e-3 * 1000 is
    9.000000000000002), whether written as a string or as float seconds."""
    for n in range(1, 20_000):
        assert seconds_to_ms(delay_to_seconds(f"{n}ms")) == n
        assert seconds_to_ms(n / 1000) == n
    assert seconds_to_ms(0.0015) == 2  # a fraction of a millisecond still rounds up
    assert seconds_to_ms(1e-7) == 1
    assert seconds_to_ms(0.0) == 0


@pytest.mark.parametrize(
    ("value", "expected"), [(5, 5.0), (0.25, 0.25), ("1.5", 1.5), ("30", 30.0), (30, 30.0)]
)
def test_bounded_seconds_takes_numbers_and_their_text(value: object, expected: float) -> None:
    result = bounded_seconds("busy_timeout", value, 30)
    assert result == expected
    assert type(result) is float


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "busy_timeout must be more than 0 and at most 30 seconds"),
        (-1, ValueError, "more than 0 and at most 30 seconds"),
        (30.001, ValueError, "at most 30 seconds"),
        ("nan", ValueError, "more than 0"),
        ("soon", ValueError, "busy_timeout must be a number of seconds, not 'soon'"),
        (True, TypeError, "busy_timeout must be a number of seconds, not bool"),
        (None, TypeError, "not NoneType"),
        ([1], TypeError, "not list"),
    ],
)
def test_bounded_seconds_refuses_with_the_options_name(
    value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        bounded_seconds("busy_timeout", value, 30)
    assert message in str(info.value)


def test_an_unknown_duration_says_what_is_understood() -> None:
    """The whole message a user reads (every face shows it as is)."""
    with pytest.raises(ValueError, match=r"^unknown duration 'soon' for delay") as info:
        delay_to_seconds("soon", "delay")
    assert str(info.value) == (
        'unknown duration \'soon\' for delay: use seconds (90, "90", "-5") or numbers '
        'with units (us, ms, s, m, h, d), largest unit first, e.g. "250ms", "90s", '
        '"1.5h", "1h30m"'
    )
    with pytest.raises(ValueError, match=r"^give delay= or at=, not both$"):
        deadline_from(1, 2, MONO, WALL)


def test_at_takes_an_aware_datetime_of_any_zone() -> None:
    from zoneinfo import ZoneInfo  # noqa: PLC0415

    berlin = datetime(2024, 7, 1, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert at_to_epoch(berlin) == datetime(2024, 7, 1, 10, 0, tzinfo=timezone.utc).timestamp()


def test_a_delay_under_a_second_still_counts() -> None:
    assert deadline_from(0.5, None, MONO, WALL) == MONO + 0.5
    assert deadline_from("1ms", None, MONO, WALL) == MONO + 0.001
