"""Payload encoding: JSON by default, any ``dumps``/``loads`` object on request.

A payload given as bytes (or bytearray/memoryview) is stored untouched and comes
back as ``bytes``, whatever the serializer. Everything else goes through the
serializer; a payload it cannot encode raises :class:`TypeError` before anything
is stored, one that nests more than ``MAX_PAYLOAD_DEPTH`` (64) containers raises
:class:`PayloadTooDeep`, one that holds more than ``MAX_PAYLOAD_VALUES`` (100,000)
values raises :class:`PayloadTooManyValues` (both ``ValueError``), and an encoded
payload above the queue's limit raises :class:`~delayq.PayloadTooLarge`. Reading
never raises for one record: a payload that cannot be decoded (written with another
serializer), or that nests too deep or holds too many values (stored before the
limits) is reported as its error instead (:meth:`Codec.read`). Pickle is never the
default: passing the :mod:`pickle` module works but warns, since unpickling runs
arbitrary code.
"""

from __future__ import annotations

import json
import pickle
import re
import threading
import warnings
from collections.abc import Mapping
from json import encoder as json_encoder
from typing import Any, Protocol, runtime_checkable

from ..errors import PayloadTooLarge
from .constants import MAX_PAYLOAD_DEPTH, MAX_PAYLOAD_VALUES

__all__ = [
    "RAW_ENCODING",
    "Codec",
    "DictTemplate",
    "Filled",
    "JSONSerializer",
    "PayloadTooDeep",
    "PayloadTooManyValues",
    "Serializer",
    "too_deep",
    "too_many_values",
]

#: The ``encoding`` of a payload given as bytes and stored untouched.
RAW_ENCODING = "bytes"


class PayloadTooDeep(ValueError):
    """The payload nests more containers than ``MAX_PAYLOAD_DEPTH``: no JSON reader
    (the HTTP API's answers included) could be relied on to read it back."""


class PayloadTooManyValues(ValueError):
    """The payload holds more values (containers and scalars) than
    ``MAX_PAYLOAD_VALUES``: decoded, it would cost its readers many times its size."""


_CONTAINERS = (dict, list, tuple)


