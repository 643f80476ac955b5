"""Fail on a private name used outside its module, the two ways ruff's SLF001 (``make
lint``, which catches ``obj._x``) cannot see:

* a private member of another object reached by name: ``getattr(obj, "_x")``,
  ``hasattr``, ``setattr`` or ``delattr`` with a literal ``_name`` on anything but
  ``self`` or ``cls``;
* a private name imported from another module: ``from .x import _name`` (a package's
  own private submodule, ``from . import _mod``, is not a name of another module)::

    python scripts/private_access.py   # exit 1, one line per access (make lint)

Dunder (``__dict__``) and sunder (``_value_``) names are not private. Standard library
only.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "src"
_BY_NAME = frozenset({"getattr", "hasattr", "setattr", "delattr"})
_OWN = frozenset({"self", "cls"})


def is_private(name: str) -> bool:
    """``_name``, but neither ``__dunder__`` nor ``_sunder_``."""
    return name.startswith("_") and not name.endswith("_")


def accesses(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """Line, function and name of each access by name to a private member of another
    object."""
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _BY_NAME
            and len(node.args) >= 2
        ):
            continue
        target, name = node.args[0], node.args[1]
        if isinstance(target, ast.Name) and target.id in _OWN:
            continue
        if (
            isinstance(name, ast.Constant)
            and isinstance(name.value, str)
            and is_private(name.value)
        ):
            yield node.lineno, node.func.id, name.value


def imports(tree: ast.AST) -> Iterator[tuple[int, str, str]]:
    """Line, module and name of each private name imported from another module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if is_private(alias.name):
                    yield node.lineno, "." * node.level + node.module, alias.name


def main() -> int:
    found = 0
    for path in sorted(SOURCES.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for line, function, name in accesses(tree):
            print(f"{path.relative_to(ROOT)}:{line}: {function}(..., {name!r}) on another object")
            found += 1
        for line, module, name in imports(tree):
            print(f"{path.relative_to(ROOT)}:{line}: from {module} import {name}")
            found += 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
