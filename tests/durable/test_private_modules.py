"""A private module (``_name.py``) is its package's: what packages share is a module
without the underscore, or lives in the package both are in (``scripts/private_access.py``,
run by ``make lint``)."""

from __future__ import annotations

import ast

import pytest

from ._scripts import load_script

private_access = load_script("private_access")


def _foreign(source: str, package: str) -> list[str]:
    return [module for _, module in private_access.foreign_modules(ast.parse(source), package)]


@pytest.mark.parametrize(
    ("package", "source", "found"),
    [
        ("delayq.server", "from ..runtime._pool import Gate", ["delayq.runtime._pool"]),
        ("delayq.server", "import delayq.runtime._pool as pool", ["delayq.runtime._pool"]),
        ("delayq.cli", "from delayq.server._protocol import P", ["delayq.server._protocol"]),
        ("delayq.backends.amqp", "from ..redis._ops import Ops", ["delayq.backends.redis._ops"]),
        ("delayq.durable._async", "from ...runtime._app import App", ["delayq.runtime._app"]),
        # a shared module without the underscore
        ("delayq.server", "from ..runtime.pool import Gate", []),
        ("delayq.cli", "from ..server import protocol", []),
        # the package's own, and those of the packages it is in
        ("delayq.server", "from ._errors import ERROR_CODES", []),
        ("delayq.server", "from .._clock import SystemClock", []),
        ("delayq.backends.amqp", "from .._replicated._link import LoopLink", []),
        ("delayq.backends.memory", "from .._records import Records", []),
        ("delayq.durable._async", "from .._facade import QueueBase", []),
        ("delayq.backends.redis", "from . import _driver", []),
    ],
)
def test_the_lint_finds_a_private_module_of_another_package(
    package: str, source: str, found: list[str]
) -> None:
    assert _foreign(source, package) == found


def test_no_module_imports_a_private_module_of_another_package(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert private_access.main() == 0, capsys.readouterr().out
