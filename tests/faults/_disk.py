"""A disk that fills up: see the ``small_disk`` fixture (a tmpfs of 1 MiB)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["fill"]


def fill(path: Path) -> None:
    """Write the file ``path`` until its filesystem has no byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    assert os.statvfs(path.parent).f_bavail == 0
