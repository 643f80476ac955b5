"""Parsing of delays and deadlines, with no I/O: the one parser of every face (Python,
the CLI, the HTTP API).

A delay is seconds (``int``/``float``), a :class:`datetime.timedelta`, or a string:
seconds (``"90"``, ``"1.5"``) or numbers with units, largest unit first (``"250ms"``,
``"90s"``, ``"1.5h"``, ``"1h30m"``); a string may have a sign (``"-5s"``) and spaces
around it. A deadline (``at=``) is an aware :class:`datetime.datetime` or epoch
seconds. A negative delay, or a deadline in the past, means "due now" (what a delay
computed as ``deadline - now`` needs once the deadline has passed). NaN, infinities,
naive datetimes and unknown strings raise :class:`ValueError` (a
:class:`DurationError`, which also names the argument in ``argument``, for a face that
names it its own way); ``bool`` and other types raise :class:`TypeError`. Every
message names the argument (``kind``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

__all__ = [
    "AtLike",
    "DelayLike",
    "DurationError",
    "at_to_epoch",
    "bounded_seconds",
    "deadline_from",
    "delay_to_seconds",
    "due_at_ms",
    "seconds_to_ms",
]

DelayLike = float | int | timedelta | str
AtLike = datetime | float | int

_UNIT_SECONDS = {"d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_UNIT_RANK = {unit: rank for rank, unit in enumerate(_UNIT_SECONDS)}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|d|h|m|s)")
_WHOLE = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ms|us|d|h|m|s))+")
_SECONDS = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INF = math.inf


class DurationError(ValueError):
    """A delay or deadline that cannot be used; ``argument`` is the name of the
    argument it was given as (``"delay"``, ``"at"``), when known."""

    def __init__(self, message: str, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


def _unknown(text: str, kind: str) -> DurationError:
    return DurationError(
        f'unknown duration {text!r} for {kind}: use seconds (90, "90", "-5") or numbers '
        'with units (us, ms, s, m, h, d), largest unit first, e.g. "250ms", "90s", '
        '"1.5h", "1h30m"',
        kind,
    )


def _parse_duration_string(text: str, kind: str) -> float:
    body = text.strip()
    sign = 1.0
    if body[:1] in ("-", "+"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if _SECONDS.fullmatch(body) is not None:
        total = float(body)
    elif _WHOLE.fullmatch(body) is not None:
        total = 0.0
        last_rank = -1
        for match in _PART.finditer(body):
            rank = _UNIT_RANK[match.group(2)]
            if rank <= last_rank:
                raise DurationError(
                    f"unknown duration {text!r} for {kind}: each unit at most once, "
                    "largest first (e.g. '1h30m')",
                    kind,
                )
            last_rank = rank
            total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise _unknown(text, kind)
    if not total < _INF:
        raise DurationError(f"{kind} {text!r} is too large", kind)
    return sign * total


def delay_to_seconds(delay: object, kind: str = "delay") -> float:
    """Return ``delay`` in seconds (may be negative, meaning "due now"); errors name
    the argument ``kind`` (``"delay"``, ``"wait"``, ``"lease"``...)."""
    value_type = type(delay)
    if value_type is float:
        seconds: float = delay  # type: ignore[assignment]
    elif value_type is int:
        try:
            seconds = float(delay)  # type: ignore[arg-type]
        except OverflowError:
            raise DurationError(
                f"{kind} must be finite, got an int of {len(str(delay))} digits", kind
            ) from None
    elif value_type is bool:
        raise TypeError(f"a bool is not a duration ({kind})")
    elif isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, str):
        return _parse_duration_string(delay, kind)
    elif isinstance(delay, (int, float)):  # int/float subclasses (e.g. numpy scalars)
        try:
            seconds = float(delay)
        except OverflowError:
            raise DurationError(f"{kind} must be finite", kind) from None
    else:
        raise TypeError(
            f"{kind} must be seconds (int/float), a timedelta or a string like '30m', "
            f"not {value_type.__name__}"
        )
    if not -_INF < seconds < _INF:
        raise DurationError(f"{kind} must be finite, got {delay!r}", kind)
    return seconds


def at_to_epoch(at: object) -> float:
    """Return the deadline ``at`` as epoch seconds."""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.tzinfo.utcoffset(at) is None:
            raise ValueError(
                "at= needs an aware datetime (e.g. datetime.now(timezone.utc)); "
                f"got the naive {at!r}"
            )
        return at.timestamp()
    if type(at) is bool:
        raise TypeError("a bool is not a deadline")
    if isinstance(at, (int, float)):
        epoch = float(at)
        if not -_INF < epoch < _INF:
            raise DurationError(f"at= must be finite epoch seconds, got {at!r}", "at")
        return epoch
    raise TypeError(f"at= must be an aware datetime or epoch seconds, not {type(at).__name__}")


def deadline_from(delay: object, at: object, mono_now: float, wall_now: float) -> float:
    """The monotonic deadline for ``delay=`` or ``at=`` (never earlier than ``mono_now``).

    ``at`` is converted once, through the gap between the wall and monotonic clocks.
    """
    if at is not None:
        if delay is not None:
            raise ValueError("give delay= or at=, not both")
        seconds = at_to_epoch(at) - wall_now
    elif delay is None:
        return mono_now
    else:
        seconds = delay_to_seconds(delay)
    if seconds <= 0.0:
        return mono_now
    deadline = mono_now + seconds
    if not deadline < _INF:
        raise ValueError(f"deadline out of range: delay of {seconds!r} s")
    return deadline


#: How close (in ms) a product must be to a whole millisecond to count as it: float
#: noise, as in 2.007 * 1000 == 2007.0000000000002, must not cost a millisecond.
_MS_SNAP = 1e-6


def seconds_to_ms(seconds: float) -> int:
    """Whole milliseconds for ``seconds``, rounded up so a due time is never early,
    except that a value within a nanosecond of a whole millisecond is that
    millisecond (``"9ms"`` and ``2.007`` are exactly 9 and 2007 ms)."""
    ms = seconds * 1000.0
    nearest = round(ms)
    if abs(ms - nearest) <= _MS_SNAP:
        return int(nearest)
    return math.ceil(ms)


def due_at_ms(delay: object, at: object, now_ms: int) -> int:
    """Epoch milliseconds at which a message is due, rounded up so it never fires early.

    ``now_ms`` is the current epoch time in milliseconds; a past deadline or a
    negative delay gives ``now_ms``.
    """
    if at is not None:
        if delay is not None:
            raise ValueError("give delay= or at=, not both")
        due = seconds_to_ms(at_to_epoch(at))
    elif delay is None:
        return now_ms
    else:
        due = now_ms + seconds_to_ms(delay_to_seconds(delay))
    return due if due > now_ms else now_ms


def bounded_seconds(name: str, value: object, high: float) -> float:
    """A backend option given in seconds (a number, or its text in a URL's query),
    more than 0 and at most ``high``; ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds, not {value!r}") from None
    if type(value) is bool or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    number = float(value)
    if not (0.0 < number <= high) or math.isnan(number):
        raise ValueError(f"{name} must be more than 0 and at most {high:g} seconds")
    return number
