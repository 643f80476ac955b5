"""Lost replies on a private ``redis-server``: a script whose reply was lost is sent again
only when a second run is harmless, and a connection the server closed while idle is
replaced before it is used. On the sync face's connection per thread
(``backends/redis/_link.py``), the async face's pipelined connection per loop
(``_link_async.py``: also calls at once sharing it, a call cancelled on the wire, a late
reply failing the calls behind it, and redis-py's path where the direct exchange does
not apply), and on the faces that run on redis-py clients without
redis-py's retries (``_resend.py``): the sharded faces.

``DEBUG SLEEP`` stalls the server so that a reply misses the client's socket timeout
while the command itself, already in the server's buffer, still runs afterwards."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.durable import AsyncQueue, Queue, State

redis = pytest.importorskip("redis")

from delayq.backends.redis._scripts import queue_keys  # noqa: E402

from ._redis_server import RedisProcess  # noqa: E402

pytestmark = pytest.mark.slow

#: The client's read timeout (s), and how long the server stalls: longer.
READ_TIMEOUT = 0.3
STALL = 0.8


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    """A private server without persistence that accepts DEBUG."""
    process = RedisProcess(
        tmp_path, ("--save", "", "--appendonly", "no", "--enable-debug-command", "yes")
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _stall(server: RedisProcess, seconds: float) -> threading.Thread:
    """Block the whole server for ``seconds`` from another connection (returns once the
    stall has begun)."""

    def sleep() -> None:
        client = server.client()
        try:
            client.execute_command("DEBUG", "SLEEP", seconds)
        finally:
            client.close()

    thread = threading.Thread(target=sleep, daemon=True)
    thread.start()
    time.sleep(0.1)
    return thread


@pytest.mark.timeout(30)
def test_a_put_whose_reply_is_lost_is_not_sent_again(server: RedisProcess) -> None:
    url = f"{server.url}?socket_timeout={READ_TIMEOUT}"
    with Queue(url, name="lost") as q:
        q.put("first", id="m", on_conflict="replace")
        stall = _stall(server, STALL)
        with pytest.raises(redis.TimeoutError):
            q.put("second", id="m", on_conflict="replace")  # runs once the stall ends
        stall.join(10)
        message = q.get("m")
        assert message is not None
        assert message.payload == "second"
        # Every run of put.lua with on_conflict="replace" takes a new seq: two runs,
        # not three (a resent put would have replaced the message once more).
        client = server.client()
        try:
            assert int(client.get(queue_keys("delayq", "lost")[4]) or 0) == 2
        finally:
            client.close()


@pytest.mark.timeout(30)
def test_a_read_whose_reply_is_lost_is_sent_again(server: RedisProcess) -> None:
    url = f"{server.url}?socket_timeout={READ_TIMEOUT}"
    with Queue(url, name="read") as q:
        id = q.put("kept", delay=3600)
        stall = _stall(server, 0.5)
        message = q.get(id)  # the first try times out, a later one answers
        stall.join(10)
        assert message is not None
        assert (message.payload, message.state) == ("kept", State.SCHEDULED)


@pytest.mark.timeout(30)
def test_a_connection_closed_by_a_restart_is_replaced_before_use(server: RedisProcess) -> None:
    with Queue(server.url, name="restart") as q:
        q.put("before")  # this thread's connection is open and idle now
        server.stop()
        server.start()  # no persistence: the queue is empty, the library gone
        q.put("after")  # must not fail: nothing was sent on the dead connection
        got = q.reserve(wait=0)
        assert [m.payload for m in got] == ["after"]


@pytest.mark.timeout(30)
def test_each_thread_has_its_own_connection_and_close_ends_them(server: RedisProcess) -> None:
    client = server.client()
    with Queue(server.url, name="threads") as q:
        q.put(0)
        before = len(client.client_list())
        # The threads stay alive until counted: a finished thread's connection may be
        # closed as soon as its thread-local state is collected.
        counted, done = threading.Event(), threading.Barrier(5)

        def put_some() -> None:
            for i in range(20):
                q.put(i)
            done.wait(10)
            counted.wait(10)

        threads = [threading.Thread(target=put_some) for _ in range(4)]
        for thread in threads:
            thread.start()
        done.wait(10)
        assert len(client.client_list()) == before + 4
        counted.set()
        for thread in threads:
            thread.join(10)
        assert q.stats().ready == 81
    deadline = time.monotonic() + 5
    while len(client.client_list()) > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(client.client_list()) == 1  # only this one: the queue closed its own
    client.close()


def _seq(server: RedisProcess, queue: str) -> int:
    """How many seqs ``put.lua`` took for ``queue`` (one per run with "replace")."""
    client = server.client()
    try:
        return int(client.get(queue_keys("delayq", queue)[4]) or 0)
    finally:
        client.close()


@pytest.mark.timeout(30)
def test_an_async_put_whose_reply_is_lost_is_not_sent_again(server: RedisProcess) -> None:
    url = f"{server.url}?socket_timeout={READ_TIMEOUT}"

    async def main() -> None:
        async with AsyncQueue(url, name="lost-async") as q:
            await q.put("first", id="m", on_conflict="replace")
            stall = _stall(server, STALL)
            with pytest.raises(redis.TimeoutError):
                await q.put("second", id="m", on_conflict="replace")
            stall.join(10)
            message = await q.get("m")
            assert message is not None
            assert message.payload == "second"

    asyncio.run(main())
    assert _seq(server, "lost-async") == 2  # two runs: the lost one was not sent again


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.timeout(30)
def test_an_async_ack_whose_reply_is_lost_is_not_sent_again(
    server: RedisProcess, shards: int
) -> None:
    """Sent again, the ack would find its own work done and raise LeaseLost."""
    url = f"{server.url}?socket_timeout={READ_TIMEOUT}&shards={shards}"

    async def main() -> None:
        async with AsyncQueue(url, name="ack-async") as q:
            await q.put("job")
            [message] = await q.reserve(wait=0)
            stall = _stall(server, STALL)
            with pytest.raises(redis.TimeoutError):
                await q.ack(message)
            stall.join(10)
            assert (await q.stats()).active == 0
            assert await q.get(message.id) is None

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_an_async_read_whose_reply_is_lost_is_sent_again(server: RedisProcess) -> None:
    url = f"{server.url}?socket_timeout={READ_TIMEOUT}"

    async def main() -> None:
        async with AsyncQueue(url, name="read-async") as q:
            id = await q.put("kept", delay=3600)
            stall = _stall(server, 0.5)
            message = await q.get(id)  # the first try times out, a later one answers
            stall.join(10)
            assert message is not None
            assert message.payload == "kept"

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_an_async_connection_closed_by_a_restart_is_replaced_before_use(
    server: RedisProcess,
) -> None:
    async def main() -> None:
        async with AsyncQueue(server.url, name="restart-async") as q:
            await q.put("before")
            server.stop()
            server.start()
            await q.put("after")  # nothing was sent on the dead connection
            assert [m.payload for m in await q.reserve(wait=0)] == ["after"]

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_sharded_ack_whose_reply_is_lost_is_not_sent_again(server: RedisProcess) -> None:
    url = f"{server.url}?socket_timeout={READ_TIMEOUT}&shards=2"
    with Queue(url, name="ack-sharded") as q:
        q.put("job")
        [message] = q.reserve(wait=0)
        stall = _stall(server, STALL)
        with pytest.raises(redis.TimeoutError):
            q.ack(message)
        stall.join(10)
        assert q.stats().active == 0
        assert q.get(message.id) is None


# -- the direct exchange and its redis-py fallback ----------------------------------------

#: A script that counts its runs, then answers the error reply it is given.
_FAIL = b"redis.call('INCR', KEYS[1]) return redis.error_reply(ARGV[1])"


def _queue(server: RedisProcess, name: str, protocol: int, direct: bool) -> Queue:
    """A queue whose thread connection is open, its commands packed by hiredis or, with
    ``direct=False``, by redis-py (as without hiredis)."""
    q = Queue(f"{server.url}?protocol={protocol}", name=name)
    link = q.backend._link  # type: ignore[attr-defined]
    if not direct:
        link._hiredis = None
    q.put("first")
    assert link._local.wire is not None
    return q


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "redis-py"])
@pytest.mark.timeout(30)
def test_error_replies_are_raised_and_retried_as_redis_py_raises_them(
    server: RedisProcess, protocol: int, direct: bool
) -> None:
    counter = f"errors-{protocol}-{direct}:runs".encode()
    client = server.client()

    def fail(reply: str, safe: bool = False) -> None:
        link._exchange((b"EVAL", _FAIL, 1, counter, reply), safe)

    def runs() -> int:
        return int(client.get(counter) or 0)

    with _queue(server, f"errors-{protocol}-{direct}", protocol, direct) as q:
        link = q.backend._link  # type: ignore[attr-defined]
        with pytest.raises(redis.ResponseError) as info:
            fail("ERR plain")
        assert (type(info.value), str(info.value), runs()) == (redis.ResponseError, "plain", 1)
        with pytest.raises(redis.exceptions.NoScriptError):
            fail("NOSCRIPT gone")
        assert runs() == 2
        before = link._exchange((b"CLIENT", b"ID"), True)
        assert link._exchange((b"CLIENT", b"ID"), True) == before  # an error reply keeps it
        # LOADING: the server ran nothing (as it says), so even a put is sent again.
        with pytest.raises(redis.BusyLoadingError):
            fail("LOADING still loading")
        assert runs() == 2 + 1 + 3  # REDIS_RETRIES
        # A connection error the server answers: the connection is replaced, and only
        # a call that may run twice is sent again.
        with pytest.raises(redis.ConnectionError):
            fail("ERR max number of clients reached")
        assert runs() == 7
        assert link._exchange((b"CLIENT", b"ID"), True) != before
        with pytest.raises(redis.ConnectionError):
            fail("ERR max number of clients reached", safe=True)
        assert runs() == 7 + 4
        q.put("after")
        assert [m.payload for m in q.reserve(max=10, wait=0)] == ["first", "after"]
    client.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "redis-py"])
@pytest.mark.timeout(30)
def test_a_push_before_a_reply_is_not_taken_for_it(server: RedisProcess, direct: bool) -> None:
    """RESP3: an invalidation (client tracking) the server pushes while a call waits."""
    name = f"push-{direct}"
    key, wake = f"{name}:tracked".encode(), f"{name}:list".encode()
    client = server.client()
    with _queue(server, name, 3, direct) as q:
        link = q.backend._link  # type: ignore[attr-defined]
        replies: list[object] = []
        pushes: list[object] = []
        tracking = threading.Event()

        def wait() -> None:  # on this thread's own connection
            assert link._exchange((b"CLIENT", b"TRACKING", b"ON"), True) == b"OK"
            link._exchange((b"GET", key), True)  # tracked from now on
            if direct:  # redis-py's parser hands pushes to its handler
                parser = link._local.wire.connection._parser
                parser.set_invalidation_push_handler(pushes.append)
            tracking.set()
            replies.append(link._exchange((b"BLPOP", wake, 5), True))

        waiter = threading.Thread(target=wait)
        waiter.start()
        assert tracking.wait(10)
        time.sleep(0.3)  # BLPOP waits on the server
        client.set(key, "changed")  # the push goes out first...
        client.rpush(wake, "woken")  # ...then BLPOP's reply
        waiter.join(10)
        assert replies == [[wake, b"woken"]]
        if direct:
            assert pushes == [[b"invalidate", [key]]]
        q.put("after")
        assert q.stats().ready == 2
    client.close()


# -- the async face's own connections (_link_async.py) ----------------------------------


def _async_link(q: AsyncQueue) -> Any:
    return q.backend._link  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_async_error_replies_are_raised_and_retried_as_redis_py_raises_them(
    server: RedisProcess,
) -> None:
    counter = b"errors-async:runs"
    client = server.client()

    def runs() -> int:
        return int(client.get(counter) or 0)

    async def main() -> None:
        async with AsyncQueue(server.url, name="errors-async") as q:
            await q.put("first")
            link = _async_link(q)
            assert link._direct

            async def fail(reply: str, safe: bool = False) -> None:
                await link._exchange((b"EVAL", _FAIL, 1, counter, reply), safe)

            with pytest.raises(redis.ResponseError) as info:
                await fail("ERR plain")
            assert (type(info.value), str(info.value), runs()) == (
                redis.ResponseError,
                "plain",
                1,
            )
            with pytest.raises(redis.exceptions.NoScriptError):
                await fail("NOSCRIPT gone")
            assert runs() == 2
            before = await link._exchange((b"CLIENT", b"ID"), True)
            assert await link._exchange((b"CLIENT", b"ID"), True) == before  # kept
            # LOADING: the server ran nothing (as it says), so even a put is sent again.
            with pytest.raises(redis.BusyLoadingError):
                await fail("LOADING still loading")
            assert runs() == 2 + 1 + 3  # REDIS_RETRIES
            # A connection error the server answers: the connection is replaced, and
            # only a call that may run twice is sent again.
            with pytest.raises(redis.ConnectionError):
                await fail("ERR max number of clients reached")
            assert runs() == 7
            assert await link._exchange((b"CLIENT", b"ID"), True) != before
            with pytest.raises(redis.ConnectionError):
                await fail("ERR max number of clients reached", safe=True)
            assert runs() == 7 + 4
            await q.put("after")
            assert [m.payload for m in await q.reserve(max=10, wait=0)] == ["first", "after"]

    asyncio.run(main())
    client.close()


@pytest.mark.timeout(30)
def test_an_async_call_cancelled_on_the_wire_never_hands_its_reply_to_the_next(
    server: RedisProcess,
) -> None:
    async def main() -> None:
        async with AsyncQueue(server.url, name="cancelled") as q:
            kept = await q.put("kept", delay=3600)
            link = _async_link(q)
            before = await link._exchange((b"CLIENT", b"ID"), True)
            stall = _stall(server, 0.5)
            put = asyncio.ensure_future(q.put("maybe", id="maybe"))
            await asyncio.sleep(0.1)  # written, its reply held back by the stall
            put.cancel()
            with pytest.raises(asyncio.CancelledError):
                await put
            # Written behind the cancelled put on the same connection: each call
            # gets its own reply, the cancelled put's is read and dropped.
            message = await q.get(kept)
            await asyncio.to_thread(stall.join, 10)
            assert message is not None
            assert message.payload == "kept"
            assert (await q.stats()).scheduled == 1
            assert await link._exchange((b"CLIENT", b"ID"), True) == before  # in step

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_async_calls_at_once_share_one_connection_closed_with_the_queue(
    server: RedisProcess,
) -> None:
    client = server.client()

    def connections() -> int:
        return len(client.client_list()) - 1  # not this one

    async def main() -> None:
        async with AsyncQueue(server.url, name="pipelined") as q:
            link = _async_link(q)
            first = await link._exchange((b"CLIENT", b"ID"), True)
            # Calls in flight together go out on one connection and each gets its
            # own reply: the seq each put took follows the order they were made.
            stall = _stall(server, 0.3)
            ids = await asyncio.gather(*(q.put(i, id=f"m{i}") for i in range(50)))
            await asyncio.to_thread(stall.join, 10)
            got = await q.reserve(max=50, wait=0)
            assert [m.id for m in got] == ids
            assert [m.payload for m in got] == list(range(50))
            assert connections() == 1
            assert await link._exchange((b"CLIENT", b"ID"), True) == first
            # The queue closes once the calls on the wire have their replies.
            stall = _stall(server, 0.3)
            late = asyncio.ensure_future(q.put("late"))
            await asyncio.sleep(0.05)
        assert await late
        await asyncio.to_thread(stall.join, 10)
        assert connections() == 0

    asyncio.run(main())
    client.close()


@pytest.mark.timeout(30)
def test_an_async_reply_later_than_the_timeout_fails_the_calls_waiting_with_it(
    server: RedisProcess,
) -> None:
    url = f"{server.url}?socket_timeout={READ_TIMEOUT}"

    async def main() -> None:
        async with AsyncQueue(url, name="late-async") as q:
            await q.put("first", id="same", on_conflict="replace")
            link = _async_link(q)
            before = await link._exchange((b"CLIENT", b"ID"), True)
            stall = _stall(server, STALL)
            results = await asyncio.gather(
                *(q.put(i, id="same", on_conflict="replace") for i in range(3)),
                return_exceptions=True,
            )
            await asyncio.to_thread(stall.join, 10)
            # Each may have run: none is sent again (a timeout, or the connection it
            # failed for the others), and the next call has a connection of its own.
            assert all(isinstance(r, redis.ConnectionError | redis.TimeoutError) for r in results)
            assert await link._exchange((b"CLIENT", b"ID"), True) != before
            message = await q.get("same")
            assert message is not None
            assert message.payload in (0, 1, 2)

    asyncio.run(main())
    assert _seq(server, "late-async") == 1 + 3  # the first put, then three runs, none resent


@pytest.mark.timeout(30)
def test_async_bytes_no_call_asked_for_replace_the_connection(server: RedisProcess) -> None:
    """A message the server sends unasked (here to a subscriber) puts the connection out
    of step: it is given up, and the next call opens another and gets its own reply."""
    client = server.client()

    async def main() -> None:
        async with AsyncQueue(server.url, name="stray") as q:
            kept = await q.put("kept", delay=3600)
            link = _async_link(q)
            before = await link._exchange((b"CLIENT", b"ID"), True)
            await link._exchange((b"SUBSCRIBE", b"stray-channel"), True)
            assert client.publish("stray-channel", "unasked") == 1
            for _ in range(100):  # the reader sees it at once; give it the loop
                if link._wire is None or link._wire.failure is not None:
                    break
                await asyncio.sleep(0.01)
            message = await q.get(kept)
            assert message is not None
            assert message.payload == "kept"
            assert await link._exchange((b"CLIENT", b"ID"), True) != before

    asyncio.run(main())
    client.close()


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.timeout(30)
def test_async_resp3_goes_through_redis_py_and_both_paths_work(
    server: RedisProcess, protocol: int
) -> None:
    async def main() -> None:
        async with AsyncQueue(f"{server.url}?protocol={protocol}", name=f"p{protocol}") as q:
            await q.put("a")
            await q.put_many([{"payload": "b"}, {"payload": "c", "delay": 3600}])
            assert _async_link(q)._direct is (protocol == 2)
            got = await q.reserve(max=10, wait=0)
            assert [m.payload for m in got] == ["a", "b"]
            assert await q.ack_many(got) == []
            assert (await q.stats()).scheduled == 1

    asyncio.run(main())


@pytest.mark.timeout(30)
def test_a_queue_used_from_one_event_loop_after_another(server: RedisProcess) -> None:
    """A connection belongs to the loop that opened it: the next loop opens its own."""
    q = AsyncQueue(server.url, name="loops")

    async def put(payload: str) -> int:
        await q.put(payload)
        return (await q.stats()).ready

    assert asyncio.run(put("one")) == 1
    assert asyncio.run(put("two")) == 2

    async def close() -> None:
        await q.close()

    asyncio.run(close())
