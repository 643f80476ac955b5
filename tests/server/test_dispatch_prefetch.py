"""The callback dispatcher's prefetch: messages reserved ahead of a free request slot
keep their leases while they wait, go back at once on a graceful stop, and are not
lost when ``delayq serve`` is killed with -9 while it holds them."""

from __future__ import annotations

import asyncio
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from conformance.conftest import memory_url, redis_url, sqlite_url
from delayq.durable import AsyncQueue, Queue, State
from delayq.server._callbacks import Callback
from delayq.server._config import ServeConfig
from delayq.server._constants import CALLBACK_HEADER

from .test_dispatch_e2e import QUEUE, Arrival, dispatching, serve_config, wait_until

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")


@pytest.mark.parametrize("value", [-1, 1.5, True, "4"])
def test_a_bad_dispatch_prefetch_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="dispatch_prefetch must be an int >= 0"):
        ServeConfig(url="memory://x", dispatch_prefetch=value)


async def _put_many(state: Any, callback: Callback, count: int) -> list[str]:
    """``count`` callbacks due now, in one put (so one reserve can claim them all)."""
    headers = {CALLBACK_HEADER: callback.to_header()}
    items = [{"payload": {"n": i}, "headers": headers} for i in range(count)]
    return list(await state.queue(QUEUE).put_many(items))


async def _active(queue: AsyncQueue) -> int:
    return (await queue.stats()).active


