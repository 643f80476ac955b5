"""A PostgreSQL server that refuses the first connection (down, an unknown role or
database, ``sslmode=require`` on a server without SSL): ``delayq stats``, ``put``,
``worker`` and ``serve`` each exit 1 with the one line the Python faces raise
(tests/backends/test_postgres_open.py), without the password, and no pool warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from backends._postgres_mistakes import NAMES, line, mistakes

from ._helpers import command_args, error_lines, run_delayq


@pytest.mark.parametrize("command", ["stats", "put", "worker", "serve"])
@pytest.mark.parametrize("mistake", NAMES)
def test_each_command_says_why_in_one_line(mistake: str, command: str, tmp_path: Path) -> None:
    url, reason = mistakes()[mistake]
    run = run_delayq([*command_args(command, tmp_path), "--url", url], tmp_path)
    assert run.returncode == 1, run.stderr
    assert error_lines(run) == [f"error: {line(url, reason)}"], run.stderr
    assert run.stdout == ""
