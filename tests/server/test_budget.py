"""What one answer may cost (issue 33, point 2): a payload of too many values is
refused at put; a list, a reserve and the dashboard's queue page of large or hostile
stored messages answer a page bounded in bytes and in the server's memory; and the
event loop is not held up while such an answer is made."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from conformance._helpers import stored_request
from delayq.durable import Message, Queue, State
from delayq.server._budget import encode_messages, fetch_page

from ._helpers import error_of, put, stats
from .conftest import MakeClient
from .test_serve_hardening import serving

_JSON = {"content-type": "application/json"}
#: The documented byte budget of one answer (4 MiB).
SERVE_ANSWER_BUDGET = 4 * 1024 * 1024
#: 1.02 MB of JSON that decodes to 25 MB: the probe's payload.
HOSTILE = json.dumps([[] for _ in range(340_000)], separators=(",", ":"))
#: A legitimate large payload: a 1 MB string.
LARGE = "x" * 1_000_000


def test_a_payload_of_too_many_values_is_refused_at_put(any_client: TestClient) -> None:
    put(any_client, id="kept")
    for path, body, where in (
        ("messages", f'{{"id": "many", "payload": {HOSTILE}}}', "payload"),
        (
            "messages/batch",
            f'{{"messages": [{{"payload": 1}}, {{"payload": {HOSTILE}}}]}}',
            "item 1",
        ),
    ):
        response = any_client.post(f"/v1/queues/q/{path}", content=body, headers=_JSON)
        assert error_of(response, 422) == "payload_too_many_values"
        message = response.json()["error"]["message"]
        assert where in message
        assert "more than 100000 values" in message
    assert stats(any_client)["ready"] == 1
    assert any_client.get("/v1/queues/q/messages/many").status_code == 404


def _store(url: str, payload: str, count: int, prefix: str) -> list[str]:
    """``count`` messages of the JSON ``payload`` written below the queue's checks
    (as a message stored before the limits, or by another writer)."""
    ids = [f"{prefix}-{index}" for index in range(count)]
    requests = [stored_request(message_id, payload.encode()) for message_id in ids]
    with Queue(url, name="q") as queue:
        queue.backend.put("q", requests)
    return ids


def _peak(call: Callable[[], Any]) -> tuple[Any, int]:
    """What ``call`` returns, and the most memory it held at once beyond what was
    held before (bytes, tracemalloc)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = call()
        return result, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.fixture
def stored(tmp_path: Path, make_client: MakeClient) -> tuple[TestClient, TestClient]:
    """Two clients over two sqlite stores: one of ten large plain messages, one of
    ten hostile ones."""
    plain_url, hostile_url = f"sqlite:///{tmp_path}/plain.db", f"sqlite:///{tmp_path}/hostile.db"
    _store(plain_url, json.dumps(LARGE), 10, "plain")
    _store(hostile_url, HOSTILE, 10, "hostile")
    return make_client(plain_url), make_client(hostile_url)


def _all_pages(client: TestClient, path: str) -> tuple[list[str], list[int]]:
    """The ids of every page of a list, and each page's size in bytes."""
    ids: list[str] = []
    sizes: list[int] = []
    params: dict[str, Any] = {"limit": 10}
    while True:
        response = client.get(path, params=params)
        assert response.status_code == 200, response.text
        sizes.append(len(response.content))
        ids += [message["id"] for message in response.json()["messages"]]
        cursor = response.json()["next_cursor"]
        if cursor is None:
            return ids, sizes
        params["cursor"] = cursor