async def _wait_active(queue: AsyncQueue, count: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while await _active(queue) != count:
        assert time.monotonic() < deadline, f"never {count} reserved"
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", [memory_url, redis_url], ids=["memory", "redis"])
def test_a_graceful_stop_gives_the_prefetched_back_at_once(backend: Any, tmp_path: Path) -> None:
    """Two requests run (their receiver holds them), four messages wait reserved: a
    stop with a long grace hands the four back at once, uncharged and never sent,
    and lets the two finish."""
    release = asyncio.Event()

    async def answer(arrival: Arrival, nth: int) -> int:
        await release.wait()
        return 200

    async def scenario(url: str) -> None:
        config = serve_config(url, dispatch_concurrency=2, dispatch_prefetch=4)
        async with dispatching(config, answer, grace=60.0) as (state, dispatcher, receiver):
            ids = await _put_many(state, Callback(receiver.url()), 6)
            queue = state.queue(QUEUE)
            await wait_until(lambda: len(receiver.arrivals) == 2)
            await _wait_active(queue, 6)
            stopping = asyncio.create_task(dispatcher.stop())
            await wait_until(lambda: dispatcher.counts["released"] == 4, timeout=20.0)
            assert not stopping.done()  # the two in flight still have their grace
            sent = {arrival.id for arrival in receiver.arrivals}
            waiting = [i for i in ids if i not in sent]
            assert len(waiting) == 4
            for message_id in waiting:
                msg = await queue.get(message_id)
                assert msg is not None
                assert msg.state is State.READY
                assert msg.attempts == 0
            release.set()
            await stopping
            assert dispatcher.counts["delivered"] == 2
            assert len(receiver.arrivals) == 2  # the four were never sent
            assert (await queue.stats()).ready == 4

    url_of = backend(tmp_path)
    try:
        asyncio.run(scenario(next(url_of)))
    finally:
        url_of.close()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_prefetched_messages_keep_their_leases_while_they_wait(tmp_path: Path) -> None:
    """One request at a time, each answered after a second, nine messages reserved at
    once: the last waits longer than its lease (2 s timeout + 5 s margin). Renewed
    while they wait, none can be reserved by another consumer meanwhile, and each is
    delivered once."""

    async def answer(arrival: Arrival, nth: int) -> int:
        await asyncio.sleep(1.0)
        return 200

    async def scenario(url: str) -> None:
        config = serve_config(
            url, dispatch_concurrency=1, dispatch_prefetch=8, callback_timeout=2.0
        )
        async with dispatching(config, answer) as (state, dispatcher, receiver):
            assert dispatcher.lease == 7.0
            queue = state.queue(QUEUE)
            await _put_many(state, Callback(receiver.url()), 9)
            await _wait_active(queue, 9)  # all reserved by the dispatcher
            other = AsyncQueue(url, name=QUEUE)
            stolen = []
            try:
                while dispatcher.counts["delivered"] < 9:
                    stolen += await other.reserve(max=10, wait=0)
                    await asyncio.sleep(0.1)
            finally:
                await other.close()
            assert stolen == []
            assert sorted(receiver.per_id.values()) == [1] * 9
            assert dispatcher.counts["lease_lost"] == 0
            assert (await queue.stats()).total == 0

    url_of = memory_url(tmp_path)
    asyncio.run(scenario(next(url_of)))


# -- kill -9 of a real `delayq serve` ------------------------------------------------------


class _Hooks(http.server.BaseHTTPRequestHandler):
    """A callback target that records each request (id, time, whether it was held)
    and, while ``hold`` is set, answers only once ``go`` is set."""

    protocol_version = "HTTP/1.1"
    arrivals: ClassVar[list[tuple[str, float, bool]]] = []
    hold = threading.Event()
    go = threading.Event()
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        held = self.hold.is_set()
        with self.lock:
            self.arrivals.append((self.headers["X-Delayq-Message-Id"], time.time(), held))
        if held:
            self.go.wait(60)
        try:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except OSError:  # the server that sent it was killed meanwhile
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _start_serve(url: str, tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    """``delayq serve`` on a free port (its output to a file): the process and base URL."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DELAYQ_")}
    environ["PYTHONUNBUFFERED"] = "1"
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", "serve", "--port", "0", "--url", url,
             "--callback-queue", "hooks", "--allow-loopback-callbacks",
             "--signing-secret", "a-secret-of-this-test", "--dispatch-prefetch", "2"],
            stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=tmp_path,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if "dashboard: http://" in line:
                return process, line.split("dashboard: ", 1)[1].strip().rstrip("/")
        assert process.poll() is None, log.read_text()
        time.sleep(0.05)
    process.kill()
    raise AssertionError("delayq serve did not start:\n" + log.read_text())


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from (sqlite_url if request.param == "sqlite" else redis_url)(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_serve_killed_with_prefetched_callbacks_loses_none(store: str, tmp_path: Path) -> None:
    """70 callbacks due now, 64 requests held by the target, 2 more reserved ahead
    (``--dispatch-prefetch 2``): after a kill -9, a new ``delayq serve`` delivers every
    one, those reserved by the dead one once their leases (15 s) ran out, each once."""
    _Hooks.arrivals.clear()
    _Hooks.hold.set()
    _Hooks.go.clear()
    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    target.daemon_threads = True
    threading.Thread(target=target.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{target.server_address[1]}/hook"
    second = None
    first, base = _start_serve(store, tmp_path, "first")
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            ids = []
            posted: dict[str, float] = {}
            for i in range(70):
                sent_at = time.time()
                answer = client.post(
                    "/v1/queues/hooks/messages",
                    json={"payload": {"n": i}, "callback": {"url": hook}},
                )
                assert answer.status_code == 201, answer.text
                ids.append(answer.json()["id"])
                posted[ids[-1]] = sent_at
        with Queue(store, name="hooks") as queue:
            _wait(lambda: len(_Hooks.arrivals) == 64, 60, "64 requests never arrived")
            _wait(lambda: queue.stats().active == 66, 30, "the prefetch was not reserved")
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            killed_at = time.time()
            _Hooks.hold.clear()
            _Hooks.go.set()
            assert queue.stats().active == 66  # held by a dead process, until their leases end
            second, _ = _start_serve(store, tmp_path, "second")
            _wait(lambda: queue.stats().total == 0, 90, "not every callback was delivered")
        second.send_signal(signal.SIGTERM)
        assert second.wait(20) == 0
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)
        target.shutdown()
        target.server_close()
    before = {i: at for i, at, held in _Hooks.arrivals if held}
    after = [(i, at) for i, at, held in _Hooks.arrivals if not held]
    assert len(before) == 64
    assert sorted(i for i, _ in after) == sorted(ids)  # every one, once, after the kill
    for message_id, at in after:
        assert at > killed_at
        if message_id in before:
            # Reserved by the dead one: not before its lease ended. The lease ran from
            # the reserve, which came after the post and before the first request (on
            # a loaded machine, at times more than a second before it).
            assert at >= posted[message_id] + 15.0
