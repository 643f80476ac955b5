"""The log lines of delayq's commands are what the standard library's logging would
write: the short ways a line a job takes (the text formatter's time written once a
second, a value checked in one C call, the record made without a walk up the stack)
change nothing a user reads, a handler receives, or a log shipper parses."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayq._log import LOGGER_NAME, TextFormatter, log_event, log_raised, log_value


def _reference_value(value: object) -> str:
    """:func:`log_value` as it was written first: the model of the fast check."""
    text = str(value)
    if text and text.isprintable() and not any(ch in text for ch in ' "=\\'):
        return text
    escaped = text.encode("unicode_escape").decode("ascii").replace('"', '\\"')
    return f'"{escaped}"'


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F)),
        st.integers(),
        st.floats(allow_nan=True),
        st.sampled_from(["", " ", "=", '"', "\\", "\x7f", "é", "a b", "x\r\ny=1", "\u2028"]),
    )
)
def test_a_field_is_written_as_the_plain_rule_says(value: object) -> None:
    assert log_value(value) == _reference_value(value)


def _record(
    created: float, level: int, message: str, args: tuple[object, ...], exc: bool
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError(message)
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.LogRecord(LOGGER_NAME, level, __file__, 1, message, args, exc_info)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    return record


@settings(max_examples=300, deadline=None)
@given(
    created=st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False),
    level=st.sampled_from([logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]),
    message=st.text(),
    arg=st.text(),
    exc=st.booleans(),
    pid=st.booleans(),
    again=st.floats(min_value=0, max_value=1),
)
def test_the_text_line_is_the_standard_formatters(
    created: float, level: int, message: str, arg: str, exc: bool, pid: bool, again: float
) -> None:
    process = " [%(process)d]" if pid else ""
    standard = logging.Formatter(f"%(asctime)s %(levelname)s %(name)s{process}: %(message)s")
    ours = TextFormatter(pid=pid)
    msg = message.replace("%", "%%") + " %s"
    # Twice in a second and once in the next: the second's text is reused, then renewed.
    for when in (created, int(created) + again * 0.999, int(created) + 1 + again):
        first, second = (
            _record(when, level, msg, (arg,), exc),
            _record(when, level, msg, (arg,), exc),
        )
        assert ours.format(first) == standard.format(second)
        assert (first.message, first.asctime) == (second.message, second.asctime)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Every record the ``delayq`` logger hands to its handlers, INFO and up."""
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    logger = logging.getLogger(LOGGER_NAME)
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield got
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_record_carries_what_logger_log_gave_it(records: list[logging.LogRecord]) -> None:
    log_event(logging.INFO, "job.succeeded", queue="q", id="a b", attempt=1, trace_id=None)
    try:
        raise KeyError("gone")
    except KeyError as exc:
        log_raised(logging.ERROR, "job.failed", exc, queue="q")
    log_event(logging.DEBUG, "job.started", queue="q")  # below the level: no record
    ok, failed = records
    assert (ok.name, ok.levelno, ok.levelname) == (LOGGER_NAME, logging.INFO, "INFO")
    assert ok.getMessage() == 'job.succeeded queue=q id="a b" attempt=1'
    assert ok.delayq == {"event": "job.succeeded", "queue": "q", "id": "a b", "attempt": 1,
                         "trace_id": None}  # fmt: skip
    assert ok.exc_info is None
    assert (ok.funcName, ok.pathname.endswith("_log.py"), ok.lineno > 0) == ("_log", True, True)
    assert failed.exc_info is not None
    assert failed.exc_info[0] is KeyError
    assert "KeyError: 'gone'" in logging.Formatter().format(failed)
    assert failed.delayq == {"event": "job.failed", "queue": "q"}


def test_a_disabled_logger_or_a_filter_still_stops_a_line(
    records: list[logging.LogRecord],
) -> None:
    logger = logging.getLogger(LOGGER_NAME)
    logger.disabled = True
    try:
        log_event(logging.INFO, "job.succeeded", queue="q")
    finally:
        logger.disabled = False
    drop = logging.Filter("nothing-of-delayq")
    logger.addFilter(drop)
    try:
        log_event(logging.INFO, "job.succeeded", queue="q")
    finally:
        logger.removeFilter(drop)
    log_event(logging.INFO, "job.succeeded", queue="kept")
    assert [record.delayq["queue"] for record in records] == ["kept"]
