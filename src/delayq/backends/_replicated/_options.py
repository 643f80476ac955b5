"""The options every replicated backend's URL takes alike (``request_timeout``,
``retention_bytes``, ``scheduler``, ``standby``, ``shards``, ``scheduler_shards``),
checked the same way for each broker, and the shard of a queue."""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Protocol, TypeVar, cast

from ._link import Candidacy

__all__ = [
    "LinkSettings",
    "candidacy",
    "hot_standby",
    "link_options",
    "request_timeout",
    "retention",
    "shard_count",
    "shard_of",
    "shard_prefixes",
    "shard_settings",
    "standing_shards",
]

_CANDIDACIES = ("auto", "on", "off")
_STANDBYS = ("hot", "cold")
#: The most shards a namespace may have (each is a scheduler, a log and their queues).
MAX_SHARDS = 256


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


def shard_count(value: Any) -> int:
    """``shards``: a whole number from 1 to MAX_SHARDS."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if isinstance(value, (bool, float)) or str(value).strip() != str(count) or count < 1:
        count = 0
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shards must be a whole number from 1 to {MAX_SHARDS}, not {value!r}")
    return count


def standing_shards(value: Any, shards: int) -> frozenset[int] | None:
    """``scheduler_shards``: the shards whose election this object stands for, as a
    comma-separated list (or a list) of shard numbers below ``shards``; None (the
    option left out): every shard."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    chosen: set[int] = set()
    try:
        for item in items:
            if isinstance(item, (bool, float)):
                raise ValueError
            shard = int(item)
            if not 0 <= shard < shards or str(item).strip() != str(shard):
                raise ValueError
            chosen.add(shard)
    except (TypeError, ValueError):
        chosen.clear()
    if not chosen:
        raise ValueError(
            f"scheduler_shards must list shard numbers from 0 to {shards - 1} (shards={shards}), "
            f"comma-separated, not {value!r}"
        )
    return frozenset(chosen)


def shard_of(queue: str, shards: int) -> int:
    """The shard of the queue named ``queue`` among ``shards``: the CRC-32 of its name in
    UTF-8, modulo ``shards`` (every client and scheduler computes the same)."""
    return zlib.crc32(queue.encode("utf-8", "surrogatepass")) % shards


def shard_prefixes(prefix: str, shards: int) -> list[str]:
    """The namespace of each shard of the namespace ``prefix``: ``prefix`` itself when it
    has one shard, else ``<prefix>.<k>`` for k from 0."""
    return [prefix] if shards == 1 else [f"{prefix}.{k}" for k in range(shards)]


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


class ShardedSettings(LinkSettings, Protocol):
    """What :func:`shard_settings` reads of a broker's settings (a frozen dataclass)."""

    @property
    def prefix(self) -> str: ...
    @property
    def shards(self) -> int: ...
    @property
    def scheduler_shards(self) -> frozenset[int] | None: ...


_S = TypeVar("_S", bound=ShardedSettings)


def shard_settings(settings: _S) -> list[_S]:
    """The settings of each shard of ``settings``' namespace, in order: its namespace
    (:func:`shard_prefixes`), and ``scheduler=off`` for a shard this object does not
    stand for (``scheduler_shards``). A namespace of one shard: ``settings`` itself."""
    standing = settings.scheduler_shards
    if settings.shards == 1 and (standing is None or 0 in standing):
        return [settings]
    return [
        cast(
            _S,
            dataclasses.replace(
                cast(Any, settings),
                prefix=prefix,
                scheduler=settings.scheduler if standing is None or k in standing else "off",
            ),
        )
        for k, prefix in enumerate(shard_prefixes(settings.prefix, settings.shards))
    ]
