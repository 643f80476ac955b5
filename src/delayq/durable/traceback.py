"""What the faces show of a ``last_error``: the user's frames, or one short line.

A failed handler's ``last_error`` (see ``error_text``) is stored whole: the summary,
then the traceback, whose first frames are delayq's own (the worker's call of the
handler). Every face shows the same cuts of that text, made here at display time, so
the stored text loses nothing and any stored error (an older one, one written by
another machine) is shown the same way:

* :func:`user_traceback`: each traceback without the delayq frames that come before
  the first frame of someone else's file (the handler's);
* :func:`short_error`: the summary line and the innermost frame of the user's own code
  (``at tasks.py:12 in charge``), for a table cell.

:func:`user_frames` makes the first cut on a live traceback, for the worker's log line.

A frame is delayq's when its file is a module of this installed delayq package (the
path after its last ``delayq`` directory names one of them).
"""

from __future__ import annotations

import functools
import re
import sysconfig
from pathlib import Path, PurePath
from types import TracebackType

__all__ = ["short_error", "user_frames", "user_traceback"]

_PACKAGE = Path(__file__).resolve().parent.parent
_HEADER = re.compile(r"^(?P<lead>[ |+]*)(?:Exception Group )?Traceback \(most recent call last\):$")
_FRAME = re.compile(
    r'^(?P<lead>[ |]*)  File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<name>.*)$'
)
_LIBRARIES = tuple(
    str(Path(path).resolve())
    for path in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)


@functools.lru_cache(maxsize=512)
def _is_delayq(file: str) -> bool:
    parts = PurePath(file.replace("\\", "/")).parts
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] == "delayq":
            inside = parts[index + 1 :]
            return bool(inside) and _PACKAGE.joinpath(*inside).is_file()
    return False


@functools.lru_cache(maxsize=512)
def _is_library(file: str) -> bool:
    """A file of the standard library or of an installed package: not the user's."""
    parts = PurePath(file.replace("\\", "/")).parts
    return "site-packages" in parts or "dist-packages" in parts or file.startswith(_LIBRARIES)


def _frame_end(lines: list[str], start: int, lead: str) -> int:
    """The index after the frame starting at ``lines[start]`` (its source lines)."""
    end = start + 1
    while end < len(lines) and lines[end].startswith(lead + "    "):
        end += 1
    return end


def user_traceback(text: str) -> str:
    """``text`` with, in each of its tracebacks, delayq's own frames before the first
    frame of another file left out (none when no such frame follows them)."""
    lines = text.split("\n")
    shown: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        shown.append(line)
        index += 1
        header = _HEADER.match(line)
        if header is None:
            continue
        skip = index
        while skip < len(lines):
            frame = _FRAME.match(lines[skip])
            if frame is None or frame["lead"] != header["lead"] or not _is_delayq(frame["file"]):
                break
            skip = _frame_end(lines, skip, frame["lead"])
        if skip < len(lines) and _FRAME.match(lines[skip]):
            index = skip
    return "\n".join(shown)


def user_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from its first frame that is not delayq's (``tb`` itself when all are)."""
    frame = tb
    while frame is not None and _is_delayq(frame.tb_frame.f_code.co_filename):
        frame = frame.tb_next
    return tb if frame is None else frame


def short_error(text: str) -> str:
    """The first line of ``text`` and, when it holds a traceback, where the user's own
    code was when it was raised: ``"ValueError: boom\\n  at tasks.py:12 in charge"``
    (the innermost frame outside delayq, the standard library and installed packages;
    else the innermost one outside delayq)."""
    summary = text.split("\n", 1)[0]
    frames = [m for m in map(_FRAME.match, text.split("\n")) if m and not _is_delayq(m["file"])]
    if not frames:
        return summary
    own = [frame for frame in frames if not _is_library(frame["file"])]
    where = (own or frames)[-1]
    name = PurePath(where["file"].replace("\\", "/")).name
    return f"{summary}\n  at {name}:{where['line']} in {where['name']}"
