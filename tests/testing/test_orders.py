"""delayq.testing used as a user would, on the order-timeout app (tests/testing/shop.py):
30 minutes of fake time in milliseconds, every run through the real Worker."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from delayq import FakeClock
from delayq.testing import Harness

from . import shop

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_an_unpaid_order_is_cancelled_after_30_minutes_in_milliseconds(
    harness: Harness,
) -> None:
    started = time.monotonic()
    shop.place_order(1)
    harness.advance("29m59s")
    assert shop.orders[1] == "open"
    assert harness.runs_of(shop.cancel_if_unpaid) == []
    harness.advance("1s")
    assert shop.orders[1] == "cancelled"
    [run] = harness.runs_of("cancel_if_unpaid")
    assert (run.args, run.outcome, run.error) == ((1,), "succeeded", None)
    assert run.time == harness.clock.time()
    assert time.monotonic() - started < 10.0  # 30 minutes of the app's time, not the test's


def test_a_paid_order_is_not_cancelled(harness: Harness) -> None:
    shop.place_order(2)
    harness.advance("10m")
    shop.pay(2)
    harness.advance("1h")
    assert shop.orders[2] == "paid"
    assert harness.runs_of(shop.cancel_if_unpaid) == []
    assert harness.scheduled(shop.cancel_if_unpaid) == []
    assert [run.outcome for run in harness.runs_of(shop.ship)] == ["succeeded"]


def test_the_sent_message_and_its_due_time(harness: Harness) -> None:
    shop.place_order(3)
    msg = harness.assert_sent(shop.cancel_if_unpaid, 3)
    assert msg.id == "cancel:3"
    assert harness.due_in(msg) == 30 * 60
    with pytest.raises(AssertionError, match=r"cancel_if_unpaid\(4\) was not sent.*\(3\)"):
        harness.assert_sent(shop.cancel_if_unpaid, 4)


def test_a_failing_task_is_retried_at_the_policys_delays_then_dead_with_its_exception(
    harness: Harness,
) -> None:
    shop.warehouse.up = False
    shop.pay(5)
    start = harness.clock.time()
    harness.advance("1h")
    runs = harness.runs_of(shop.ship)
    assert [run.time - start for run in runs] == [0, 10, 40, 130]  # base 10, factor 3
    assert [run.outcome for run in runs] == ["retried", "retried", "retried", "dead"]
    assert shop.shipments == [(5, 1), (5, 2), (5, 3), (5, 4)]  # current_message().attempts
    assert isinstance(runs[-1].error, shop.WarehouseDown)
    [dead] = harness.dead(shop.ship)
    assert dead.payload["args"] == [5]
    assert dead.last_error is not None
    assert "WarehouseDown: order 5: warehouse unreachable" in dead.last_error


def test_an_envelope_put_by_another_face_has_the_tasks_attempts(harness: Harness) -> None:
    """A task message put as a plain envelope (as the HTTP API and ``delayq put`` do),
    without ``max_attempts``, has the queue's default of 5: its task's 4 still end it,
    at the same delays as a ``send``."""
    shop.warehouse.up = False
    queue = shop.app.queue("orders")
    queue.put({"task": "ship", "args": [7], "kwargs": {}}, id="ship:7")
    assert queue.get("ship:7").max_attempts == 5  # type: ignore[union-attr]
    start = harness.clock.time()
    harness.advance("1h")
    runs = harness.runs_of(shop.ship)
    assert [run.time - start for run in runs] == [0, 10, 40, 130]
    assert [run.outcome for run in runs] == ["retried", "retried", "retried", "dead"]
    [dead] = harness.dead(shop.ship)
    assert dead.attempts == 4


def test_a_retry_of_an_envelope_put_by_another_face_has_the_tasks_attempts(
    harness: Harness,
) -> None:
    """A ``Retry`` raised for a plain envelope (no ``max_attempts`` of its own: the
    queue's 5) ends at its task's 3 attempts, as a failure does."""
    shop.warehouse.up = False
    queue = shop.app.queue("orders")
    queue.put({"task": "restock", "args": ["tea"], "kwargs": {}}, id="restock:tea")
    start = harness.clock.time()
    harness.advance("1m")
    runs = harness.runs_of(shop.restock)
    assert [run.time - start for run in runs] == [0, 5, 10]
    assert [run.outcome for run in runs] == ["retried", "retried", "dead"]
    [dead] = harness.dead(shop.restock)
    assert dead.attempts == 3
    assert dead.last_error == "Retry: tea: warehouse unreachable"


def test_a_task_that_recovers_on_its_second_attempt(harness: Harness) -> None:
    shop.warehouse.up = False
    shop.pay(6)
    harness.run_due()
    shop.warehouse.up = True
    assert harness.advance("9s") == []
    [run] = [run for run in harness.advance("1s") if run.task == "ship"]
    assert (run.outcome, run.message.attempts) == ("succeeded", 2)
    assert harness.dead() == []


def test_every_ticks_at_each_multiple_of_its_interval(harness: Harness) -> None:
    shop.place_order(7)
    runs = [run for run in harness.advance("30m") if run.task == "report"]
    times = [run.time for run in runs]
    assert len(times) == 6
    assert all(t % 300 == 0 for t in times)
    assert [b - a for a, b in pairwise(times)] == [300] * 5
    assert shop.reports == [1] * 6


def test_cancel_and_reschedule_by_id(harness: Harness) -> None:
    shop.place_order(8)
    shop.place_order(9)
    shop.give_more_time(8, 60)
    assert harness.due_in(harness.assert_sent(shop.cancel_if_unpaid, 8)) == 3600
    assert shop.cancel_if_unpaid.cancel("cancel:9")
    harness.advance("59m")
    assert shop.orders == {8: "open", 9: "open"}
    harness.advance("1m")
    assert shop.orders == {8: "cancelled", 9: "open"}


def test_the_app_goes_back_to_its_own_backend(delayq_clock: FakeClock) -> None:
    url, options = shop.app.url, dict(shop.app.options)
    with Harness(shop.app, clock=delayq_clock) as harness:
        assert shop.app.url == harness.url
        assert shop.app.url.startswith("memory://")
        shop.place_order(10)
    assert (shop.app.url, shop.app.options) == (url, options)
    with Harness(shop.app, clock=delayq_clock) as again:  # nothing left of the first
        assert again.scheduled() == []


def test_an_async_test_awaits_the_twins() -> None:
    async def main() -> list[str]:
        async with Harness(shop.app) as harness:
            shop.orders.clear()
            await shop.cancel_if_unpaid.send_async(11, delay="30m")
            shop.orders[11] = "open"
            runs = await harness.advance_async("30m")
            with pytest.raises(RuntimeError, match="advance_async"):
                harness.advance("1s")
            return [run.task or "" for run in runs]

    assert "cancel_if_unpaid" in asyncio.run(main())
    assert shop.orders[11] == "cancelled"


def test_raise_errors_fails_the_step_with_the_tasks_exception(
    harness: Harness, delayq_harness: Callable[..., Harness]
) -> None:
    harness.close()  # the shop's state reset; a harness that raises instead
    harness = delayq_harness(shop.app, raise_errors=True)
    shop.warehouse.up = False
    shop.pay(12)
    with pytest.raises(shop.WarehouseDown, match="order 12"):
        harness.advance("1m")
    assert [run.outcome for run in harness.runs_of(shop.ship)] == ["retried"]
    assert shop.orders[12] == "paid"
    with pytest.raises(TypeError, match="raise_errors must be a bool"):
        Harness(shop.app, raise_errors="yes")  # type: ignore[arg-type]


def test_the_example_app_of_the_repository(
    delayq_harness: Callable[..., Harness], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where its sqlite:///orders.db would be
    spec = importlib.util.spec_from_file_location("order_timeout", EXAMPLES / "order_timeout.py")
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    harness = delayq_harness(example.app)
    for order_id in (1, 2, 3):
        example.place_order(order_id)
    example.pay(2)
    harness.advance(example.PAYMENT_WINDOW)
    assert example.cancelled == [1, 3]
    assert harness.scheduled() == []
    assert not (tmp_path / "orders.db").exists()
