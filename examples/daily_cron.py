"""A daily job at 01:00 Berlin time, run once per day whatever the number of
workers, next to a fast heartbeat so the script shows ticks in a few seconds.

Run: python examples/daily_cron.py  (uses cron.db in the current directory)
Start it in two terminals at once: each tick still runs exactly once.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

from delayq import App, Worker, current_message

app = App("sqlite:///cron.db")


@app.cron("0 1 * * *", tz="Europe/Berlin")
def nightly_report() -> None:
    """Every day at 01:00 in Berlin (23:00 or 00:00 UTC, depending on the season)."""
    print("nightly report:", current_message().id)


@app.every("1s", catch_up=False)
def heartbeat() -> None:
    print("heartbeat:", current_message().id)


def main() -> None:
    job = app.crons["nightly_report"]
    now = int(time.time() * 1000)
    tick = job.schedule.next_after(now)
    berlin = datetime.fromtimestamp(tick / 1000, ZoneInfo("Europe/Berlin"))
    utc = datetime.fromtimestamp(tick / 1000, timezone.utc)
    print(f"next nightly report: {berlin:%Y-%m-%d %H:%M %Z} = {utc:%H:%M} UTC")
    worker = Worker(app)
    threading.Thread(target=lambda: (time.sleep(3.2), worker.stop())).start()
    worker.run()
    app.close()


if __name__ == "__main__":
    main()
