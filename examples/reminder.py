"""A reminder at an absolute time (an aware datetime), rescheduled once.

Run: python examples/reminder.py  (uses reminders.db in the current directory)
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from delayq import App, Worker

app = App("sqlite:///reminders.db")
done = asyncio.Event()


@app.task(queue="reminders")
async def remind(user: str, text: str, due: str) -> None:
    late = datetime.now(timezone.utc) - datetime.fromisoformat(due)
    print(f"reminder for {user}: {text} ({late.total_seconds() * 1000:.0f} ms after {due})")
    done.set()


async def main() -> None:
    await app.queue_async("reminders").purge()
    at = datetime.now(timezone.utc) + timedelta(seconds=0.5)
    await remind.send_async("ada", "stand-up", at.isoformat(), at=at, id="remind:ada:standup")
    later = at + timedelta(seconds=0.5)  # the meeting moved: same id, new time
    await remind.reschedule_async("remind:ada:standup", at=later)
    # The payload still says the first time; a real app would replace the message.
    print(f"reminder set for {later:%H:%M:%S.%f} UTC")
    worker = Worker(app)
    serving = asyncio.create_task(worker.serve())
    await asyncio.wait_for(done.wait(), 10)
    worker.stop()
    await serving
    await app.close_async()


if __name__ == "__main__":
    asyncio.run(main())
