"""The one rule for queue names and message ids, on every face (Python, CLI, HTTP,
dashboard), with no I/O.

What a put may write (:func:`check_queue_name`, :func:`check_message_id`): 1 to 255
characters; no control character (C0 with NUL, DEL, C1) and no lone surrogate, so no
name or id can forge a log line or break an HTTP header; not ``.`` or ``..``, which
URL parsers drop from a path; no space at either end, almost always a slip of copy and
paste, which forms (the dashboard's search) trim. A queue name is one segment of a URL
path, so it may not hold ``/``, nor ``{`` or ``}`` (Redis keys put the name inside a
``{...}`` hash tag). A message id may hold ``/`` (ids are often made of keys and URLs:
``hook:https://example.com/x``): the HTTP routes take the rest of the path as the id,
``%2F`` or ``/`` alike. Letters of any script are welcome; a queue name must be in
Unicode's NFC form (``café`` of 4 code points, not ``cafe`` and a combining accent; ``K``,
not the Kelvin sign), so two names that look the same are one queue; the refusal names
the NFC form. Message ids are compared as given (they are often made elsewhere: a file
name on macOS is NFD). NFC does not make look-alikes of different scripts one (Latin
``a`` and Cyrillic ``\u0430``), nor compatibility forms (fullwidth ``\uff2b``, ligatures).

What a read may address (:func:`check_stored`): anything a backend can hold, 1 to 255
characters without NUL. Everything but ``put`` and ``put_many`` (opening a queue, get,
cancel, reschedule, reserve, stats, purge...) takes that, so a queue or message stored
under a name or id that an older delayq accepted stays readable, cancellable and
drainable; nothing new can be written under one. A read is not normalized: it
addresses the name exactly as given, so a queue an older delayq made under an NFD name
is read, drained and purged under that name, and its NFC twin is another queue.
"""

from __future__ import annotations

import re
import unicodedata

#: Longest message id and queue name, in characters.
MAX_ID_LENGTH = 255

__all__ = [
    "InvalidMessageId",
    "InvalidName",
    "InvalidQueueName",
    "check_message_id",
    "check_queue_name",
    "check_stored",
    "queue_name_problem",
]

QUEUE_NAME = "queue name"
MESSAGE_ID = "message id"

# C0 (NUL included), DEL, C1, and the surrogate code points (never valid alone).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

_QUEUE_NAME_BAD = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff/{}]")


class InvalidName(ValueError):
    """A queue name or message id that may not be written (a ``ValueError``)."""

    code = "invalid_name"


class InvalidQueueName(InvalidName):
    """A queue name that may not be written."""

    code = "invalid_queue"


class InvalidMessageId(InvalidName):
    """A message id that may not be written."""

    code = "invalid_id"


def check_stored(kind: str, value: object) -> str:
    """``value`` if a read may address it: a str of 1 to 255 characters without NUL
    (TypeError for another type, else :class:`InvalidMessageId` for a ``kind`` of
    :data:`MESSAGE_ID`, :class:`InvalidQueueName` for any other)."""
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    problem = _length_problem(kind, value)
    if problem is None and "\x00" in value:
        problem = _control_problem(kind, value, value.index("\x00"))
    if problem is not None:
        # The same class as a put's refusal of that value (a ValueError too), so
        # every face gives one kind of mistake one name (HTTP: one code).
        raise (InvalidMessageId if kind == MESSAGE_ID else InvalidQueueName)(problem)
    return value


def _length_problem(kind: str, value: str) -> str | None:
    if value and len(value) <= MAX_ID_LENGTH:
        return None
    return f"{kind} must be 1 to {MAX_ID_LENGTH} characters, got {len(value)}: {value!r:.80}"


def _control_problem(kind: str, value: str, at: int) -> str:
    return (
        f"{kind} must not contain control characters or lone surrogates, "
        f"got {value[at]!r} at {at}: {value!r:.80}"
    )


def _problem(kind: str, value: str, bad: re.Pattern[str], forbidden: str) -> str | None:
    """Why ``value`` may not be written as a ``kind``, or None."""
    problem = _length_problem(kind, value)
    if problem is not None:
        return problem
    found = bad.search(value)
    if found is not None:
        if _CONTROL.match(found.group()):
            return _control_problem(kind, value, found.start())
        return f"{kind} must not contain {forbidden}, got {value!r:.80}"
    if value in (".", ".."):
        return f"{kind} cannot be {value!r}: URLs drop that path segment"
    if value != value.strip():
        return f"{kind} must not start or end with a space, got {value!r:.80}"
    return None


def queue_name_problem(name: str) -> str | None:
    """Why a put may not write to the queue ``name`` (a str), or None."""
    problem = _problem(QUEUE_NAME, name, _QUEUE_NAME_BAD, "'/', '{' or '}'")
    if problem is None and not unicodedata.is_normalized("NFC", name):
        nfc = unicodedata.normalize("NFC", name)
        problem = f"{QUEUE_NAME} must be in Unicode NFC form ({nfc!r:.80}), got {name!a:.80}"
    return problem


def check_queue_name(name: object) -> str:
    """``name`` if a put may write to a queue of that name, else
    :class:`InvalidQueueName` (TypeError for a non-str)."""
    if not isinstance(name, str):
        raise TypeError(f"{QUEUE_NAME} must be a str, not {type(name).__name__}")
    problem = queue_name_problem(name)
    if problem is not None:
        raise InvalidQueueName(problem)
    return name


def check_message_id(value: object) -> str:
    """``value`` if a put may write a message of that id, else
    :class:`InvalidMessageId` (TypeError for a non-str)."""
    if not isinstance(value, str):
        raise TypeError(f"{MESSAGE_ID} must be a str, not {type(value).__name__}")
    problem = _problem(MESSAGE_ID, value, _CONTROL, "control characters")
    if problem is not None:
        raise InvalidMessageId(problem)
    return value
