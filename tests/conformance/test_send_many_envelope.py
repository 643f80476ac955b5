"""``App.send_many`` (and ``send_many_async``) writes each plain task call's envelope from
its task's fixed text (:class:`delayq.durable.serializer.DictTemplate`): on every
backend it stores byte for byte what ``put_many`` of the same calls' ``put_item()``
stores (the payload's bytes, its encoding, max_attempts), and refuses what that
refuses, with the same exception type and text, storing nothing."""

from __future__ import annotations

import asyncio
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
