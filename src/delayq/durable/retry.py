"""RetryPolicy: exponential backoff with a cap and jitter, as pure arithmetic."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .constants import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_BASE,
    DEFAULT_RETRY_FACTOR,
    DEFAULT_RETRY_JITTER,
    DEFAULT_RETRY_MAX_DELAY,
)

__all__ = ["RetryPolicy"]


def _number(name: str, value: object, low: float, high: float = math.inf) -> float:
    if type(value) is bool or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    number = float(value)
    if not (low <= number <= high and number < math.inf):
        bounds = f"between {low} and {high}" if high < math.inf else f"finite and >= {low}"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a message is tried and how long it waits between attempts.

    A message is reserved at most ``max_attempts`` times; after the last failed
    attempt it is dead. After attempt ``n`` fails (``nack`` without ``delay``) it
    waits ``base * factor ** (n - 1)`` seconds, capped at ``max_delay``, each delay
    spread by ``± jitter`` (a fraction: 0.1 is ±10 %) and never above the cap.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base: float = DEFAULT_RETRY_BASE
    factor: float = DEFAULT_RETRY_FACTOR
    max_delay: float = DEFAULT_RETRY_MAX_DELAY
    jitter: float = DEFAULT_RETRY_JITTER

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int:
            raise TypeError(f"max_attempts must be an int, not {type(self.max_attempts).__name__}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        # Stored as floats, validated: a frozen dataclass sets them through object.
        object.__setattr__(self, "base", _number("base", self.base, 0.0))
        object.__setattr__(self, "factor", _number("factor", self.factor, 1.0))
        object.__setattr__(self, "max_delay", _number("max_delay", self.max_delay, 0.0))
        object.__setattr__(self, "jitter", _number("jitter", self.jitter, 0.0, 1.0))

    def delay_for(self, attempt: int, random_value: float = 0.5) -> float:
        """Seconds to wait after attempt number ``attempt`` (1 = the first) failed.

        ``random_value`` in [0, 1] picks the jitter: 0 is the shortest delay, 0.5 no
        jitter, 1 the longest. Pure: the same arguments give the same delay.
        """
        if type(attempt) is not int:
            raise TypeError(f"attempt must be an int, not {type(attempt).__name__}")
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        if not 0.0 <= random_value <= 1.0:
            raise ValueError(f"random_value must be in [0, 1], got {random_value!r}")
        try:
            raw = self.base * self.factor ** (attempt - 1)
        except OverflowError:
            raw = math.inf
        delay = min(raw, self.max_delay)
        delay *= 1.0 + self.jitter * (2.0 * random_value - 1.0)
        return max(0.0, min(delay, self.max_delay))

    def backoff(self, attempt: int) -> float:
        """:meth:`delay_for` with a random jitter."""
        return self.delay_for(attempt, random.random())
