"""Shared fixtures of the in-process engine tests: the stores every test runs on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from delayq import HeapStore, WheelStore

StoreFactory = Callable[[], Any]

#: The stores the queue tests run on: the heap, the default wheel, and a coarse wheel
#: (exact when polled, so a coarse tick must not make anything late or early).
QUEUE_STORES: dict[str, StoreFactory] = {
    "heap": HeapStore,
    "wheel": lambda: WheelStore(tick=0.001),
    "wheel-coarse": lambda: WheelStore(tick=0.25),
}


@pytest.fixture(params=list(QUEUE_STORES.values()), ids=list(QUEUE_STORES))
def make_store(request: pytest.FixtureRequest) -> StoreFactory:
    """A factory of a fresh, empty store (one per queue)."""
    return request.param  # type: ignore[no-any-return]
