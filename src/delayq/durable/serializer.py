"""Payload encoding: JSON by default, any ``dumps``/``loads`` object on request.

A payload given as bytes (or bytearray/memoryview) is stored untouched and comes
back as ``bytes``, whatever the serializer. Everything else goes through the
serializer; a payload it cannot encode raises :class:`TypeError` before anything
is stored, and an encoded payload above the queue's limit raises
:class:`~delayq.PayloadTooLarge`. Pickle is never the default: passing the
:mod:`pickle` module works but warns, since unpickling runs arbitrary code.
"""

from __future__ import annotations

import json
import pickle
import warnings
from typing import Any, Protocol, runtime_checkable

from .._constants import RAW_ENCODING
from ..errors import PayloadTooLarge

__all__ = ["Codec", "JSONSerializer", "Serializer"]


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


class JSONSerializer:
    """Compact UTF-8 JSON; NaN and infinities are refused (they are not JSON)."""

    name = "json"
    # One encoder for every call: json.dumps with options builds a new one each time.
    _encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

    def dumps(self, obj: Any, /) -> bytes:
        """Encode ``obj`` as JSON bytes."""
        return self._encode(obj).encode()

    def loads(self, data: bytes, /) -> Any:
        """Decode JSON bytes."""
        return json.loads(data)

    def __repr__(self) -> str:
        return "JSONSerializer()"


class Codec:
    """A queue's payload rules: a serializer plus a size limit, in both directions."""

    __slots__ = ("encoding", "max_payload", "serializer")

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

    def encode(self, payload: object) -> tuple[bytes, str]:
        """``(data, encoding)`` for ``payload``; TypeError or PayloadTooLarge if it
        cannot be stored."""
        if isinstance(payload, (bytes, bytearray, memoryview)):
            data, encoding = bytes(payload), RAW_ENCODING
        else:
            try:
                encoded = self.serializer.dumps(payload)
            except (TypeError, ValueError, OverflowError, RecursionError) as exc:
                raise TypeError(
                    f"payload of type {type(payload).__name__} cannot be serialized "
                    f"by {self.encoding}: {exc}"
                ) from exc
            if isinstance(encoded, str):
                encoded = encoded.encode()
            elif not isinstance(encoded, bytes):
                raise TypeError(f"{self.encoding}.dumps() returned {type(encoded).__name__}")
            data, encoding = encoded, self.encoding
        if self.max_payload is not None and len(data) > self.max_payload:
            raise PayloadTooLarge(
                f"payload is {len(data)} bytes serialized, the limit is {self.max_payload}"
            )
        return data, encoding

    def decode(self, data: bytes, encoding: str) -> Any:
        """The payload stored as ``data`` with ``encoding``."""
        if encoding == RAW_ENCODING:
            return bytes(data)
        return self.serializer.loads(data)
