"""Public names of a package imported from their modules on first use (PEP 562), so
that importing the package costs nothing until a name is used."""

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (its ``namespace`` is its
    ``globals()``, with ``__all__``): each name of ``homes`` is imported from its
    module (relative to ``package``) when first read, then kept in ``namespace``."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        namespace[name] = value  # the next access is a plain lookup
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(namespace["__all__"]))

    return getattr_, dir_
