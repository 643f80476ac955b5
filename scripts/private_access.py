"""Fail on a private name used outside its module, the two ways ruff's SLF001 (``make
lint``, which catches ``obj._x``) cannot see:

* a private member of another object reached by name: ``getattr(obj, "_x")``,
  ``hasattr``, ``setattr`` or ``delattr`` with a literal ``_name`` on anything but
  ``self`` or ``cls``;
* a private name imported from another module: ``from .x import _name`` (a package's
  own private submodule, ``from . import _mod``, is not a name of another module);
* a private module of another package: ``server/_dispatch.py`` may import
  ``runtime.pool`` but not ``runtime._pool``. A module ``a/_m.py`` (or package
  ``a/_m/``) is private to package ``a``: the modules of ``a`` and of the packages
  inside it import it, so ``delayq/_clock.py`` serves all of delayq and
  ``backends/_replicated/`` every backend. What packages share is a module without
  the underscore, or lives in the package both are in::

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


def imported_modules(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The absolute names of the modules an import statement of a module of
    ``package`` names: ``m`` of ``from m import a`` (an ``a`` that is private is
    :func:`imports`' to find; ``from .. import _mod`` names a module of an enclosing
    package, which may)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.level:
        return [node.module or ""]
    parts = package.split(".")
    parent = ".".join(parts[: len(parts) - node.level + 1])
    return [f"{parent}.{node.module}" if node.module else parent]


def owner(module: str) -> str | None:
    """The package that a private module (``a.b._c`` or ``a.b._c.d``) belongs to
    (``a.b``), or None when no part of its name is private."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if is_private(part):
            return ".".join(parts[:index])
    return None


def foreign_modules(tree: ast.AST, package: str) -> Iterator[tuple[int, str]]:
    """Line and name of each private module of another package that a module of
    ``package`` imports."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for module in imported_modules(node, package):
            home = owner(module)
            if home is not None and package != home and not package.startswith(f"{home}."):
                yield node.lineno, module


def package_of(path: Path) -> str:
    """The dotted package a source file under ``src/`` is a module of."""
    parts = path.relative_to(SOURCES).with_suffix("").parts
    return ".".join(parts[:-1])


def main() -> int:
    found = 0
    for path in sorted(SOURCES.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for line, module in foreign_modules(tree, package_of(path)):
            print(f"{path.relative_to(ROOT)}:{line}: imports {module}, private to another package")
            found += 1
        for line, function, name in accesses(tree):
            print(f"{path.relative_to(ROOT)}:{line}: {function}(..., {name!r}) on another object")
            found += 1
        for line, module, name in imports(tree):
            print(f"{path.relative_to(ROOT)}:{line}: from {module} import {name}")
            found += 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
