"""``App.send_many`` (and ``send_many_async``) writes each plain task call's envelope from
its task's fixed text (:class:`delayq.durable.serializer.DictTemplate`): on every
backend it stores byte for byte what ``put_many`` of the same calls' ``put_item()``
stores (the payload's bytes, its encoding, max_attempts), and refuses what that
refuses, with the same exception type and text, storing nothing. ``Task.send`` (and
``send_async``), which puts the same envelope with any option: the same against a
``put`` of its ``put_item()``."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

from delayq import App

CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((1, "é\u2028", None, True, 2.5, 10**30), {}),
    (([{"a": [1, {"b": []}]}], "[[{{"), {}),
    (("x" * 300,), {"key": "value", "n": [1, 2]}),
    ((-0.0, 1e-300, {"1": {}}), {"": None}),
]
BAD: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((float("nan"),), {}),
    ((b"bytes",), {}),
    (({1, 2},), {}),
    (("\ud800",), {}),
    (("x" * 5000,), {}),  # past max_payload
]


def _outcome(run: Any) -> tuple[str, Any]:
    try:
        return "ok", run()
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


async def _outcome_async(run: Any) -> tuple[str, Any]:
    try:
        return "ok", await run()
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


Stored = tuple[tuple[str, Any], tuple[str, Any], list[Any], list[Any]]


def _sync(app: App, messages: list[Any]) -> Stored:
    sent = _outcome(lambda: app.send_many(messages))
    put = _outcome(lambda: app.queue("put").put_many([m.put_item() for m in messages]))
    records: list[list[Any]] = [[], []]
    for index, (queue, outcome) in enumerate((("sent", sent), ("put", put))):
        if outcome[0] == "ok":
            records[index] = [app.queue(queue).backend.get(queue, id) for id in outcome[1]]
    return sent, put, *records


async def _async(app: App, messages: list[Any]) -> Stored:
    try:
        sent = await _outcome_async(lambda: app.send_many_async(messages))
        put = await _outcome_async(
            lambda: app.queue_async("put").put_many([m.put_item() for m in messages])
        )
        records: list[list[Any]] = [[], []]
        for index, (queue, outcome) in enumerate((("sent", sent), ("put", put))):
            if outcome[0] == "ok":
                backend = app.queue_async(queue).backend
                records[index] = [await backend.get(queue, id) for id in outcome[1]]
        return sent, put, *records
    finally:
        await app.close_async()


@pytest.mark.parametrize("bad", [None, *range(len(BAD))])
def test_send_many_stores_what_put_many_of_its_items_stores(
    backend_url: str, face: str, bad: int | None
) -> None:
    with App(backend_url, max_payload=4096) as app:

        @app.task(name="job", queue="sent", max_attempts=3)
        def job(*args: Any, **kwargs: Any) -> None: ...

        calls = list(CALLS) if bad is None else [*CALLS[:2], BAD[bad], *CALLS[2:]]
        messages = [job.message(*args, **kwargs) for args, kwargs in calls]
        try:
            if face == "async":
                sent, put, sent_records, put_records = asyncio.run(_async(app, messages))
            else:
                sent, put, sent_records, put_records = _sync(app, messages)
            if bad is not None:
                assert sent[0] != "ok"
                assert sent == put
                assert app.queue("sent").stats().total == app.queue("put").stats().total == 0
                return
            assert sent[0] == put[0] == "ok"
            assert len(sent_records) == len(put_records) == len(calls)
            assert [(r.payload, r.encoding, r.max_attempts) for r in sent_records] == [
                (r.payload, r.encoding, r.max_attempts) for r in put_records
            ]
        finally:
            app.queue("sent").purge()
            app.queue("put").purge()


#: Task.send's options beside the call (each as put() takes it).
OPTIONS: list[dict[str, Any]] = [
    {},
    {"delay": 30},
    {"id": "fixed-id", "on_conflict": "replace"},
    {"headers": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}},
    {"headers": {}},
]


@pytest.mark.parametrize("bad", [None, *range(len(BAD))])
def test_send_stores_what_put_of_its_put_item_stores(
    backend_url: str, face: str, bad: int | None
) -> None:
    """``Task.send`` (and ``send_async``) puts the envelope filled in: each call, with
    each set of options, stores the same payload bytes, encoding, max_attempts and
    headers as ``put(**task.message(...).put_item())``, and refuses what that refuses
    with the same exception type and text, storing nothing."""
    with App(backend_url, max_payload=4096) as app:

        @app.task(name="job", queue="sent", max_attempts=3)
        def job(*args: Any, **kwargs: Any) -> None: ...

        calls = list(CALLS) if bad is None else [BAD[bad]]

        async def send_async(args: Any, kwargs: Any, options: Any) -> tuple[str, Any]:
            sent = await _outcome_async(lambda: job.send_async(*args, **options, **kwargs))
            item = job.message(*args, **options, **kwargs).put_item()
            put = await _outcome_async(lambda: app.queue_async("put").put(**item))
            await app.close_async()
            return sent, put

        try:
            for args, kwargs in calls:
                for options in OPTIONS:
                    if face == "async":
                        sent, put = asyncio.run(send_async(args, kwargs, options))
                    else:
                        sent = _outcome(partial(job.send, *args, **options, **kwargs))
                        item = job.message(*args, **options, **kwargs).put_item()
                        put = _outcome(partial(app.queue("put").put, **item))
                    if bad is not None:
                        assert sent[0] != "ok"
                        assert sent == put
                        continue
                    assert sent[0] == put[0] == "ok"
                    stored = [
                        app.queue(queue).backend.get(queue, id)
                        for queue, id in (("sent", sent[1]), ("put", put[1]))
                    ]
                    sent_record, put_record = (
                        (r.payload, r.encoding, r.max_attempts, dict(r.headers or {}))
                        for r in stored
                    )
                    assert sent_record == put_record
                    assert sent_record[2] == 3
            if bad is not None:
                assert app.queue("sent").stats().total == app.queue("put").stats().total == 0
        finally:
            app.queue("sent").purge()
            app.queue("put").purge()


def test_send_refuses_arguments_its_function_does_not_take_as_before(backend_url: str) -> None:
    """A call that does not fit the task's signature is refused before anything is
    stored, as ``message()`` refuses it."""
    with App(backend_url) as app:

        @app.task(name="two", queue="sent")
        def two(a: int, b: int) -> None: ...

        try:
            for args, kwargs in (((1,), {}), ((1, 2, 3), {}), ((1,), {"c": 2})):
                sent = _outcome(partial(two.send, *args, **kwargs))
                made = _outcome(partial(two.message, *args, **kwargs))
                assert sent[0] == "BadArguments"
                assert sent == made
            assert app.queue("sent").stats().total == 0
        finally:
            app.queue("sent").purge()
