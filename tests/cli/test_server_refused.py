"""A server that refuses the first use of a queue URL (each mistake of each backend's
``tests/backends/_<backend>_mistakes.py``: PostgreSQL down, an unknown role or
database, ``sslmode=require`` on a server without SSL; Redis down, without TLS, not a
cluster, a password missing or wrong): ``delayq stats``, ``put``, ``worker`` and
``serve`` each exit 1 with the one line the Python faces raise
(tests/backends/test_postgres_open.py, test_redis_open.py), without the password, and
nothing else (no pool warnings, no traceback)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from backends import _postgres_mistakes, _redis_mistakes

from ._helpers import command_args, error_lines, run_delayq

#: backend -> its module of mistakes
MODULES = {"postgres": _postgres_mistakes, "redis": _redis_mistakes}
COMMANDS = ("stats", "put", "worker", "serve")
#: (backend, mistake, command): every command for each mistake, and ``stats`` alone for
#: a mistake's variant on another topology (a module's ``VARIANTS``).
CASES = [
    (backend, mistake, command)
    for backend, module in MODULES.items()
    for mistake in module.NAMES
    for command in (COMMANDS[:1] if mistake in getattr(module, "VARIANTS", ()) else COMMANDS)
]


@pytest.fixture(scope="module")
def mistakes(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, dict[str, tuple[str, str]]]]:
    """backend -> mistake -> (its URL, the cause delayq names)."""
    with _redis_mistakes.server(tmp_path_factory.mktemp("redis-password")) as ports:
        yield {"postgres": _postgres_mistakes.mistakes(), "redis": _redis_mistakes.mistakes(ports)}


@pytest.mark.parametrize(("backend", "mistake", "command"), CASES)
def test_each_command_says_why_in_one_line(
    backend: str,
    mistake: str,
    command: str,
    mistakes: dict[str, dict[str, tuple[str, str]]],
    tmp_path: Path,
) -> None:
    if backend == "postgres":
        pytest.importorskip("psycopg")
    url, reason = mistakes[backend][mistake]
    run = run_delayq([*command_args(command, tmp_path), "--url", url], tmp_path)
    assert run.returncode == 1, run.stderr
    assert error_lines(run) == [f"error: {MODULES[backend].line(url, reason)}"], run.stderr
    assert run.stdout == ""
