"""Structured log lines on the ``delayq`` logger, for every layer that logs: one
``event key=value ...`` line per event, its fields escaped so that no value can end
the line or forge a field.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

__all__ = ["LOGGER_NAME", "log_enabled", "log_event", "log_raised", "log_value"]

#: The name of the logger delayq writes to.
LOGGER_NAME = "delayq"

logger = logging.getLogger(LOGGER_NAME)


def log_value(value: object) -> str:
    """``value`` as one field of a log line: as it is when it is plain printable text
    without spaces, quotes or ``=``; else in double quotes with backslash escapes
    (``\\n``, ``\\"``, ``\\x1b``...), so no value can end the line or forge a field."""
    text = str(value)
    if text and text.isprintable() and not any(ch in text for ch in ' "=\\'):
        return text
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _log(
    level: int, event: str, fields: dict[str, object], exc: BaseException | _ExcInfo | None
) -> None:
    if logger.isEnabledFor(level):
        text = " ".join(
            f"{key}={log_value(value)}" for key, value in fields.items() if value is not None
        )
        extra = {"delayq": {"event": event, **fields}}
        logger.log(level, "%s %s", event, text, exc_info=exc, extra=extra)


#: ``log_enabled(level)``: whether a line at ``level`` would be logged; a hot path asks
#: before it builds the fields of a line that nobody would see (the logger's own
#: method: no call of ours around it, once per job).
log_enabled: Callable[[int], bool] = logger.isEnabledFor


def log_event(level: int, event: str, **fields: object) -> None:
    """Log ``event`` on the ``delayq`` logger as ``event key=value ...`` (values
    escaped by :func:`log_value`); the fields also go to the record as
    ``record.delayq`` (a dict, unescaped) for structured handlers."""
    _log(level, event, fields, None)


def log_raised(
    level: int,
    event: str,
    exc: BaseException,
    frames: TracebackType | None = None,
    /,
    **fields: object,
) -> None:
    """:func:`log_event`, followed by the traceback of ``exc`` (its whole chain); its
    own frames from ``frames`` (a tail of ``exc.__traceback__``) when given."""
    _log(level, event, fields, exc if frames is None else (type(exc), exc, frames))
