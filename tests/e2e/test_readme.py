"""The fenced python blocks of README.md's "## Durable queues" section run as written,
each in a fresh interpreter in an empty directory (``$DELAYQ_URL`` unset)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Durable queues"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section_blocks(text: str, heading: str) -> list[str]:
    """The python blocks between ``heading`` and the next heading of its level."""
    _, found, rest = text.partition(f"\n{heading}\n")
    if not found:
        return []
    body = re.split(r"^## ", rest, maxsplit=1, flags=re.MULTILINE)[0]
    return FENCE.findall(body)


BLOCKS = section_blocks(README.read_text(encoding="utf-8"), SECTION)


def test_the_section_has_python_blocks() -> None:
    assert len(BLOCKS) >= 2, f"no python blocks under {SECTION!r} in {README}"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i + 1}" for i in range(len(BLOCKS))])
def test_block_runs_as_written(code: str, tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DELAYQ_URL"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, (
        f"{code}\n--- stdout:\n{result.stdout}\n--- stderr:\n{result.stderr}"
    )
