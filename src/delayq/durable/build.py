"""Constructors of frozen slotted dataclasses that skip ``object.__setattr__``, and
their copies with some fields changed.

A frozen dataclass's ``__init__`` sets every field through ``object.__setattr__``,
which costs about twice what setting the slot itself does: for the objects the hot
paths make by the thousand (a put request per item of ``put_many``, a record and a
message per reserved message) that was a fifth of the client's time. :func:`builder`
makes, once per class, the function that creates the same object by setting its
slots directly; every field must be given, by keyword or in the order of the
fields (positional: a put_many's loop calls it once per item, and matching keywords
costs more than setting the slots).

It sets them on an instance of a plain class with the same slots (a store per field,
as fast as an attribute store gets), then makes the object an instance of the frozen
class, whose layout is the same (``__class__`` assignment): half the cost of calling
each slot's descriptor. Where the interpreter refuses that assignment, the builder
calls the descriptors instead.

:func:`replacer` makes, in the same way, what :func:`dataclasses.replace` does for such
a class: a copy with the fields given changed. ``dataclasses.replace`` looks up the
class's fields and builds a dict of keywords on every call (about 40,000
instructions for a :class:`~delayq.durable.message.Record`: the state machine's
every transition, one a claim); the replacer is one generated function of
keyword-only parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["builder", "replacer"]

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """``build(**every_field) -> cls`` (or every field in order) for the frozen, slotted
    dataclass ``cls``: the object ``cls(**every_field)`` makes, without its
    ``__init__``."""
    if not dataclasses.is_dataclass(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    names = [field.name for field in dataclasses.fields(cls)]
    slots = tuple(vars(cls)["__slots__"])
    twin: type = type(f"_{cls.__name__}Slots", (), {"__slots__": slots})
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_twin": twin}
    if _can_become(twin, cls) and set(names) == set(slots):
        lines = [f"def build({', '.join(names)}):", "    obj = _new(_twin)"]
        lines += [f"    obj.{name} = {name}" for name in names]
        lines.append("    obj.__class__ = _cls")
    else:
        for name in names:
            namespace[f"_set_{name}"] = vars(cls)[name].__set__
        lines = [f"def build({', '.join(names)}):", "    obj = _new(_cls)"]
        lines += [f"    _set_{name}(obj, {name})" for name in names]
    lines.append("    return obj")
    # Generated as dataclasses generates __init__: one statement per field, no loop.
    exec("\n".join(lines), namespace)
    build: Callable[..., T] = namespace["build"]
    build.__qualname__ = build.__name__ = f"new_{cls.__name__.lower()}"
    build.__doc__ = f"``{cls.__name__}(...)`` with every field given, built faster."
    build.__module__ = cls.__module__
    return build


#: The default of a replacer's parameters: the field is copied.
_SAME: Any = object()


def replacer(cls: type[T]) -> Callable[..., T]:
    """``replace(obj, **changes) -> cls`` for the frozen, slotted dataclass ``cls``:
    what ``dataclasses.replace(obj, **changes)`` returns (a new object, the fields
    not named copied), without its ``__init__``; an unknown field is a TypeError."""
    build = builder(cls)
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    if any(not field.init for field in fields):
        raise TypeError(f"{cls.__name__} has a field outside __init__")
    names = [field.name for field in fields]
    if {"obj", "_build", "_same"} & set(names):
        raise TypeError(f"{cls.__name__} has a field named as the replacer's own names")
    namespace: dict[str, Any] = {"_build": build, "_same": _SAME}
    params = ", ".join(f"{name}=_same" for name in names)
    args = ", ".join(f"obj.{name} if {name} is _same else {name}" for name in names)
    exec(f"def replace(obj, *, {params}):\n    return _build({args})", namespace)
    replace: Callable[..., T] = namespace["replace"]
    replace.__qualname__ = replace.__name__ = f"replace_{cls.__name__.lower()}"
    replace.__doc__ = f"``dataclasses.replace`` of a ``{cls.__name__}``, faster."
    replace.__module__ = cls.__module__
    return replace


def _can_become(twin: type, cls: type) -> bool:
    """Whether an instance of ``twin`` may be made an instance of ``cls``."""
    instance: Any = object.__new__(twin)
    try:
        instance.__class__ = cls
    except TypeError:
        return False
    return True
