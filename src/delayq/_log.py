"""Structured log lines on the ``delayq`` logger, for every layer that logs: one
``event key=value ...`` line per event, its fields escaped so that no value can end
the line or forge a field; or, for ``--log-format json``, one JSON object per line
(:class:`JsonFormatter`) with those fields as its own.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from types import TracebackType

__all__ = [
    "LOGGER_NAME",
    "JsonFormatter",
    "TextFormatter",
    "log_enabled",
    "log_event",
    "log_raised",
    "log_value",
]

#: The name of the logger delayq writes to.
LOGGER_NAME = "delayq"

logger = logging.getLogger(LOGGER_NAME)


#: A value written as it is: printable ASCII without a space, ``"``, ``=`` or ``\\``
#: (one C call for the ids, names and numbers of almost every line).
_PLAIN = re.compile(r"[!#-<>-\[\]-~]+")


def log_value(value: object) -> str:
    """``value`` as one field of a log line: as it is when it is plain printable text
    without spaces, quotes or ``=``; else in double quotes with backslash escapes
    (``\\n``, ``\\"``, ``\\x1b``...), so no value can end the line or forge a field."""
    text = str(value)
    if _PLAIN.fullmatch(text) or (
        text and text.isprintable() and not any(ch in text for ch in ' "=\\')
    ):
        return text
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _log(
    level: int, event: str, fields: dict[str, object], exc: BaseException | _ExcInfo | None
) -> None:
    if logger.isEnabledFor(level):
        text = " ".join(
            [f"{key}={log_value(value)}" for key, value in fields.items() if value is not None]
        )
        extra = {"delayq": {"event": event, **fields}}
        if isinstance(exc, BaseException):
            exc = (type(exc), exc, exc.__traceback__)
        # Made and handled as Logger.log would, less its walk up the stack to find the
        # caller, which is always this function: the record names it as its place.
        record = logger.makeRecord(
            LOGGER_NAME, level, *_PLACE, "%s %s", (event, text), exc, "_log", extra
        )
        logger.handle(record)


#: The file and line a record of :func:`_log` names as its place (its ``def``).
_PLACE = (_log.__code__.co_filename, _log.__code__.co_firstlineno)


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


class TextFormatter(logging.Formatter):
    """The text line of delayq's commands: ``time level logger: message`` (with
    ``pid``, the process after the logger), the time as :class:`logging.Formatter`
    writes it by default. A worker writes a line a job: the date and time of day are
    written once a second, not once a line (the milliseconds still every line)."""

    def __init__(self, *, pid: bool = False) -> None:
        process = " [%(process)d]" if pid else ""
        super().__init__(f"%(asctime)s %(levelname)s %(name)s{process}: %(message)s")
        self._pid = pid
        self._second: tuple[int, str] = (-1, "")  # one attribute: threads read it whole

    def format(self, record: logging.LogRecord) -> str:
        """``record``'s line, as :class:`logging.Formatter` of the same format writes it
        (a line without a traceback written here directly, in one f-string)."""
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = message = record.getMessage()
        record.asctime = stamp = self.formatTime(record)
        if self._pid:
            return f"{stamp} {record.levelname} {record.name} [{record.process}]: {message}"
        return f"{stamp} {record.levelname} {record.name}: {message}"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        """``record``'s time, ``YYYY-mm-dd HH:MM:SS,mmm`` in local time."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second, stamp = self._second
        if int(record.created) != second:
            second = int(record.created)
            stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (second, stamp)
        return f"{stamp},{int(record.msecs):03d}"


#: The keys a JSON line has whatever its record; a field of the same name logged by a
#: call does not replace them (its ``pid=`` does not collide: the line's is ``process``).
_JSON_KEYS = ("time", "level", "logger", "process", "event", "message", "exception", "stack")

#: The arguments of uvicorn's access log line, by position, as fields.
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """Each record as one JSON object on one line: ``time`` (ISO 8601, UTC, ms),
    ``level``, ``logger``, ``process`` (its pid), ``event`` and ``message``, then the fields a
    :func:`log_event` call carries (``id``, ``queue``, ``attempt``, ``task``...) as
    keys of their own, and ``exception``: the traceback the text format shows. A
    record of another logger (uvicorn's) has its message as ``event``; uvicorn's
    access log has its request as fields too."""

    def format(self, record: logging.LogRecord) -> str:
        """The JSON line of ``record``."""
        stamp = datetime.fromtimestamp(record.created, timezone.utc)
        message = record.getMessage()
        line: dict[str, object] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
        }
        fields: dict[str, object] = dict(getattr(record, "delayq", None) or {})
        line["event"] = fields.pop("event", message)
        line["message"] = message
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple):
            fields.update(zip(_ACCESS_FIELDS, args, strict=False))
        for key, value in fields.items():
            if value is not None and key not in _JSON_KEYS:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)  # ASCII: no U+2028 to split a line
