"""The order-timeout app of docs/guide/testing.md, as a user's module declares it."""

from __future__ import annotations

import os

from delayq import App, Retry, RetryPolicy, current_message

app = App(os.environ.get("DELAYQ_URL", "sqlite:///shop.db"))
PAYMENT_WINDOW = "30m"

orders: dict[int, str] = {}  # order id -> "open", "paid", "cancelled"
shipments: list[tuple[int, int]] = []  # (order id, attempt) of each try to ship
reports: list[int] = []  # open orders at each report


class WarehouseDown(Exception):
    """The warehouse's API did not answer."""


class Warehouse:
    up = True


warehouse = Warehouse()


def place_order(order_id: int) -> None:
    orders[order_id] = "open"
    cancel_if_unpaid.send(order_id, delay=PAYMENT_WINDOW, id=f"cancel:{order_id}")


def pay(order_id: int) -> None:
    orders[order_id] = "paid"
    cancel_if_unpaid.cancel(f"cancel:{order_id}")
    ship.send(order_id)


def give_more_time(order_id: int, minutes: int) -> None:
    cancel_if_unpaid.reschedule(f"cancel:{order_id}", delay=minutes * 60)


@app.task(queue="orders")
def cancel_if_unpaid(order_id: int) -> None:
    if orders.get(order_id) == "open":
        orders[order_id] = "cancelled"


@app.task(queue="orders", backoff=RetryPolicy(max_attempts=4, base=10, factor=3, jitter=0))
async def ship(order_id: int) -> None:
    shipments.append((order_id, current_message().attempts))
    if not warehouse.up:
        raise WarehouseDown(f"order {order_id}: warehouse unreachable")


@app.task(queue="orders", max_attempts=3)
def restock(item: str) -> None:
    if not warehouse.up:
        raise Retry(5, reason=f"{item}: warehouse unreachable")


@app.every("5m")
def report() -> None:
    reports.append(sum(status == "open" for status in orders.values()))
