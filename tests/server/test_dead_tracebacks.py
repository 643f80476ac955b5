"""A dead letter's traceback on every face: a real Worker runs a handler that raises;
``delayq dead`` / ``get``, the API and the dashboard show the handler's frames (the
worker's own frames before them left out) and a short form in lists; the whole stored
text stays in ``last_error`` (``--full``, ``--json``, the API, the page's details)."""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path

from cli._helpers import Cli
from delayq.durable.queue import AsyncQueue
from delayq.durable.retry import RetryPolicy
from delayq.durable.traceback import short_error, user_traceback
from delayq.runtime import Worker

from .conftest import MakeClient

HERE = Path(__file__).name
# A frame of delayq's own worker, as the stored traceback names it.
OWN_FRAME = re.compile(r'File "[^"]*delayq/runtime/_(pool|worker)\.py"')


def _charge(order: object) -> None:
    raise ValueError(f"card declined for {order}")


def _handler(msg: object) -> None:
    _charge(getattr(msg, "payload", None))


def _dead_letter(url: str) -> str:
    """Run a Worker until the message it fails is dead; its stored last_error."""

    async def main() -> str:
        queue = AsyncQueue(url, name="jobs", retry=RetryPolicy(max_attempts=1))
        await queue.put({"order": 7}, id="m1")
        worker = Worker(queue, _handler)
        task = asyncio.create_task(worker.serve())
        async with asyncio.timeout(20):
            while worker.counts["dead"] < 1:
                await asyncio.sleep(0.01)
        worker.stop()
        await asyncio.wait_for(task, 10)
        msg = await queue.get("m1")
        await queue.close()
        assert msg is not None
        assert msg.last_error is not None
        return msg.last_error

    return asyncio.run(main())


def _first_frame(text: str) -> str:
    after = text.split("Traceback (most recent call last):\n", 1)[1]
    return after.split("\n", 1)[0]


def test_every_face_shows_the_handlers_frames(tmp_path: Path, make_client: MakeClient) -> None:
    url = f"sqlite:///{tmp_path / 'dead.db'}"
    full = _dead_letter(url)
    # Stored whole: the worker's frames, then the handler's.
    assert OWN_FRAME.search(full), full
    assert full.startswith("ValueError: card declined for {'order': 7}\n\n")
    shown = user_traceback(full)
    assert HERE in _first_frame(shown), shown
    assert not OWN_FRAME.search(shown), shown
    assert "in _handler" in shown
    assert shown.endswith("ValueError: card declined for {'order': 7}")
    short = short_error(full)
    line = _charge.__code__.co_firstlineno + 1
    assert short == f"ValueError: card declined for {{'order': 7}}\n  at {HERE}:{line} in _charge"

    cli = Cli(url)
    listed = cli("dead", "jobs")
    assert listed.exit_code == 0, listed.output
    assert f"at {HERE}:{line} in _charge" in listed.stdout
    assert "Traceback" not in listed.stdout
    tracebacks = cli("dead", "jobs", "--traceback")
    assert tracebacks.exit_code == 0, tracebacks.output
    assert shown in tracebacks.stdout
    assert not OWN_FRAME.search(tracebacks.stdout)
    whole = cli("dead", "jobs", "--full")
    assert full in whole.stdout
    assert json.loads(cli("dead", "jobs", "--json").stdout)[0]["last_error"] == full
    got = cli("get", "jobs", "m1")
    assert "in _charge" in got.stdout
    assert not OWN_FRAME.search(got.stdout), got.stdout

    client = make_client(url)
    body = client.get("/v1/queues/jobs/messages/m1").json()
    assert (body["last_error"], body["error_summary"]) == (full, short)
    page = html.unescape(client.get("/queues/jobs/messages/m1").text)
    shown_html = re.search(r'<pre class="error-text" id="last-error">(.*?)</pre>', page, re.S)
    assert shown_html is not None
    assert HERE in _first_frame(shown_html[1])
    assert not OWN_FRAME.search(shown_html[1])
    assert 'id="last-error-full"' in page
    assert OWN_FRAME.search(page)  # in the details: the whole text
    queue_page = html.unescape(client.get("/queues/jobs").text)
    assert f"at {HERE}:{line} in _charge" in queue_page


def test_an_error_without_a_traceback_is_shown_as_stored() -> None:
    for text in ("gave up", "HandlerTimeout: timed out after 1s", ""):
        assert user_traceback(text) == text
        assert short_error(text) == text.split("\n")[0]