def test_a_list_of_large_messages_is_a_bounded_page_with_its_cursor(
    stored: tuple[TestClient, TestClient],
) -> None:
    plain, _ = stored
    ids, sizes = _all_pages(plain, "/v1/queues/q/messages")
    assert ids == [f"plain-{index}" for index in range(10)]  # each once, in order
    assert len(sizes) > 2
    assert max(sizes) <= SERVE_ANSWER_BUDGET + 1024
    held = plain.post("/v1/queues/q/reserve", json={"max": 10, "lease_seconds": 60})
    for message in held.json()["messages"]:
        plain.post(
            f"/v1/queues/q/messages/{message['id']}/nack",
            json={"lease": message["lease"], "dead": True},
        )
    dead_ids, dead_sizes = _all_pages(plain, "/v1/queues/q/dead")
    assert sorted(dead_ids) == sorted(message["id"] for message in held.json()["messages"])
    assert max(dead_sizes) <= SERVE_ANSWER_BUDGET + 1024


def test_a_reserve_of_large_messages_claims_only_what_it_returns(
    stored: tuple[TestClient, TestClient],
) -> None:
    plain, _ = stored
    response = plain.post("/v1/queues/q/reserve", json={"max": 10, "lease_seconds": 60})
    assert response.status_code == 200, response.text
    assert len(response.content) <= SERVE_ANSWER_BUDGET + 1024
    held = [message["id"] for message in response.json()["messages"]]
    assert 1 <= len(held) < 10
    counts = stats(plain)
    assert (counts["active"], counts["ready"]) == (len(held), 10 - len(held))
    for index in range(len(held), 10):
        assert plain.get(f"/v1/queues/q/messages/plain-{index}").json()["attempts"] == 0
    waited = plain.post("/v1/queues/q/reserve", json={"max": 10, "wait": 1}).json()
    assert [message["id"] for message in waited["messages"]][:1] == [f"plain-{len(held)}"]


def test_hostile_stored_messages_cost_no_more_than_plain_ones(
    stored: tuple[TestClient, TestClient],
) -> None:
    plain, hostile = stored
    answers: dict[str, tuple[int, int]] = {}
    for name, client in (("plain", plain), ("hostile", hostile)):
        client.get("/v1/queues/q/messages", params={"limit": 1})  # warm up
        response, peak = _peak(
            lambda c=client: c.get("/v1/queues/q/messages", params={"limit": 10})
        )
        assert response.status_code == 200, response.text
        answers[name] = (len(response.content), peak)
        page, page_peak = _peak(lambda c=client: c.get("/queues/q"))
        assert page.status_code == 200
        answers[name + " page"] = (len(page.content), page_peak)
    print(answers)
    assert answers["hostile"][0] <= SERVE_ANSWER_BUDGET + 1024
    # Each hostile message decodes to 25 MB: the answer must not hold them (unbounded,
    # the hostile list held 12 times what the plain one did; the margin leaves room
    # for what the test client's threads allocate meanwhile on a loaded machine).
    assert answers["hostile"][1] < 4 * answers["plain"][1]
    assert answers["hostile page"][1] < 4 * answers["plain page"][1]
    listed = hostile.get("/v1/queues/q/messages", params={"limit": 10}).json()["messages"]
    assert {message["payload_error"] is not None for message in listed} == {True}
    reserved = hostile.post("/v1/queues/q/reserve", json={"max": 10}).json()["messages"]
    assert len(reserved) == 10
    assert "more than 100000 values" in reserved[0]["payload_error"]


def _health_times(base: str, count: int) -> list[float]:
    times = []
    with httpx.Client(base_url=base, timeout=60) as http:
        for _ in range(count):
            started = time.perf_counter()
            assert http.get("/healthz").status_code == 200
            times.append(time.perf_counter() - started)
            time.sleep(0.01)
    return times


