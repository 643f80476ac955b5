"""Fixtures of the worker tests: ``backend_url``, a fresh store of each backend of the
conformance suite (the worker must behave the same on every one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance.conftest import BACKENDS


@pytest.fixture(params=sorted(BACKENDS))
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh, isolated store (memory, redis, sqlite)."""
    yield from BACKENDS[request.param](tmp_path)
