"""Order timeout with cancel-on-payment: cancel an order unless it is paid in time.

Run: python examples/order_timeout.py  (uses orders.db in the current directory)
"""

from __future__ import annotations

import threading
import time

from delayq import App, Worker

app = App("sqlite:///orders.db")
PAYMENT_WINDOW = 1.0  # seconds here; "30m" in real life
cancelled: list[int] = []


@app.task(queue="orders")
def cancel_if_unpaid(order_id: int) -> None:
    """Runs only for orders that were not paid: a paid order's message was cancelled."""
    print(f"order {order_id}: not paid in time -> cancelled")
    cancelled.append(order_id)


def place_order(order_id: int) -> None:
    cancel_if_unpaid.send(order_id, delay=PAYMENT_WINDOW, id=f"cancel:{order_id}")
    print(f"order {order_id}: placed, pay within {PAYMENT_WINDOW:g}s")


def pay(order_id: int) -> None:
    if cancel_if_unpaid.cancel(f"cancel:{order_id}"):
        print(f"order {order_id}: paid -> timeout cancelled")


def main() -> None:
    app.queue("orders").purge()
    for order_id in (1, 2, 3):
        place_order(order_id)
    pay(2)
    worker = Worker(app)
    threading.Thread(target=lambda: (time.sleep(PAYMENT_WINDOW + 1.0), worker.stop())).start()
    worker.run()
    print(f"cancelled orders: {sorted(cancelled)}")
    app.close()


if __name__ == "__main__":
    main()
