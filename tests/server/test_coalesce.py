"""Puts of concurrent requests stored in one batch (PutCoalescer), each request
still getting its own outcome (its id, created or kept) or its own error, on every
backend and over HTTP."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from delayq.durable import AsyncQueue, PutResult
from delayq.errors import DuplicateId, PayloadTooLarge, QueueClosed
from delayq.server import ServeConfig, create_app
from delayq.server._coalesce import PutCoalescer
from delayq.server._state import ServerState

pytestmark = pytest.mark.timeout(30)


def count_batches(queue: AsyncQueue, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the size of every ``put_many_outcomes`` the queue makes (the real one
    runs)."""
    sizes: list[int] = []
    real = queue.put_many_outcomes

    async def put_many_outcomes(items: Any) -> list[PutResult]:
        items = list(items)
        sizes.append(len(items))
        return await real(items)

    monkeypatch.setattr(queue, "put_many_outcomes", put_many_outcomes)
    return sizes


async def payload_of(queue: AsyncQueue, message_id: str) -> Any:
    """The payload of the stored message ``message_id``."""
    message = await queue.get(message_id)
    assert message is not None
    return message.payload


def run(url: str, body: Callable[[AsyncQueue], Awaitable[None]]) -> None:
    """Run ``body`` with a fresh queue over ``url`` and close it afterwards."""

    async def main() -> None:
        queue = AsyncQueue(url, name=f"coalesce-{uuid.uuid4().hex[:8]}")
        try:
            await body(queue)
        finally:
            await queue.close()

    asyncio.run(main())


