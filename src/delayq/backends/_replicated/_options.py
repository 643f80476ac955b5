"""The options every replicated backend's URL takes alike (``request_timeout``,
``retention_bytes``, ``scheduler``, ``standby``), checked the same way for each broker."""

from __future__ import annotations

import math
from typing import Any, Protocol, cast

from ._link import Candidacy

__all__ = [
    "LinkSettings",
    "candidacy",
    "hot_standby",
    "link_options",
    "request_timeout",
    "retention",
]

_CANDIDACIES = ("auto", "on", "off")
_STANDBYS = ("hot", "cold")


def request_timeout(value: Any) -> float:
    """``request_timeout`` in seconds; ValueError unless a positive finite number."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"request_timeout must be a number of seconds, not {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"request_timeout must be a positive number of seconds, not {value!r}")
    return seconds


def retention(value: Any, minimum: int) -> int:
    """``retention_bytes``: 0 (none) or a whole number of at least ``minimum``."""
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = -1
    if isinstance(value, (bool, float)) or (size != 0 and not (minimum <= size < 1 << 62)):
        raise ValueError(
            f"retention_bytes must be 0 (no retention) or a whole number of bytes of at "
            f"least {minimum}, not {value!r}"
        )
    return size


def candidacy(value: Any) -> Candidacy:
    """``scheduler``: auto, on or off."""
    if value not in _CANDIDACIES:
        raise ValueError(f"scheduler must be one of auto, on, off, not {value!r}")
    return cast(Candidacy, value)


def hot_standby(value: Any) -> bool:
    """``standby``: hot (True) or cold."""
    if value not in _STANDBYS:
        raise ValueError(f"standby must be hot or cold, not {value!r}")
    return bool(value == "hot")


class LinkSettings(Protocol):
    """What a broker's parsed URL holds for the link (each broker's ``Settings``)."""

    @property
    def scheduler(self) -> Candidacy: ...
    @property
    def request_timeout(self) -> float: ...
    @property
    def deliver(self) -> tuple[str, str] | None: ...
    @property
    def fast_put(self) -> bool: ...
    @property
    def url(self) -> str: ...
    @property
    def standby(self) -> bool: ...


def link_options(settings: LinkSettings) -> dict[str, Any]:
    """The keyword options of a ``LoopLink`` / ``ThreadLink`` from ``settings``."""
    return {
        "scheduler": settings.scheduler,
        "request_timeout": settings.request_timeout,
        "deliver": settings.deliver,
        "fast_put": settings.fast_put,
        "url": settings.url,
        "standby": settings.standby,
    }
