"""Queue names in Unicode NFC only (issue 33, point 9): a put under a name that is not
in NFC (``cafe`` + a combining accent, the Kelvin sign) is refused on every face with
one message that names the NFC form, so two queues that look the same cannot be made.
A read addresses a name exactly as given: a queue an older delayq made under an NFD
name stays readable and drainable under it, and is another queue than its NFC twin."""

from __future__ import annotations

import asyncio
import json
import re
import unicodedata
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from conformance._helpers import stored_request
from delayq import AsyncQueue, Queue
from delayq._names import InvalidQueueName, check_queue_name
from delayq.cli import main

from .conftest import MakeClient

CAFE_NFC = "caf\u00e9"
CAFE_NFD = unicodedata.normalize("NFD", CAFE_NFC)
# Each name that is not NFC, and the NFC name it looks like.
NOT_NFC = {
    CAFE_NFD: CAFE_NFC,
    "\u212a": "K",  # KELVIN SIGN
    "\u2126hm": "\u03a9hm",  # OHM SIGN
    "A\u030angstr\u00f6m": "\u00c5ngstr\u00f6m",  # A + COMBINING RING ABOVE
    "\u212bngstr\u00f6m": "\u00c5ngstr\u00f6m",  # ANGSTROM SIGN
    "q\u0307\u0323": "q\u0323\u0307",  # combining marks out of canonical order
}
ROUTE_TYPE = "application/vnd.delayq+json"
_CLI_ERROR = re.compile(r"^error: (.*?)(?: \(see '[^']*'\))?$")


def _expected(name: str) -> str:
    return f"queue name must be in Unicode NFC form ({NOT_NFC[name]!r}), got {name!a}"


def _python(url: str, name: str) -> str:
    with Queue(url, name=name) as queue, pytest.raises(InvalidQueueName) as raised:
        queue.put(1)
    return str(raised.value)


def _python_async(url: str, name: str) -> str:
    async def run() -> str:
        async with AsyncQueue(url, name=name) as queue:
            with pytest.raises(InvalidQueueName) as raised:
                await queue.put(1)
        return str(raised.value)

    return asyncio.run(run())


def _cli(url: str, name: str) -> str:
    result = CliRunner().invoke(main, ["put", "--url", url, "--", name, "1"])
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    found = _CLI_ERROR.match(line)
    assert found is not None, line
    return found.group(1)


def _http(client: TestClient, path: str, body: object, content_type: str) -> str:
    response = client.post(
        path, content=json.dumps(body).encode(), headers={"content-type": content_type}
    )
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_queue", error
    return str(error["message"])


@pytest.mark.parametrize("name", NOT_NFC)
def test_every_face_refuses_a_name_not_in_nfc_alike(
    name: str, make_client: MakeClient, tmp_path: Path
) -> None:
    expected = _expected(name)
    with pytest.raises(InvalidQueueName) as raised:
        check_queue_name(name)
    assert str(raised.value) == expected
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert _python(url, name) == expected
    assert _python_async(url, name) == expected
    assert _cli(url, name) == expected
    http = make_client(url)
    path = f"/v1/queues/{quote(name, safe='')}/messages"
    for content_type in ("application/json", ROUTE_TYPE):
        assert _http(http, path, {"payload": 1}, content_type) == expected
    batch = _http(http, f"{path}/batch", {"messages": [{"payload": 1}]}, "application/json")
    assert expected in batch
    with Queue(url) as root:
        assert root.queues() == []  # nothing was written, on any face
    # The name it looks like is welcome everywhere.
    assert check_queue_name(NOT_NFC[name]) == NOT_NFC[name]
    created = http.post(f"/v1/queues/{quote(NOT_NFC[name], safe='')}/messages", json={"payload": 1})
    assert created.status_code == 201, created.text


def test_message_ids_are_taken_as_given() -> None:
    """Ids come from elsewhere (a macOS file name is NFD) and are compared exactly."""
    with Queue(f"memory://nfc-{uuid.uuid4().hex}", name="q") as queue:
        assert queue.put(1, id=CAFE_NFD) == CAFE_NFD
        assert queue.put(2, id=CAFE_NFC) == CAFE_NFC
        assert len(queue.peek()) == 2


def test_a_queue_stored_under_an_nfd_name_stays_readable(
    make_client: MakeClient, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'legacy.db'}"
    with Queue(url) as root:  # as an older delayq wrote it
        root.backend.put(CAFE_NFD, [stored_request("old")])
        root.named(CAFE_NFC).put(1, id="new")
    client = make_client(url)
    listed = {row["name"] for row in client.get("/v1/queues").json()["queues"]}
    assert {CAFE_NFD, CAFE_NFC} <= listed
    nfd_path = quote(CAFE_NFD, safe="")
    [old] = client.get(f"/v1/queues/{nfd_path}/messages").json()["messages"]
    assert old["id"] == "old"
    page = client.get(f"/queues/{nfd_path}")
    assert page.status_code == 200
    assert "old" in page.text
    assert "new" not in page.text
    with Queue(url, name=CAFE_NFD) as legacy:
        assert legacy.get("old") is not None
        [message] = legacy.reserve(wait=0)
        legacy.ack(message)
        with pytest.raises(InvalidQueueName, match="NFC"):
            legacy.put(2)
    with Queue(url, name=CAFE_NFC) as current:
        assert [msg.id for msg in current.peek()] == ["new"]