def test_a_large_list_does_not_hold_up_healthz(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _store(url, HOSTILE, 10, "hostile")
    _store(url, json.dumps(LARGE), 10, "plain")
    with serving(tmp_path, url=url) as server:
        quiet = _health_times(server.base, 20)
        lists: list[float] = []

        def list_all() -> None:
            with httpx.Client(base_url=server.base, timeout=120) as http:
                for _ in range(3):
                    started = time.perf_counter()
                    response = http.get("/v1/queues/q/messages", params={"limit": 20})
                    assert response.status_code == 200
                    lists.append(time.perf_counter() - started)

        lister = threading.Thread(target=list_all)
        lister.start()
        busy = []
        while lister.is_alive():
            busy += _health_times(server.base, 1)
        lister.join()
    print(
        f"healthz quiet median {statistics.median(quiet):.4f}s, during lists max "
        f"{max(busy):.4f}s over {len(busy)}; lists {lists}"
    )
    # A /healthz during the lists may wait for a slice of one, never for a whole list:
    # when a list is decoded and encoded on the loop, each /healthz sent meanwhile
    # waits for the rest of it (a few samples, each most of a list). The median, not
    # the maximum: a loaded machine may hold up any one request. The bound is the sum
    # of a quiet /healthz's margin and half a list: a bounded list now takes a tenth of
    # a second, and a /healthz beside its encoding thread waits for the GIL a while.
    assert len(busy) >= 3
    assert statistics.median(busy) < (
        20 * statistics.median(quiet) + 0.5 * statistics.median(lists)
    )


def _fetches_for(sizes: list[int], limit: int) -> tuple[int, int, int]:
    """Page ``limit`` messages of these JSON sizes through ``fetch_page``: the fetches
    made, the messages the page holds and the most messages one fetch asked for."""
    messages = [
        Message(
            id=f"{index:04d}",
            queue="q",
            payload="x" * size,
            due_at=index,
            attempts=0,
            max_attempts=1,
            state=State.SCHEDULED,
        )
        for index, size in enumerate(sizes)
    ]
    asked: list[int] = []

    async def fetch(count: int, last: Message | None) -> list[Message]:
        asked.append(count)
        start = 0 if last is None else messages.index(last) + 1
        return messages[start : start + count]

    page = asyncio.run(fetch_page(fetch, limit, 1024 * 1024))
    return len(asked), len(page.messages), max(asked)


def test_a_page_of_small_messages_takes_a_few_fetches_and_large_ones_stay_bounded() -> None:
    """A fetch a message (or a few) would make a 1,000-message list or reserve several
    times slower; a chunk grown on small messages must still not read a budget's worth
    of large ones many times over."""
    fetches, held, _ = _fetches_for([100] * 1000, 1000)
    assert held == 1000
    assert fetches <= 6
    # Four small messages, then large ones: the page ends near its budget, and no
    # fetch asks for more than the budget holds at the smallest size counted.
    fetches, held, most = _fetches_for([100] * 4 + [512 * 1024] * 996, 1000)
    assert 4 < held <= 4 + SERVE_ANSWER_BUDGET // (512 * 1024) + 1
    assert most <= SERVE_ANSWER_BUDGET // (16 * 1024)


def test_a_page_holds_what_fits_its_budget_commas_counted_and_always_its_first() -> None:
    """The budget counts each message's JSON and the comma between two: what a page
    holds, joined, never passes it, and the next message would have; a message larger
    than the whole budget is still listed, alone (an empty page would never pass it)."""
    messages = [
        Message(
            id=f"{index:04d}",
            queue="q",
            payload="x" * 500,
            due_at=index,
            attempts=0,
            max_attempts=1,
            state=State.SCHEDULED,
        )
        for index in range(10)
    ]

    async def fetch(count: int, last: Message | None) -> list[Message]:
        start = 0 if last is None else messages.index(last) + 1
        return messages[start : start + count]

    one = len(asyncio.run(encode_messages(messages[:1], 0))[0])
    for budget in (3 * one + 1, 3 * one + 2, 5 * one + 3):
        page = asyncio.run(fetch_page(fetch, 10, one, budget))
        joined = len(b",".join(page.parts))
        assert joined <= budget < joined + 1 + one, (budget, len(page.parts))
    page = asyncio.run(fetch_page(fetch, 10, one, one // 2))
    assert [message.id for message in page.messages] == ["0000"]
