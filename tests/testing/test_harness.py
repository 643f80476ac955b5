"""The Harness's answers to bad input and misuse, App.configure, and Worker.burst's
limit: each one a clear exception before anything is changed."""

from __future__ import annotations

import asyncio

import pytest

from delayq import (
    App,
    AsyncQueue,
    Discard,
    FakeClock,
    Message,
    Retry,
    SystemClock,
    Worker,
    current_message,
)
from delayq._duration import DurationError
from delayq.testing import Harness

from . import shop


def test_a_harness_takes_an_app_and_a_fake_clock() -> None:
    with pytest.raises(TypeError, match="runs a delayq App, not str"):
        Harness("memory://")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must be a delayq\.FakeClock"):
        Harness(shop.app, clock=SystemClock())  # type: ignore[arg-type]
    url = shop.app.url
    with pytest.raises(ValueError, match="concurrency"):
        Harness(shop.app, concurrency=0).start()
    assert shop.app.url == url  # refused before the app was touched


def test_bad_delays_and_task_names(harness: Harness) -> None:
    with pytest.raises(ValueError, match="delay must be seconds >= 0"):
        harness.advance(-1)
    with pytest.raises(DurationError):
        harness.advance("soon")
    with pytest.raises(ValueError, match=r"no task named 'nope'.*cancel_if_unpaid"):
        harness.runs_of("nope")
    other = App("memory://")
    stranger = other.task(lambda: None, name="stranger")
    with pytest.raises(ValueError, match="is not a task of"):
        harness.scheduled(stranger)
    with pytest.raises(TypeError, match="due_in takes a Message"):
        harness.due_in("cancel:1")  # type: ignore[arg-type]


def test_a_stopped_harness_says_so() -> None:
    harness = Harness(shop.app)
    with pytest.raises(RuntimeError, match="not started"):
        harness.run_due()
    with pytest.raises(RuntimeError, match="not started"):
        harness.scheduled()
    harness.close()  # idempotent, a no-op before start
    with harness, pytest.raises(RuntimeError, match="started already"):
        harness.start()


def test_harness_aclose_still_works_and_warns() -> None:
    app = App("memory://harness-aclose")
    job = app.task(lambda: None, name="job")

    async def main() -> None:
        harness = Harness(app).start()
        await job.send_async(delay="1h")
        with pytest.warns(DeprecationWarning, match=r"Harness\.aclose .*Harness\.close_async"):
            await harness.aclose()
        assert app.url == "memory://harness-aclose"

    asyncio.run(main())


def test_configure_points_an_app_at_another_backend() -> None:
    clock = FakeClock()
    app = App("sqlite:///never-opened.db")
    job = app.task(lambda: None, name="job")
    with pytest.raises(TypeError, match="url must be a str or None"):
        app.configure(42)  # type: ignore[arg-type]
    app.configure("memory://configure-test", clock=clock)
    assert (app.url, app.options) == ("memory://configure-test", {"clock": clock})
    queue = app.queue()
    job.send(delay="1h")
    app.configure("memory://configure-other")
    assert queue.closed
    assert app.queue().stats().total == 0

    async def open_async() -> None:
        await app.queue_async().stats()
        with pytest.raises(RuntimeError, match="close_async"):
            app.configure("memory://")
        await app.close_async()
        app.configure("memory://")

    asyncio.run(open_async())


def test_a_burst_ends_at_its_limit_when_a_task_sends_itself_without_delay() -> None:
    app = App("memory://burst-limit")

    @app.task
    def again() -> None:
        again.send()

    async def main() -> None:
        worker = Worker(app, concurrency=1)
        with pytest.raises(ValueError, match="limit"):
            await worker.burst(limit=0)
        again.send()
        with pytest.raises(RuntimeError, match=r"sends? itself again"):
            await worker.burst(limit=5)
        assert worker.counts["succeeded"] == 5

    asyncio.run(main())
    app.queue().purge()
    app.close()


def test_cron_ticks_on_the_hour_and_one_catch_up_run_after_a_jump(
    delayq_clock: FakeClock,
) -> None:
    app = App("sqlite:///never-opened.db")
    ran: list[float] = []

    @app.cron("0 * * * *")
    def hourly() -> None:
        ran.append(delayq_clock.time())

    with Harness(app, clock=delayq_clock) as harness:
        harness.advance("3h")
        assert len(ran) == 3
        assert all(t % 3600 == 0 for t in ran)
        delayq_clock.advance(7200)  # a worker down for two hours
        runs = harness.run_due()
        assert [run.outcome for run in runs] == ["succeeded"]  # one catch-up, not two
        assert len(ran) == 4


def test_a_sync_task_asks_for_a_retry_then_discards(delayq_clock: FakeClock) -> None:
    app = App("sqlite:///never-opened.db")
    attempts: list[int] = []

    @app.task
    def flaky(n: int) -> None:
        attempts.append(current_message().attempts)
        if len(attempts) == 1:
            raise Retry(delay="7s")
        raise Discard("not worth it")

    with Harness(app, clock=delayq_clock) as harness:
        flaky.send(1)
        start = delayq_clock.time()
        runs = harness.advance("1m")
        assert [(r.outcome, r.time - start) for r in runs] == [("retried", 0), ("dead", 7)]
        assert isinstance(runs[1].error, Discard)
        assert attempts == [1, 2]
        [dead] = harness.dead(flaky)
        assert dead.last_error == "Discard: not worth it"


def test_advance_runs_each_message_at_its_millisecond(delayq_clock: FakeClock) -> None:
    app = App("sqlite:///never-opened.db")

    @app.task
    def tick(n: int) -> None:
        pass

    with Harness(app, clock=delayq_clock) as harness:
        start = delayq_clock.time()
        for ms in (123, 7, 999, 1001):
            tick.send(ms, delay=ms / 1000)
        runs = harness.advance("1s")
        assert [run.args for run in runs] == [(7,), (123,), (999,)]
        for run in runs:
            assert abs(run.time - start - run.args[0] / 1000) < 1e-6
        assert delayq_clock.time() == start + 1.0
        assert [run.args for run in harness.advance("1ms")] == [(1001,)]


def test_a_burst_of_a_handlers_worker_reports_its_runs() -> None:
    clock = FakeClock()

    async def main() -> list[tuple[str | None, str, object]]:
        queue = AsyncQueue("memory://burst-handler", name="plain", clock=clock)
        seen: list[object] = []

        async def handler(msg: Message) -> None:
            seen.append(msg.payload)
            if msg.payload == "bad":
                raise ValueError("bad payload")

        worker = Worker(queue, handler, concurrency=1)
        await queue.put("ok")
        await queue.put("bad", max_attempts=1)
        await queue.put("later", delay=60)
        runs = await worker.burst()
        assert seen == ["ok", "bad"]
        assert await queue.get(runs[0].message.id) is None  # acked
        await queue.purge()
        await queue.close()
        return [(run.task, run.outcome, run.message.payload) for run in runs]

    assert asyncio.run(main()) == [(None, "succeeded", "ok"), (None, "dead", "bad")]
