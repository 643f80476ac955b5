"""Fail when a face of delayq knows a backend by hand: every face asks the registry
(each backend's descriptor, ``delayq.durable.descriptor``), so that a new backend is
one package and one line (docs/backends.md). In the faces (``cli/``, ``server/``,
``runtime/``, ``durable/``) this finds:

* an import of a backend's package (``delayq.backends...``) or of a module of its
  client library (each descriptor's ``client``: ``sqlite3``, ``redis``, ``psycopg``...);
* a string in the code (docstrings and comments are prose, not read) that names a
  scheme of a backend: ``"amqp"``, ``"redis://"``, ``f"... sqlite:///..."``::

    python scripts/backend_names.py   # exit 1, one line per finding (make lint)

A default URL is the one place a face may name a scheme: ``DEFAULT_QUEUE_URL`` of
``durable/constants.py``, which the others read.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "delayq"
FACES = ("cli", "server", "runtime", "durable")
#: Where a face may name a scheme: the default URL, given once.
ALLOWED = {("durable/constants.py", "DEFAULT_QUEUE_URL")}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _allowed(tree: ast.AST, where: str) -> set[int]:
    """The ids of the string constants assigned to a name of :data:`ALLOWED`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if any((where, name) in ALLOWED for name in names) and node.value is not None:
                found.update(id(n) for n in ast.walk(node.value))
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The absolute names an import statement of ``module`` (dotted) imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parent = module.split(".")[: -node.level]
        base = ".".join([*parent, base] if base else parent)
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def findings(
    source: str, where: str, module: str, schemes: Collection[str], clients: Collection[str]
) -> Iterator[tuple[int, str]]:
    """Line and description of each place of ``source`` (the module ``module``, at
    ``where`` under the package) that names a backend."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _allowed(tree, where)
    names = "|".join(re.escape(s) for s in sorted(schemes, key=len, reverse=True))
    url = re.compile(rf"(?<![\w+.-])({names}):/", re.IGNORECASE)
    bare = {s.lower() for s in schemes}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _imported(node, module):
                if name == "delayq.backends" or name.startswith("delayq.backends."):
                    yield node.lineno, f"imports the backend package {name}"
                    break
                if name.partition(".")[0] in clients:
                    yield node.lineno, f"imports {name}, a backend's client library"
                    break
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in skip:
                continue
            text = node.value
            match = url.search(text)
            if match is not None:
                yield node.lineno, f"names the scheme {match.group(1)}:// in {text[:60]!r}"
            elif text.lower() in bare:
                yield node.lineno, f"names the scheme {text!r}"


def main() -> int:
    """Check every face module; print one line per finding; 1 if any."""
    sys.path.insert(0, str(ROOT / "src"))
    from delayq.durable.registry import descriptors  # noqa: PLC0415

    backends = descriptors()
    schemes = {scheme for found in backends for scheme in found.schemes}
    clients = {module for found in backends for module in found.client}
    failed = 0
    for face in FACES:
        for path in sorted((PACKAGE / face).rglob("*.py")):
            where = path.relative_to(PACKAGE).as_posix()
            module = ".".join(["delayq", *path.relative_to(PACKAGE).with_suffix("").parts])
            if path.name == "__init__.py":
                module = module.rpartition(".")[0] + ".__init__"
            for line, what in findings(path.read_text(), where, module, schemes, clients):
                print(f"src/delayq/{where}:{line}: {what}")
                failed += 1
    if failed:
        print(
            f"{failed} place(s) of a face name a backend: ask its descriptor through "
            "delayq.durable.registry instead (docs/backends.md)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
