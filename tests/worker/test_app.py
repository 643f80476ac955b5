"""App, @app.task and cron schedules over memory:// (cron on a FakeClock)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from typing import Any

import pytest

import delayq.runtime._worker as worker_module
from delayq import FakeClock
from delayq.durable.message import State
from delayq.durable.retry import RetryPolicy
from delayq.runtime import App, BadArguments, TaskMessage, Worker, current_message

from ._helpers import memory_url, serve_until, wait_for


def test_send_puts_a_json_envelope_and_returns_the_id() -> None:
    app = App(memory_url())

    @app.task(queue="orders", max_attempts=2)
    def cancel_order(order_id: int, *, reason: str = "unpaid") -> None: ...

    msg_id = cancel_order.send(42, delay="30m", id="cancel:42", reason="timeout")
    assert msg_id == "cancel:42"
    assert cancel_order.send(42, delay="1m", id="cancel:42") == "cancel:42"  # ignored
    msg = cancel_order.get("cancel:42")
    assert msg is not None
    assert msg.payload == {"task": "cancel_order", "args": [42], "kwargs": {"reason": "timeout"}}
    assert msg.max_attempts == 2
    assert msg.queue == "orders"
    assert cancel_order.reschedule("cancel:42", delay="1h")
    assert cancel_order.cancel("cancel:42")
    assert not cancel_order.cancel("cancel:42")
    assert cancel_order(1) is None  # still callable directly
    app.close()


def test_every_task_call_has_its_awaitable_twin() -> None:
    app = App(memory_url())

    @app.task(queue="orders")
    def cancel_order(order_id: int) -> None: ...

    async def main() -> None:
        assert await cancel_order.send_async(7, delay="1h", id="cancel:7") == "cancel:7"
        msg = await cancel_order.get_async("cancel:7")
        assert msg is not None
        assert msg.payload["args"] == [7]
        assert msg == cancel_order.get("cancel:7")
        assert await cancel_order.reschedule_async("cancel:7", delay="2h")
        assert await cancel_order.cancel_async("cancel:7")
        assert await cancel_order.get_async("cancel:7") is None
        assert app.queue_async("orders") is app.queue_async("orders")
        owned = app.open_queue_async("orders")
        assert owned is not app.queue_async("orders")
        await owned.close()
        await app.close_async()

    asyncio.run(main())
    owned_sync = app.open_queue("orders")
    assert owned_sync is not app.queue("orders")
    owned_sync.close()
    app.close()


def test_the_names_before_the_naming_rule_still_work_and_warn() -> None:
    app = App(memory_url())

    async def main() -> None:
        with pytest.warns(DeprecationWarning, match=r"App\.async_queue .*App\.queue_async"):
            queue = app.async_queue("q")
        assert queue is app.queue_async("q")
        with pytest.warns(
            DeprecationWarning, match=r"App\.open_async_queue .*App\.open_queue_async"
        ):
            owned = app.open_async_queue("q")
        assert owned.name == "q"
        await owned.close()
        with pytest.warns(DeprecationWarning, match=r"App\.aclose .*App\.close_async"):
            await app.aclose()
        assert queue.closed

    asyncio.run(main())


def test_arguments_are_checked_at_send() -> None:
    app = App(memory_url())

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(BadArguments, match=r"^task 'add': missing a required argument: 'b'$"):
        add.send(1)
    with pytest.raises(BadArguments, match=r"^task 'add': too many positional arguments$"):
        asyncio.run(add.send_async(1, 2, 3))
    with pytest.raises(BadArguments, match=r"^task 'add': got an unexpected keyword argument"):
        add.message(1, 2, c=3)
    with pytest.raises(BadArguments, match=r"^task 'add': missing a required argument: 'b'$"):
        add.message(1)  # the positional bounds, checked without Signature.bind
    with pytest.raises(BadArguments, match=r"^task 'add': too many positional arguments$"):
        add.message(1, 2, 3)
    with pytest.raises(TypeError, match="cannot be serialized"):
        add.send(1, object())
    assert app.queue().stats().total == 0


def test_registration_errors() -> None:
    app = App(memory_url())

    @app.task
    def job() -> None: ...

    with pytest.raises(ValueError, match="registered already"):
        app.task(job.fn)
    with pytest.raises(TypeError, match="without arguments"):

        @app.every("1m")
        def needs_args(x: int) -> None: ...

    with pytest.raises(ValueError, match="invalid cron"):
        app.cron("every day")


def test_a_cron_with_seconds_is_refused_with_a_pointer_to_every() -> None:
    """Six fields (a seconds field first, as some crons take) are refused before
    anything is registered, and the message says what runs every N seconds."""
    app = App(memory_url())
    with pytest.raises(ValueError, match=r'use five fields.*@app\.every\("2s"\)'):
        app.cron("*/2 * * * * *")
    with pytest.raises(ValueError, match=r'@app\.every\("15s"\)'):
        app.cron("*/15 * * * * *")
    with pytest.raises(ValueError, match=r"no seconds.*@app\.every\("):
        app.cron("0 */5 * * * *")
    assert app.crons == {}
    assert app.tasks == {}


def test_send_many_groups_by_queue_and_keeps_order() -> None:
    app = App(memory_url())

    @app.task(queue="a")
    def one(x: int) -> None: ...

    @app.task(queue="b")
    def two(x: int) -> None: ...

    messages = [one.message(1, id="x1"), two.message(2, id="y2"), one.message(3, delay=5)]
    assert all(isinstance(m, TaskMessage) for m in messages)
    ids = app.send_many(messages)
    assert ids[:2] == ["x1", "y2"]
    third = app.queue("a").get(ids[2])  # each id in its message's place
    assert third is not None
    assert third.payload["args"] == [3]
    assert app.queue("a").stats().total == 2
    assert app.queue("b").stats().total == 1
    with pytest.raises(TypeError, match=r"task.message"):
        app.send_many([{"task": "one"}])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"delay": 60},
        {"at": 4_102_444_800.0, "headers": {"h": "v"}},
        {"on_conflict": "replace"},
        {"on_conflict": "error", "delay": "5m"},
    ],
    ids=["defaults", "delay", "at-headers", "replace", "error"],
)
def test_send_many_stores_what_send_stores(options: dict[str, Any]) -> None:
    app = App(memory_url())

    @app.task(queue="q", max_attempts=4)
    def job(x: int, y: int = 0) -> None: ...

    sent = job.send(1, y=2, id="one", **options)
    [many] = app.send_many([job.message(1, y=2, id="two", **options)])
    one, two = app.queue("q").get(sent), app.queue("q").get(many)
    assert one is not None
    assert two is not None
    fields = ("payload", "headers", "max_attempts", "state")
    assert [getattr(one, f) for f in fields] == [getattr(two, f) for f in fields]
    assert abs(one.due_at - two.due_at) < 1_000
    with pytest.raises(ValueError, match="on_conflict must be one of"):
        job.send(1, on_conflict=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="item 0: on_conflict must be one of"):
        app.send_many([job.message(1, on_conflict=None)])  # type: ignore[arg-type]


def test_a_task_message_is_built_equal_to_the_constructed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = App(memory_url())

    @app.task(queue="q")
    def job(x: int, y: int = 0) -> None: ...

    options: dict[str, Any] = {"delay": 5, "id": "m", "on_conflict": "error", "headers": {}}
    expected = TaskMessage(job, (1,), {"y": 2}, 5, None, "m", "error", {})
    plain = TaskMessage(job, (1,), {}, None, None, None, "ignore", None)

    def no_init(*args: Any) -> None:
        raise AssertionError("built by the frozen __init__")

    monkeypatch.setattr(TaskMessage, "__init__", no_init)  # the builder's path, not it
    built, default = job.message(1, y=2, **options), job.message(1)
    assert (built, default) == (expected, plain)
    assert type(built) is TaskMessage
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.id = "other"  # type: ignore[misc]


def test_a_worker_runs_sync_and_async_tasks_of_its_app() -> None:
    app = App(memory_url())
    results: list[object] = []

    @app.task
    def add(a: int, b: int) -> None:
        results.append(a + b)

    @app.task(queue="other")
    async def shout(text: str) -> None:
        results.append(text.upper())
        await add.send_async(40, 2)

    async def main() -> None:
        await shout.send_async("hi")
        ids = await app.send_many_async([add.message(1, b=2)])
        assert len(ids) == 1
        worker = Worker(app)
        await serve_until(worker, lambda: len(results) == 3)
        await app.close_async()

    asyncio.run(main())
    assert sorted(map(str, results)) == ["3", "42", "HI"]


def test_an_unknown_task_goes_to_dead_at_once_with_a_clear_error() -> None:
    app = App(memory_url())

    @app.task
    def known() -> None: ...

    app.queue().put({"task": "renamed_task", "args": [], "kwargs": {}}, id="u")
    app.queue().put({"not": "an envelope"}, id="v")
    # A known task's name in what is not an envelope: never run, whatever it holds.
    app.queue().put({"task": "known", "args": None}, id="w")
    app.queue().put({"task": "known", "kwargs": [1]}, id="x")

    async def main() -> None:
        worker = Worker(app)
        await serve_until(worker, lambda: worker.counts["dead"] == 4)
        assert worker.counts["retried"] == 0
        assert worker.counts["succeeded"] == 0

    asyncio.run(main())
    dead = {m.id: m for m in app.queue().dead()}
    assert "not a task message" in (dead["w"].last_error or "")
    assert "not a task message" in (dead["x"].last_error or "")
    assert dead["u"].attempts == 1
    assert dead["u"].last_error is not None
    assert "unknown task 'renamed_task'" in dead["u"].last_error
    assert "known" in dead["u"].last_error
    assert "not a task message" in (dead["v"].last_error or "")


def test_the_argument_check_agrees_with_the_signature_on_every_shape() -> None:
    """The quick check of positional calls answers as Signature.bind does."""
    app = App(memory_url())

    def both(x, y=1, /, z=2, *, k=3): ...  # type: ignore[no-untyped-def]
    def rest(*args, k): ...  # type: ignore[no-untyped-def]
    def anything(x, *rest, **kw): ...  # type: ignore[no-untyped-def]
    def nothing(): ...  # type: ignore[no-untyped-def]
    def plain(x, y, z=0): ...  # type: ignore[no-untyped-def]

    for fn in (both, rest, anything, nothing, plain):
        task, signature = app.task(fn), inspect.signature(fn)
        for count in range(6):
            for kwargs in ({}, {"k": 1}, {"z": 1}, {"x": 1}, {"other": 1}):
                args = tuple(range(count))
                try:
                    signature.bind(*args, **kwargs)
                    expected = None
                except TypeError as exc:
                    expected = f"task {fn.__name__!r}: {exc}"
                try:
                    task.check_arguments(args, kwargs)
                    got = None
                except BadArguments as exc:
                    got = str(exc)
                assert got == expected, (fn.__name__, args, kwargs)


def test_arguments_that_do_not_fit_the_task_go_to_dead_at_once_with_the_reason() -> None:
    """Put by an older version, or before the task changed: no attempt can succeed,
    so the message is not retried; the task is never called. Sync tasks (the fast
    path of a claim) and async ones alike."""
    app = App(memory_url())
    ran: list[object] = []

    @app.task
    def cancel_if_unpaid(order_id: int) -> None:
        ran.append(order_id)

    @app.task
    async def remind(order_id: int, *, channel: str = "mail") -> None:
        ran.append(channel)

    put = app.queue().put
    put({"task": "cancel_if_unpaid", "args": [1, 2, 3], "kwargs": {}}, id="many")
    put({"task": "cancel_if_unpaid", "args": [], "kwargs": {}}, id="none")
    put({"task": "remind", "args": [1], "kwargs": {"chanel": "sms"}}, id="typo")
    put({"task": "cancel_if_unpaid", "args": [7], "kwargs": {}}, id="fits")

    async def main() -> None:
        worker = Worker(app)
        settled = ("dead", "retried", "succeeded")
        await serve_until(worker, lambda: sum(worker.counts[k] for k in settled) == 4)
        assert (worker.counts["dead"], worker.counts["retried"]) == (3, 0)

    asyncio.run(main())
    assert ran == [7]
    dead = {m.id: m for m in app.queue().dead()}
    assert {key: (m.attempts, m.last_error) for key, m in dead.items()} == {
        "many": (1, "BadArguments: task 'cancel_if_unpaid': too many positional arguments"),
        "none": (1, "BadArguments: task 'cancel_if_unpaid': missing a required argument: "
                 "'order_id'"),
        "typo": (1, "BadArguments: task 'remind': got an unexpected keyword argument 'chanel'"),
    }  # fmt: skip
    app.close()


def test_task_backoff_and_timeout_apply() -> None:
    app = App(memory_url())
    attempts: list[int] = []

    @app.task(backoff=RetryPolicy(max_attempts=2, base=0.01, jitter=0), timeout=0.05)
    async def slow() -> None:
        attempts.append(current_message().attempts)
        await asyncio.sleep(1)

    msg_id = slow.send()

    async def main() -> None:
        worker = Worker(app)
        await serve_until(worker, lambda: worker.counts["dead"] == 1)

    asyncio.run(main())
    assert attempts == [1, 2]
    msg = slow.get(msg_id)
    assert msg is not None
    assert msg.state is State.DEAD
    assert msg.last_error == "HandlerTimeout: timed out after 0.05s"


# -- cron on a fake clock -------------------------------------------------------------


def cron_app(catch_up: bool = True) -> tuple[App, FakeClock, list[str]]:
    clock = FakeClock(wall=1_700_000_000.0)  # a multiple of 10 s: now is on a tick
    app = App(memory_url(), clock=clock)
    runs: list[str] = []

    @app.every("10s", catch_up=catch_up)
    def beat() -> None:
        runs.append(current_message().id)

    return app, clock, runs


def test_three_workers_run_each_tick_once() -> None:
    app, clock, runs = cron_app()

    async def main() -> None:
        workers = [Worker(app, concurrency=2) for _ in range(3)]
        tasks = [asyncio.create_task(w.serve()) for w in workers]
        await asyncio.sleep(0.05)
        for tick in range(1, 21):
            clock.advance(10)
            await wait_for(lambda n=tick: len(runs) >= n)
        await asyncio.sleep(0.1)
        for worker in workers:
            worker.stop()
        await asyncio.gather(*tasks)
        assert sum(w.counts["succeeded"] for w in workers) == 20

    asyncio.run(main())
    assert len(runs) == 20
    assert len(set(runs)) == 20
    assert runs[0] == "cron:beat:2023-11-14T22:13:30Z"


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_worker_back_from_an_outage_catches_up_only_the_latest_tick(catch_up: bool) -> None:
    app, clock, runs = cron_app(catch_up)

    async def main() -> None:
        first = Worker(app)
        task = asyncio.create_task(first.serve())
        await asyncio.sleep(0.05)
        clock.advance(10)
        await wait_for(lambda: len(runs) == 1)
        first.stop()
        await task
        clock.advance(55)  # five ticks pass with no worker
        second = Worker(app)
        task = asyncio.create_task(second.serve())
        if catch_up:
            await wait_for(lambda: len(runs) == 2)
        await asyncio.sleep(0.1)
        assert len(runs) == (2 if catch_up else 1)
        clock.advance(5)  # the next regular tick
        await wait_for(lambda: len(runs) == (3 if catch_up else 2))
        await asyncio.sleep(0.05)
        second.stop()
        await task

    asyncio.run(main())
    assert len(set(runs)) == len(runs)


def test_a_tick_put_again_after_its_run_does_not_run_again() -> None:
    app, clock, runs = cron_app()
    job = app.crons["beat"]

    async def main() -> None:
        worker = Worker(app)
        task = asyncio.create_task(worker.serve())
        await asyncio.sleep(0.05)
        clock.advance(10)
        await wait_for(lambda: worker.counts["succeeded"] == 1)  # acked: the id is gone
        clock.advance(1)
        # A producer that computed this tick in time but whose put landed only now.
        tick_ms = 1_700_000_010_000
        item = job.tick_item(tick_ms)
        await app.queue_async().put(**item)
        await wait_for(lambda: worker.counts["skipped"] == 1)
        # The skipped tick is acked at once, not left leased until its lease runs out.
        for _ in range(200):
            if await app.queue_async().get(item["id"]) is None:
                break
            await asyncio.sleep(0.01)
        assert await app.queue_async().get(item["id"]) is None
        worker.stop()
        await task
        await app.close_async()

    asyncio.run(main())
    assert runs == ["cron:beat:2023-11-14T22:13:30Z"]


def test_the_ack_of_a_tick_waits_until_the_guard_past_its_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of tick T is acked (its id freed) only once the clock is past T plus the
    guard, so a put of T landing in T's own millisecond cannot follow the ack and
    create T again (delayq.runtime._cron). On a fake clock frozen at T the guard
    holds the ack for its whole length; it is stretched from 2 ms to 0.6 s here so
    that a skipped guard shows every run."""
    monkeypatch.setattr(worker_module, "CRON_ACK_GUARD", 0.6)
    app, clock, runs = cron_app()

    async def main() -> None:
        worker = Worker(app)
        task = asyncio.create_task(worker.serve())
        await asyncio.sleep(0.05)
        clock.advance(10)  # the clock stands at the tick
        await wait_for(lambda: len(runs) == 1)
        await asyncio.sleep(0.2)  # the handler returned; the guard holds the ack
        queue = app.queue_async(app.crons["beat"].task.queue)
        held = await queue.get(runs[0])
        assert worker.counts["succeeded"] == 0
        assert held is not None
        assert held.state is State.ACTIVE
        await wait_for(lambda: worker.counts["succeeded"] == 1)
        assert await queue.get(runs[0]) is None
        worker.stop()
        await task
        await app.close_async()

    asyncio.run(main())
    assert runs == ["cron:beat:2023-11-14T22:13:30Z"]
