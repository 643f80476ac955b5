"""Webhook delivery with retries, exponential backoff and dead letters.

Run: python examples/webhook_retry.py  (uses webhooks.db in the current directory)
"""

from __future__ import annotations

import threading
import time

from delayq import App, RetryPolicy, Worker, current_message

app = App("sqlite:///webhooks.db")
started = time.monotonic()


@app.task(queue="webhooks", backoff=RetryPolicy(max_attempts=3, base=0.2, factor=2.0))
def deliver(url: str, event: dict[str, object]) -> None:
    """Pretend to POST ``event`` to ``url``: one endpoint recovers, one never does."""
    attempt = current_message().attempts
    print(f"{time.monotonic() - started:5.2f}s  POST {url} attempt {attempt}")
    if "flaky" in url and attempt < 3:
        raise ConnectionError("503 Service Unavailable")
    if "down" in url:
        raise ConnectionError("connection refused")


def main() -> None:
    queue = app.queue("webhooks")
    queue.purge()
    for url in ("https://flaky.example/hook", "https://down.example/hook"):
        deliver.send(url, {"type": "order.paid", "order": 42}, id=f"hook:{url}")
    worker = Worker(app)
    threading.Thread(target=lambda: (time.sleep(2.5), worker.stop())).start()
    worker.run()
    for msg in queue.dead():
        print(
            f"dead letter: {msg.payload['args'][0]} after {msg.attempts} attempts: {msg.last_error}"
        )
    print(f"retried dead letters: {queue.retry_dead()}")  # e.g. once the endpoint is back
    app.close()


if __name__ == "__main__":
    main()
