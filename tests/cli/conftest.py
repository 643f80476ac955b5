"""Fixtures of the CLI tests: a fresh SQLite queue file per test, a plain terminal.

memory:// lives in one process and each command opens its own backend, so the
commands are tested against a SQLite file in ``tmp_path`` (what they use by default).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ._helpers import Cli


@pytest.fixture(autouse=True)
def _plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """No colours, a wide terminal, no DELAYQ_URL from the caller's shell."""
    for name in ("FORCE_COLOR", "DELAYQ_URL", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A queue URL of a SQLite file that does not exist yet."""
    return f"sqlite:///{tmp_path / 'q.db'}"


@pytest.fixture
def cli(url: str) -> Cli:
    """``delayq`` bound to :func:`url`."""
    return Cli(url)
