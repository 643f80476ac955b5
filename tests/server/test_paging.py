"""Lists that page (issue 16): peek and the dead list take ``cursor`` (a page's
``next_cursor``) beside ``limit``, in a stable order, on every backend, and a page
walk shows no message twice while messages come and go."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ._helpers import error_of, put

Q = "/v1/queues/q"


def walk(client: TestClient, path: str, limit: int, between: Any = None) -> list[dict[str, Any]]:
    """Every page of ``path`` (``limit`` each), calling ``between(page_number)`` after
    each page; the messages in the order given."""
    seen: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        separator = "&" if "?" in path else "?"
        query = f"{separator}limit={limit}" + ("" if cursor is None else f"&cursor={cursor}")
        response = client.get(path + query)
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["messages"]) <= limit
        seen.extend(body["messages"])
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return seen
        assert pages < 100
        if between is not None:
            between(pages)


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [message["id"] for message in messages]


@pytest.mark.parametrize("state", [None, "scheduled"])
def test_peek_pages_waiting_messages_while_others_come_and_go(
    any_client: TestClient, state: str | None
) -> None:
    # Several messages share a due time: the order among them is the put order.
    for n in range(14):
        put(any_client, id=f"m{n:02d}", delay=f"{100 + n // 3}m")
    path = f"{Q}/messages" + ("" if state is None else f"?state={state}")
    whole = ids(walk(any_client, path, 100))
    assert whole == [f"m{n:02d}" for n in range(14)]

    def churn(page: int) -> None:
        put(any_client, id=f"late{page}", delay="1d")  # after every cursor: seen
        put(any_client, id=f"early{page}", delay="1m")  # before every cursor: not seen
        if page <= 2:
            any_client.delete(f"{Q}/messages/m{14 - page:02d}")

    seen = ids(walk(any_client, path, 4, churn))
    assert len(seen) == len(set(seen))
    assert not [i for i in seen if i.startswith("early")]
    kept = [i for i in seen if i.startswith("m")]
    assert kept == sorted(kept)
    assert set(kept) == {f"m{n:02d}" for n in range(14)} - {"m13", "m12"}
    assert [i for i in seen if i.startswith("late")] == ["late1", "late2", "late3"]


def test_peek_pages_ready_and_active_messages(any_client: TestClient) -> None:
    for n in range(9):
        put(any_client, id=f"r{n}")
    assert ids(walk(any_client, f"{Q}/messages?state=ready", 2)) == [f"r{n}" for n in range(9)]
    # Claimed in three reserves of three: equal lease ends within each are in seq order.
    for _ in range(3):
        reserved = any_client.post(f"{Q}/reserve", json={"max": 3, "lease_seconds": 600})
        assert len(reserved.json()["messages"]) == 3
    active = ids(walk(any_client, f"{Q}/messages?state=active", 2))
    assert sorted(active) == [f"r{n}" for n in range(9)]
    assert len(active) == len(set(active))


def dead_ones(client: TestClient, count: int) -> list[str]:
    for n in range(count):
        put(client, id=f"d{n:02d}")
    order = []
    for _ in range(count):
        held = client.post(f"{Q}/reserve", json={"max": 1}).json()["messages"][0]
        order.append(held["id"])
        nack = client.post(
            f"{Q}/messages/{held['id']}/nack", json={"lease": held["lease"], "dead": True}
        )
        assert nack.json() == {"state": "dead"}
    return order


@pytest.mark.parametrize("path", ["/dead", "/messages?state=dead"])
def test_the_dead_list_pages_while_others_die_and_are_retried(
    any_client: TestClient, path: str
) -> None:
    order = dead_ones(any_client, 7)

    def churn(page: int) -> None:
        if page == 1:  # retried: no longer dead
            any_client.post(f"{Q}/dead/retry", json={"ids": [order[5]]})

    seen = ids(walk(any_client, Q + path, 2, churn))
    assert seen == [i for i in order if i != order[5]]


def test_a_cursor_of_another_list_or_made_up_is_refused(client: TestClient) -> None:
    for n in range(3):
        put(client, id=f"m{n}")
    first = client.get(f"{Q}/messages?limit=1").json()
    cursor = first["next_cursor"]
    assert cursor is not None
    for bad in (f"{Q}/dead?cursor={cursor}", f"{Q}/messages?state=active&cursor={cursor}",
                f"{Q}/messages?cursor=bm9wZQ", f"{Q}/messages?cursor=%25%25"):  # fmt: skip
        assert error_of(client.get(bad), 422) == "invalid_cursor", bad
    assert client.get(f"{Q}/messages?state=ready&cursor={cursor}").status_code == 200
