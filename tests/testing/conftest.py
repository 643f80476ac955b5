"""The fixtures of delayq.testing, as a user's conftest.py gets them (pytest_plugins is
for a rootdir conftest only: tests/ has none, so they are imported), and a harness of
the shop app with its module state reset."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from delayq.testing import Harness, delayq_clock, delayq_harness  # noqa: F401

from . import shop


@pytest.fixture
def harness(delayq_harness: Callable[..., Harness]) -> Harness:  # noqa: F811
    shop.orders.clear()
    shop.shipments.clear()
    shop.reports.clear()
    shop.warehouse.up = True
    return delayq_harness(shop.app)
