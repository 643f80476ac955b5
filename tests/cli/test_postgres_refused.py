"""A PostgreSQL server that refuses the first connection (down, an unknown role or
database, ``sslmode=require`` on a server without SSL): ``delayq stats``, ``put``,
``worker`` and ``serve`` each exit 1 with the one line the Python faces raise
(tests/backends/test_postgres_open.py), without the password, and no pool warnings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("psycopg")

from backends._postgres_mistakes import NAMES, line, mistakes


def _args(command: str, tmp_path: Path) -> list[str]:
    (tmp_path / "tasks.py").write_text(
        "from delayq import App\n\napp = App('memory://')\n\n\n"
        "@app.task\ndef noop() -> None:\n    pass\n"
    )
    return {
        "stats": ["stats"],
        "put": ["put", "jobs", "{}"],
        "worker": ["worker", "tasks:app"],
        "serve": ["serve", "--port", "0"],
    }[command]


@pytest.mark.parametrize("command", ["stats", "put", "worker", "serve"])
@pytest.mark.parametrize("mistake", NAMES)
def test_each_command_says_why_in_one_line(mistake: str, command: str, tmp_path: Path) -> None:
    url, reason = mistakes()[mistake]
    args = [*_args(command, tmp_path), "--url", url]
    program = f"import sys\nfrom delayq.cli import main\nsys.argv = ['delayq', *{args!r}]\nmain()\n"
    run = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    lines = [text for text in run.stderr.splitlines() if text.strip()]
    lines = [text for text in lines if not text.startswith("warning: a password in --url")]
    assert run.returncode == 1, run.stderr
    assert lines == [f"error: {line(url, reason)}"], run.stderr
    assert run.stdout == ""