def test_concurrent_puts_go_in_one_batch_each_with_its_own_id(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(queue: AsyncQueue) -> None:
        sizes = count_batches(queue, monkeypatch)
        putter = PutCoalescer(queue, max_batch=100)
        results = await asyncio.gather(
            *(putter.put({"payload": {"n": n}, "delay": 60}) for n in range(10))
        )
        assert sizes == [10]
        assert all(result.created for result in results)
        ids = [result.id for result in results]
        assert len(set(ids)) == 10
        for n, message_id in enumerate(ids):
            message = await queue.get(message_id)
            assert message is not None
            assert message.payload == {"n": n}

    run(backend_url, body)


def test_a_batch_is_cut_at_max_batch(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(queue: AsyncQueue) -> None:
        sizes = count_batches(queue, monkeypatch)
        putter = PutCoalescer(queue, max_batch=4)
        ids = await asyncio.gather(*(putter.put({"payload": n}) for n in range(10)))
        assert sorted(sizes) == [2, 4, 4]
        assert (await queue.stats()).ready == len(set(ids)) == 10

    run(backend_url, body)


def test_a_put_alone_is_not_batched(backend_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(queue: AsyncQueue) -> None:
        sizes = count_batches(queue, monkeypatch)
        putter = PutCoalescer(queue, max_batch=100)
        first = await putter.put({"payload": 1, "id": "a"})
        second = await putter.put({"payload": 2, "id": "b"})
        assert (first, second, sizes) == (PutResult("a", True), PutResult("b", True), [])

    run(backend_url, body)


def test_an_error_belongs_to_its_request_only(backend_url: str) -> None:
    async def body(queue: AsyncQueue) -> None:
        await queue.put("old", id="taken")
        putter = PutCoalescer(queue, max_batch=100)
        outcomes = await asyncio.gather(
            putter.put({"payload": 1, "id": "one"}),
            putter.put({"payload": 2, "id": "taken", "on_conflict": "error"}),
            putter.put({"payload": 3, "delay": "not a duration"}),
            putter.put({"payload": b"bytes", "id": "big"}),
            putter.put({"payload": 5, "id": "five"}),
            return_exceptions=True,
        )
        assert outcomes[0] == PutResult("one", created=True)
        assert outcomes[4] == PutResult("five", created=True)
        assert isinstance(outcomes[1], DuplicateId)
        assert isinstance(outcomes[2], ValueError)
        assert outcomes[3] == PutResult("big", created=True)
        assert await payload_of(queue, "taken") == "old"
        assert (await queue.stats()).ready == 4

    run(backend_url, body)


def test_a_too_large_payload_fails_alone(backend_url: str) -> None:
    async def body(queue: AsyncQueue) -> None:
        small = AsyncQueue(backend_url, name=queue.name, max_payload=16)
        putter = PutCoalescer(small, max_batch=100)
        try:
            outcomes = await asyncio.gather(
                putter.put({"payload": "ok", "id": "ok"}),
                putter.put({"payload": "y" * 100}),
                return_exceptions=True,
            )
        finally:
            await small.close()
        assert outcomes[0] == PutResult("ok", created=True)
        assert isinstance(outcomes[1], PayloadTooLarge)
        assert (await queue.stats()).ready == 1

    run(backend_url, body)


def test_the_same_id_twice_in_a_batch_is_put_in_order(backend_url: str) -> None:
    async def body(queue: AsyncQueue) -> None:
        putter = PutCoalescer(queue, max_batch=100)
        kept = await asyncio.gather(
            putter.put({"payload": "first", "id": "x"}),
            putter.put({"payload": "second", "id": "x"}),
        )
        assert kept == [PutResult("x", created=True), PutResult("x", created=False)]
        assert await payload_of(queue, "x") == "first"
        outcomes = await asyncio.gather(
            putter.put({"payload": "third", "id": "y"}),
            putter.put({"payload": "fourth", "id": "y", "on_conflict": "error"}),
            putter.put({"payload": "fifth", "id": "y", "on_conflict": "replace"}),
            putter.put({"payload": "sixth", "id": "y"}),
            return_exceptions=True,
        )
        # The batch failed on the duplicate and was redone one by one: each its own.
        assert outcomes[0] == PutResult("y", created=True)
        assert outcomes[2] == PutResult("y", created=True)
        assert outcomes[3] == PutResult("y", created=False)
        assert isinstance(outcomes[1], DuplicateId)
        assert await payload_of(queue, "y") == "fifth"

    run(backend_url, body)


def test_a_closed_queue_fails_every_request() -> None:
    async def body(queue: AsyncQueue) -> None:
        putter = PutCoalescer(queue, max_batch=100)
        await queue.close()
        outcomes = await asyncio.gather(
            putter.put({"payload": 1}), putter.put({"payload": 2}), return_exceptions=True
        )
        assert all(isinstance(outcome, QueueClosed) for outcome in outcomes)

    run(f"memory://coalesce-{uuid.uuid4().hex}", body)


def test_max_batch_must_be_positive() -> None:
    queue = AsyncQueue(f"memory://coalesce-{uuid.uuid4().hex}")
    with pytest.raises(ValueError, match="max_batch"):
        PutCoalescer(queue, max_batch=0)


def test_concurrent_http_puts_each_get_their_own_answer(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        state = ServerState(ServeConfig(url=backend_url, dispatch=False))
        app = create_app(state.config, state=state)
        sizes = count_batches(state.queue("q"), monkeypatch)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
                first = await http.post("/v1/queues/q/messages", json={"payload": 0, "id": "t"})
                assert first.status_code == 201
                bodies: list[dict[str, Any]] = [{"payload": n} for n in range(8)]
                bodies.append({"payload": "again", "id": "t", "on_conflict": "error"})
                answers = await asyncio.gather(
                    *(http.post("/v1/queues/q/messages", json=body) for body in bodies)
                )
                assert [answer.status_code for answer in answers] == [201] * 8 + [409]
                assert answers[-1].json()["error"]["code"] == "duplicate_id"
                ids = {answer.json()["id"] for answer in answers[:8]}
                assert len(ids) == 8
                assert {answer.json()["queue"] for answer in answers[:8]} == {"q"}
                stats = (await http.get("/v1/queues/q/stats")).json()
                assert stats["ready"] == 9
                assert sizes
                assert max(sizes) > 1
                # One batch of new, kept and repeated ids: each request its own answer.
                sizes.clear()
                again = [{"payload": 1, "id": id} for id in ("t", "n1", "n1", "n2", "t")]
                answers = await asyncio.gather(
                    *(http.post("/v1/queues/q/messages", json=body) for body in again)
                )
                assert sizes == [5]
                assert [answer.status_code for answer in answers] == [200, 201, 200, 201, 200]
                assert [answer.json() for answer in answers] == [
                    {"id": id, "queue": "q", "created": status == 201}
                    for id, status in zip(
                        ("t", "n1", "n1", "n2", "t"), (200, 201, 200, 201, 200), strict=True
                    )
                ]
        finally:
            await state.close()

    asyncio.run(main())
