"""The pytest fixtures of :mod:`delayq.testing`, loaded by a project's
``pytest_plugins = ["delayq.testing"]`` (no entry point loads them by itself)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .._clock import FakeClock
from ..runtime import App
from ._harness import Harness

__all__ = ["delayq_clock", "delayq_harness"]


@pytest.fixture
def delayq_clock() -> FakeClock:
    """A :class:`~delayq.FakeClock` of this test: it moves only when told to."""
    return FakeClock()


@pytest.fixture
def delayq_harness(delayq_clock: FakeClock) -> Iterator[Callable[..., Harness]]:
    """``delayq_harness(app, **options)``: a started :class:`Harness` of ``app`` on
    ``delayq_clock`` (``options`` go to the harness's worker); after the test it is
    closed and the app pointed back at its own backend."""
    made: list[Harness] = []

    def make(app: App, **options: Any) -> Harness:
        harness = Harness(app, clock=delayq_clock, **options).start()
        made.append(harness)
        return harness

    yield make
    for harness in reversed(made):
        harness.close()