def too_deep(payload: object, limit: int = MAX_PAYLOAD_DEPTH) -> bool:
    """True when ``payload`` nests more than ``limit`` dicts, lists or tuples one
    inside the other (``1`` nests 0, ``[1]`` 1, ``{"a": [1]}`` 2). Iterative, so any
    depth is measured without recursion; it stops at the first path too deep."""
    if not isinstance(payload, _CONTAINERS):
        return False
    stack: list[tuple[Any, int]] = [(payload, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        container, depth = pop()
        if depth > limit:
            return True
        children = container.values() if isinstance(container, dict) else container
        for child in children:
            # An empty child is too deep only past the limit: a wide payload of empty
            # containers (``[[], [], ...]``) is walked without stacking each of them.
            if isinstance(child, _CONTAINERS) and (child or depth >= limit):
                push((child, depth + 1))
    return False


def too_many_values(payload: object, limit: int = MAX_PAYLOAD_VALUES) -> bool:
    """True when ``payload`` holds more than ``limit`` values: itself, and every
    container and scalar inside it (dict keys aside). Iterative; it stops counting
    past the limit."""
    count = 1
    stack: list[Any] = [payload]
    pop, push = stack.pop, stack.append
    while stack:
        container = pop()
        if not isinstance(container, _CONTAINERS):
            continue
        children = container.values() if isinstance(container, dict) else container
        count += len(children)
        if count > limit:
            return True
        for child in children:
            if isinstance(child, _CONTAINERS):
                push(child)
    return False


def _json_opened(text: bytes) -> int:
    """How many containers JSON ``text`` opens at most (brackets inside strings only
    count too many)."""
    return text.count(b"[") + text.count(b"{")


def _json_fits(text: bytes) -> bool:
    """True when JSON ``text`` surely nests at most MAX_PAYLOAD_DEPTH containers: it
    opens no more than that many."""
    return _json_opened(text) <= MAX_PAYLOAD_DEPTH


def _json_few(text: bytes, opened: int) -> bool:
    """True when JSON ``text``, which opens at most ``opened`` containers, surely holds
    at most MAX_PAYLOAD_VALUES values: every value but the whole is the first in its
    container or follows a comma (brackets and commas inside strings only count too
    many)."""
    return 1 + opened + text.count(b",") <= MAX_PAYLOAD_VALUES


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _json_within_limits(text: bytes) -> bool:
    """True when JSON ``text`` surely nests at most MAX_PAYLOAD_DEPTH containers and
    holds at most MAX_PAYLOAD_VALUES values: what :meth:`Codec.encode` concludes from
    the text alone, without walking the payload."""
    opened = _json_opened(text)
    return opened <= MAX_PAYLOAD_DEPTH and (
        len(text) < MAX_PAYLOAD_VALUES or _json_few(text, opened)
    )


def _json_values(text: bytes) -> int:
    """How many values JSON ``text`` holds, counted on the text without decoding it
    (what a reader checks before it builds them): outside strings, every value but
    the whole is the first in a container that is not empty, or follows a comma."""
    bare = _STRING.sub(b"", text).translate(None, b" \t\n\r")
    opened = bare.count(b"[") + bare.count(b"{")
    return 1 + opened - bare.count(b"[]") - bare.count(b"{}") + bare.count(b",")


@runtime_checkable
class Serializer(Protocol):
    """Anything with ``dumps(obj) -> bytes | str`` and ``loads(bytes) -> obj``
    (the :mod:`json` module itself qualifies)."""

    def dumps(self, obj: Any, /) -> bytes | str:
        """Encode ``obj``; raise ``TypeError``/``ValueError`` if it cannot."""
        ...

    def loads(self, data: bytes, /) -> Any:
        """Decode what :meth:`dumps` produced."""
        ...


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# JSONEncoder.encode() builds the C encoder that does the work anew on every call, around
# a new dict of the containers it is inside (to refuse circular ones): half the cost of
# encoding a small payload. Each thread keeps one instead, with its dict, which is empty
# again after every call (cleared after an error, which can leave entries behind).
_make_c_encoder: Any = getattr(json_encoder, "c_make_encoder", None)
_threads = threading.local()


def _new_c_encoder(markers: dict[int, Any] | None) -> Any:
    """The C encoder JSONEncoder.encode makes for _ENCODER, around ``markers`` (None:
    it checks no container for circularity)."""
    return _make_c_encoder(
        markers,
        _ENCODER.default,
        json_encoder.encode_basestring,
        None,
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        False,
        False,
        False,
    )


def _c_encoder() -> tuple[Any, dict[int, Any]]:
    markers: dict[int, Any] = {}
    return _new_c_encoder(markers), markers


def _encode_reusing(obj: Any) -> str:
    """``_ENCODER.encode(obj)`` with this thread's C encoder."""
    try:
        encoder, markers = _threads.encoder
    except AttributeError:
        encoder, markers = _threads.encoder = _c_encoder()
    try:
        return "".join(encoder(obj, 0))
    except BaseException:
        markers.clear()
        raise


def _reuse_works() -> bool:
    """The C encoder is there and takes the arguments JSONEncoder gives it (a private
    interface of the json module): else every call goes through JSONEncoder.encode."""
    if _make_c_encoder is None:
        return False
    sample = {"a": [1, 2.5, None, True, "\u00e9\n"], "b": {}}
    try:
        return _encode_reusing(sample) == _ENCODER.encode(sample)
    except Exception:  # any failure means: do not use it
        return False


_encode = _encode_reusing if _reuse_works() else _ENCODER.encode


# json.loads(bytes) first guesses the encoding (UTF-8, 16 or 32), then decodes, then
# matches whitespace on both sides of the document with regular expressions: two thirds
# of the time a small payload takes. What delayq encodes is UTF-8 with nothing around
# it, which the decoder's scanner reads at once; anything else is left to json.loads,
# which reads it, or raises as it would.
_scan_once: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _decode(data: bytes) -> Any:
    """``json.loads(data)``."""
    try:
        text = data.decode()
        obj, end = _scan_once(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return json.loads(data)
    if end != len(text):
        return json.loads(data)  # whitespace after it, or a second document: an error
    return obj


class JSONSerializer:
    """Compact UTF-8 JSON; NaN and infinities are refused (they are not JSON)."""

    name = "json"

    def dumps(self, obj: Any, /) -> bytes:
        """Encode ``obj`` as JSON bytes."""
        return _encode(obj).encode()

    def loads(self, data: bytes, /) -> Any:
        """Decode JSON bytes."""
        return _decode(data)

    def __repr__(self) -> str:
        return "JSONSerializer()"


# A C encoder without the dict of the containers it is inside: stateless, so every
# thread shares it. It does not refuse a circular container, which it recurses into
# until RecursionError: only Codec.encode uses it (a plain payload, a template's
# values), and any error sends the payload the dict's own way (_encode), which refuses
# it as it always did. Where that interface is missing or differs, a stand-in whose
# output the same join reads.
def _make_unchecked() -> Any:
    def stand_in(obj: Any, _indent: int) -> tuple[str]:
        return (_ENCODER.encode(obj),)

    if _make_c_encoder is None:
        return stand_in
    write = _new_c_encoder(None)
    sample = {"a": [1, 2.5, None, True, "\u00e9\n", (3,)], "b": {}}
    try:
        if "".join(write(sample, 0)) == _ENCODER.encode(sample):
            return write
    except Exception:  # any failure means: do not use it
        pass
    return stand_in


_write_unchecked = _make_unchecked()


class DictTemplate:
    """Dict payloads whose first keys hold the same values in many messages, followed
    by two keys whose values vary: the runtime's task envelope ``{"task": name,
    "args": [...], "kwargs": {...}}``. ``Filled((template, first, second))`` is a
    payload every codec stores as it stores the dict :meth:`payload` makes of it, byte
    for byte, and refuses as it refuses that dict, with the same error: delayq's JSON
    writes the fixed part here, once, and per message the two values alone
    (:meth:`Codec.encode`); any other serializer, a value that fails, and a text near a
    limit take the dict's own path."""

    __slots__ = ("empty_tail", "fixed", "head", "keys", "middle")

    def __init__(self, fixed: Mapping[str, object], keys: tuple[str, str]) -> None:
        self.fixed = dict(fixed)
        self.keys = tuple(keys)
        names = [*self.fixed, *self.keys]
        if len(self.keys) != 2 or any(type(name) is not str for name in names):
            raise TypeError("a DictTemplate's keys are str, two of them varying")
        if len(set(names)) != len(names):
            raise ValueError(f"a key is both fixed and varying: {names}")
        first, second = (_encode(key) for key in self.keys)
        #: The JSON text before the first value (``'{"task":"job","args":'``), None
        #: when delayq's JSON cannot write a fixed value (every payload then takes the
        #: dict's path, which refuses it); between the two (``',"kwargs":'``); and
        #: after the first when the second is an empty dict (``',"kwargs":{}}'``).
        self.head: str | None
        try:
            fixed_text = "".join(f"{_encode(k)}:{_encode(v)}," for k, v in self.fixed.items())
        except (TypeError, ValueError, OverflowError, RecursionError):
            self.head = None
        else:
            self.head = f"{{{fixed_text}{first}:"
        self.middle = f",{second}:"
        self.empty_tail = f"{self.middle}{{}}}}"

    def payload(self, filled: Filled) -> dict[str, object]:
        """The dict ``filled`` stands for."""
        _, first, second = filled
        return {**self.fixed, self.keys[0]: first, self.keys[1]: second}

    def __repr__(self) -> str:
        return f"DictTemplate({self.fixed!r}, {self.keys!r})"


class Filled(tuple[Any, ...]):
    """``(template, first, second)``: a :class:`DictTemplate` and the values of its
    two varying keys; a payload (see the template)."""

    __slots__ = ()


#: What Codec.encode does not give its serializer as it is: bytes stored untouched, and
#: a template's dict.
_NOT_SERIALIZED = (bytes, bytearray, memoryview, Filled)


#: A JSON text this short nests too few containers to be too deep (each opens and closes).
_SHALLOW = 2 * MAX_PAYLOAD_DEPTH
_TOO_DEEP_TO_SHOW = (
    f"the payload nests more than {MAX_PAYLOAD_DEPTH} dicts/lists one inside "
    "the other: it cannot be shown"
)


class Codec:
    """A queue's payload rules: a serializer plus a size limit, in both directions."""

    __slots__ = ("_json", "encoding", "max_payload", "serializer")

    def __init__(self, serializer: object = None, max_payload: int | None = None) -> None:
        if serializer is None:
            serializer = JSONSerializer()
        elif not isinstance(serializer, Serializer):
            raise TypeError(
                f"serializer must have dumps() and loads(), not {type(serializer).__name__}"
            )
        if serializer is pickle:
            warnings.warn(
                "pickle as a delayq serializer runs arbitrary code when a message is "
                "loaded: use it only if every producer is trusted",
                stacklevel=3,
            )
        if max_payload is not None and (type(max_payload) is not int or max_payload < 1):
            raise ValueError(f"max_payload must be an int >= 1 or None, got {max_payload!r}")
        self.serializer: Serializer = serializer
        self.max_payload = max_payload
        name = getattr(serializer, "name", None) or getattr(serializer, "__name__", None)
        self.encoding = str(name or type(serializer).__name__)
        # Only delayq's JSON is known to write brackets for every container.
        self._json = type(serializer) is JSONSerializer

    def encode(self, payload: object) -> tuple[bytes, str]:
        """``(data, encoding)`` for ``payload``; TypeError, PayloadTooDeep,
        PayloadTooManyValues or PayloadTooLarge if it cannot be stored."""
        if isinstance(payload, _NOT_SERIALIZED):  # one check on the common path
            if type(payload) is Filled:
                template, first, second = payload
                head = template.head
                if head is not None and self._json:
                    # The template's dict written from its fixed text, stored only where
                    # the dict's path would store that text (no limit it needs the
                    # payload walked for); anything else takes that path, which words
                    # each refusal as it always did.
                    try:
                        if type(second) is dict and not second:
                            text = (
                                f"{head}{''.join(_write_unchecked(first, 0))}{template.empty_tail}"
                            )
                        else:
                            text = (
                                f"{head}{''.join(_write_unchecked(first, 0))}{template.middle}"
                                f"{''.join(_write_unchecked(second, 0))}}}"
                            )
                        data = text.encode()  # UnicodeEncodeError: a lone surrogate
                    except Exception:  # RecursionError too (a circular value)
                        pass
                    else:
                        size = len(data)
                        if (size <= 2 * MAX_PAYLOAD_DEPTH or _json_within_limits(data)) and (
                            self.max_payload is None or size <= self.max_payload
                        ):
                            return data, self.encoding
                return self.encode(template.payload(payload))
            data, encoding = bytes(payload), RAW_ENCODING
        elif self._json:
            try:
                # delayq's JSON without its dumps() around it, and without the table of
                # the containers it is inside (a put_many pays this per item). Any
                # error, RecursionError for a circular value included, sends the
                # payload through dumps()' own function, which refuses it as it
                # always did.
                data = "".join(_write_unchecked(payload, 0)).encode()
            except Exception:
                try:
                    data = _encode(payload).encode()
                except RecursionError:
                    raise self._too_deep(payload) from None
                except (TypeError, ValueError, OverflowError) as exc:
                    raise self._unencodable(payload, exc) from exc
            encoding = self.encoding
            # JSON opens and closes a container in two bytes and counts a value in one
            # at least: a text that short can be neither too deep nor too many.
            if len(data) > 2 * MAX_PAYLOAD_DEPTH:
                self._check_limits(payload, data)
        else:
            try:
                encoded = self.serializer.dumps(payload)
            except RecursionError:
                raise self._too_deep(payload) from None
            except (TypeError, ValueError, OverflowError) as exc:
                raise self._unencodable(payload, exc) from exc
            if isinstance(encoded, str):
                encoded = encoded.encode()
            elif not isinstance(encoded, bytes):
                raise TypeError(f"{self.encoding}.dumps() returned {type(encoded).__name__}")
            data, encoding = encoded, self.encoding
            self._check_limits(payload, None)
        if self.max_payload is not None and len(data) > self.max_payload:
            raise PayloadTooLarge(
                f"payload is {len(data)} bytes serialized, the limit is {self.max_payload}"
            )
        return data, encoding

    def _unencodable(self, payload: object, exc: Exception) -> TypeError:
        return TypeError(
            f"payload of type {type(payload).__name__} cannot be serialized "
            f"by {self.encoding}: {exc}"
        )

    def _check_limits(self, payload: object, json_text: bytes | None) -> None:
        """PayloadTooDeep or PayloadTooManyValues for ``payload``; ``json_text``, its
        text in delayq's JSON, is counted instead of the payload where that says it
        is within a limit."""
        opened = 0 if json_text is None else _json_opened(json_text)
        if (json_text is None or opened > MAX_PAYLOAD_DEPTH) and too_deep(payload):
            raise self._too_deep(payload)
        few = json_text is not None and (
            len(json_text) < MAX_PAYLOAD_VALUES or _json_few(json_text, opened)
        )
        if not few and too_many_values(payload):
            raise PayloadTooManyValues(
                f"payload of type {type(payload).__name__} holds more than "
                f"{MAX_PAYLOAD_VALUES} values (containers and scalars): split it, or "
                "send it as bytes"
            )

    @staticmethod
    def _too_deep(payload: object) -> PayloadTooDeep:
        return PayloadTooDeep(
            f"payload of type {type(payload).__name__} nests more than {MAX_PAYLOAD_DEPTH} "
            "dicts/lists one inside the other: flatten it, or send it as bytes"
        )

    def decode(self, data: bytes, encoding: str) -> Any:
        """The payload stored as ``data`` with ``encoding``."""
        if encoding == RAW_ENCODING:
            return bytes(data)
        return self.serializer.loads(data)

    def read(self, data: bytes, encoding: str) -> tuple[Any, str | None]:
        """``(payload, None)`` for a stored payload, or ``(None, why)`` when it cannot
        be given back: this serializer fails on it (it was written with another one,
        ``encoding`` names which), or it nests more than MAX_PAYLOAD_DEPTH containers
        or holds more than MAX_PAYLOAD_VALUES values (stored before those limits).
        Never raises, so one such record spoils nothing but itself."""
        if encoding == RAW_ENCODING:
            return bytes(data), None
        if not self._json:
            try:
                payload = self.serializer.loads(data)
            except Exception as exc:  # whatever a serializer raises on bytes it cannot read
                return None, self._unreadable(encoding, exc)
            if too_deep(payload):
                return None, _TOO_DEEP_TO_SHOW
            if too_many_values(payload):
                return None, self._too_many_to_show()
            return payload, None
        # delayq's JSON. As in write: a JSON text holds at most one value per byte, and
        # opens at most one container per two (each closes too), so a short one is
        # counted in nothing.
        size = len(data)
        if (
            size >= MAX_PAYLOAD_VALUES
            and not _json_few(data, _json_opened(data))
            and _json_values(data) > MAX_PAYLOAD_VALUES
        ):
            return None, self._too_many_to_show()
        try:
            payload = _decode(data)
        except Exception as exc:
            return None, self._unreadable(encoding, exc)
        if size <= _SHALLOW or _json_fits(data) or not too_deep(payload):
            return payload, None
        return None, _TOO_DEEP_TO_SHOW

    def _unreadable(self, encoding: str, exc: Exception) -> str:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        return (
            f"the payload (encoding {encoding!r}) cannot be decoded by this queue's "
            f"serializer ({self.encoding}): {text}"
        )

    @staticmethod
    def _too_many_to_show() -> str:
        return (
            f"the payload holds more than {MAX_PAYLOAD_VALUES} values (containers and "
            "scalars): it cannot be shown"
        )
