"""What is specific to ``redis://`` (the shared contract is in tests/conformance).

The Lua scripts (headers, every key through KEYS, also in the functions library), the key
layout (one hash tag per queue shard), EVALSHA (the cluster's way) after SCRIPT FLUSH,
FCALL after FUNCTION FLUSH and FLUSHALL, the server's clock against a skewed client clock,
an idle consumer's command rate, and a consumer that outlives a Redis restart.
Tests that flush scripts, count commands or restart the server run on a private
``redis-server`` started on a free port in a temporary directory (and stopped after);
the others use the shared test Redis under a private key prefix, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import pytest

from _ports import free_port
from backends._given_back import given_back_by_the_close
from delayq import UnsupportedURL
from delayq.durable import AsyncQueue, Queue, State

redis = pytest.importorskip("redis")

from redis.crc import key_slot  # noqa: E402

from delayq.backends.redis._functions import Functions  # noqa: E402
from delayq.backends.redis._ops import Operations  # noqa: E402
from delayq.backends.redis._scripts import (  # noqa: E402
    DRAINING_SCRIPTS,
    READ_ONLY_SCRIPTS,
    SCRIPT_NAMES,
    function_name,
    library_source,
    pack_id,
    queue_keys,
    unpack_id,
)
from delayq.backends.redis._url import parse_url  # noqa: E402
from delayq.durable.facade import build_request  # noqa: E402
from delayq.durable.message import PutRequest  # noqa: E402
from delayq.durable.serializer import Codec  # noqa: E402

from ._redis_server import WaitingConsumer  # noqa: E402

SHARED = os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
SCRIPTS = resources.files("delayq.backends.redis").joinpath("scripts")
#: Generous bound for "promptly" in real time (benchmarks measure how fast).
PROMPTLY = 5.0


def unavailable(reason: str) -> NoReturn:
    """Skip (the server is not reachable), or fail when ``$DELAYQ_REQUIRE`` lists redis."""
    required = {name.strip() for name in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
    if "redis" in required or "all" in required:
        pytest.fail(f"redis is required by DELAYQ_REQUIRE but unavailable: {reason}")
    pytest.skip(f"redis unavailable: {reason}")


def _lua(name: str) -> str:
    return SCRIPTS.joinpath(f"{name}.lua").read_text("utf-8")


# -- servers ----------------------------------------------------------------------------


@pytest.fixture
def shared_url() -> Iterator[str]:
    """A private key prefix on the shared test Redis; its keys are deleted afterwards."""
    client = redis.Redis.from_url(SHARED, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        unavailable(f"{SHARED}: {exc}")
    prefix = f"delayq-test-{uuid.uuid4().hex[:12]}"
    try:
        yield f"{SHARED}?prefix={prefix}"
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


class PrivateRedis:
    """A ``redis-server`` of this test alone: no persistence, in a temporary directory."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("no redis-server binary on PATH")
        self.binary = str(binary)
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *(self.binary, "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.directory)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A running private server, stopped afterwards."""
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- the scripts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SCRIPT_NAMES, "lib"])
def test_every_script_has_a_header_naming_its_keys_and_argv(name: str) -> None:
    text = _lua(name)
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    assert header, f"{name}.lua has no header comment"
    assert header[0].startswith(f"-- {name}.lua: ")
    joined = "\n".join(header)
    assert "KEYS" in joined
    assert "ARGV" in joined


_ALIASES = ("K_MSG", "K_DUE", "K_LEASE", "K_DEAD", "K_SEQ", "K_WAKE")
#: Commands that take no key (the only ones the scripts call besides key commands).
_KEYLESS = {"TIME"}


def _code(text: str) -> str:
    """The Lua without its comments."""
    return re.sub(r"--[^\n]*", "", text)


def _calls(text: str) -> list[tuple[str, str]]:
    """(command, first argument) of every ``redis.call(...)``."""
    return re.findall(r"redis\.call\(\s*('[A-Z]+'|\w+)\s*(?:,\s*([^,)]+))?", text)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_key_a_script_touches_comes_in_through_keys(name: str) -> None:
    lib, body = _code(_lua("lib")), _code(_lua(name))
    # The aliases are bound once, from KEYS, and never rebound or built from ARGV.
    binding = re.findall(r"^local (K_\w+(?:, K_\w+)*) = (KEYS\[\d\](?:, KEYS\[\d\])*)$", lib, re.M)
    assert binding == [(", ".join(_ALIASES), ", ".join(f"KEYS[{i}]" for i in range(1, 7)))]
    for text in (lib, body):
        assert not re.search(r"\bK_\w+\s*=", text.replace(binding[0][0] + " =", ""))
        assert not re.search(r"\.\.\s*K_|K_\w+\s*\.\.", text), "a key name is built"
    assert "KEYS" not in body, "scripts use the aliases of lib.lua"
    for command, first in _calls(lib + body):
        if command.strip("'") in _KEYLESS:
            continue
        key = first.strip()
        # remove_all(key, cmd, ...) takes an alias from its callers, checked below.
        assert key in _ALIASES or (command == "cmd" and key == "key"), (command, key)
    for key in re.findall(r"remove_all\(\s*(\w+)", lib + body):
        assert key in (*_ALIASES, "key")


def test_the_library_binds_the_key_aliases_from_keys_in_every_function() -> None:
    name, code = library_source()
    assert code.startswith(f"#!lua name={name}\n")
    assert re.fullmatch(r"delayq_[0-9a-f]{16}", name)
    text = _code(code)
    aliases = ", ".join(_ALIASES)
    binding = f"{aliases} = " + ", ".join(f"KEYS[{i}]" for i in range(1, 7))
    # Declared once (not bound) at load time, when there are no KEYS ...
    assert re.findall(r"^local (K_\w+(?:, K_\w+)*)$", text, re.M) == [aliases]
    # ... and bound from KEYS first thing in every function, and nowhere else.
    registered = re.findall(
        r"redis\.register_function(?:\(|\{function_name=)'(\w+)',"
        r" (?:callback=)?function\(KEYS, ARGV\)\n(.*)",
        text,
    )
    assert registered == [(function_name(script), binding) for script in SCRIPT_NAMES]
    # The read-only ones carry the no-writes flag, the draining ones allow-oom; no other.
    flagged = re.findall(
        r"function_name='delayq_[0-9a-f]{16}_(\w+)', callback=function\(KEYS, ARGV\)\n"
        r".*?\nend, flags=\{'([\w-]+)'\}\}",
        text,
        re.S,
    )
    assert sorted(name for name, flag in flagged if flag == "no-writes") == sorted(
        READ_ONLY_SCRIPTS
    )
    assert sorted(name for name, flag in flagged if flag == "allow-oom") == sorted(DRAINING_SCRIPTS)
    assert len(flagged) == len(READ_ONLY_SCRIPTS) + len(DRAINING_SCRIPTS)
    assert len(re.findall(r"\bK_\w+\s*=", text)) == len(SCRIPT_NAMES)
    assert len(re.findall(r"\bKEYS\b", text)) == len(SCRIPT_NAMES) * 7


def test_functions_carry_no_writes_or_allow_oom_as_they_should(shared_url: str) -> None:
    with Queue(shared_url, name="ro") as q:
        q.put("x")
        assert [m.payload for m in q.peek()] == ["x"]
        library = library_source()[0]
        [entry] = q.backend.client.function_list(library=library)  # type: ignore[attr-defined]
    fields = dict(zip(entry[::2], entry[1::2], strict=True))
    flags = {}
    for function in fields[b"functions"]:
        info = dict(zip(function[::2], function[1::2], strict=True))
        flags[info[b"name"].decode()] = [flag.decode() for flag in info[b"flags"]]
    for script in SCRIPT_NAMES:
        expected = (
            ["no-writes"]
            if script in READ_ONLY_SCRIPTS
            else ["allow-oom"]
            if script in DRAINING_SCRIPTS
            else []
        )
        assert flags[function_name(script)] == expected


def test_keys_of_a_queue_share_one_hash_tag_and_the_shard_is_always_named() -> None:
    keys = queue_keys("delayq", "orders")
    assert [k.decode() for k in keys] == [
        f"delayq:{{orders:0}}:{suffix}" for suffix in ("msg", "due", "lease", "dead", "seq", "wake")
    ]
    assert queue_keys("delayq", "a:1")[0] != queue_keys("delayq", "a", 1)[0]
    assert len({key_slot(k) for k in queue_keys("p", "weird}name")}) == 1
    assert len({key_slot(k) for k in queue_keys("p", "orders", 3)}) == 1


def test_generated_ids_are_stored_in_16_bytes_and_others_as_utf8() -> None:
    hex_id = uuid.uuid4().hex
    assert len(pack_id(hex_id)) == 17
    for id in (hex_id, "order-1", "Ünïcode", hex_id.upper(), hex_id[:31], "\x01" * 17):
        assert unpack_id(pack_id(id)) == id


def test_url_options() -> None:
    assert parse_url("redis://h:1/2?prefix=app&socket_timeout=3").prefix == "app"
    assert "socket_timeout=3" in parse_url("redis://h:1/2?prefix=app&socket_timeout=3").url
    assert parse_url("rediss://h/0", prefix="x").prefix == "x"
    with pytest.raises(TypeError, match="unknown"):
        parse_url("redis://h/0", nope=1)
    with pytest.raises(ValueError, match="braces"):
        parse_url("redis://h/0", prefix="a{b}")
    with pytest.raises(UnsupportedURL):
        parse_url("redis://h/notadb")


# -- behaviour on the shared server -------------------------------------------------------


def test_every_key_lives_under_the_prefix_and_the_queue_tag(shared_url: str) -> None:
    prefix = shared_url.split("prefix=")[1]
    with Queue(shared_url, name="tagged") as q:
        q.put("a", id="a")
        q.put("b", id="b", max_attempts=1)
        [msg] = q.reserve(wait=0)
        q.nack(msg, error="boom")
        q.reserve(wait=0)
        client = redis.Redis.from_url(SHARED)
        keys = sorted(k.decode() for k in client.scan_iter(match=f"{prefix}:*"))
        assert keys
        assert all(k.startswith(f"{prefix}:{{tagged:0}}:") for k in keys)
        q.purge()
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
        client.close()


def test_a_marker_handed_back_after_a_purge_leaves_no_key(shared_url: str) -> None:
    """A listener that took the wake-up marker with nobody to wake puts it back; when a
    purge came in between, the empty queue must keep no key (``delayq demo`` left one)."""
    prefix = shared_url.split("prefix=")[1]
    client = redis.Redis.from_url(SHARED)
    run, ops = Functions(client), Operations(prefix)
    with Queue(shared_url, name="handed") as q:
        q.put("a", id="a")
        assert client.exists(ops.wake_key("handed"))
        client.delete(ops.wake_key("handed"))  # a listener took the marker...
        q.purge()  # ...the queue is purged...
        run(*_script_call(ops.wake("handed")))  # ...and the listener hands it back
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
        q.put("b", id="b", delay=3600)
        client.delete(ops.wake_key("handed"))
        run(*_script_call(ops.wake("handed")))  # a queue that holds something: put back
        assert client.exists(ops.wake_key("handed"))
        q.purge()
    client.close()


def _script_call(call: Any) -> tuple[str, list[bytes], list[Any]]:
    return call.script, call.keys, call.args


@pytest.mark.parametrize("start", [0, 65_500, 2**24 - 100, 2**32 - 100, 2**40 - 100])
def test_fifo_is_exact_across_seq_byte_boundaries(shared_url: str, start: int) -> None:
    """Messages due at one time come out in put order: their zset members begin with
    the seq in 8 big-endian bytes. The queue's counter is set to just below a byte
    boundary (256, 65536, 2**24, 2**32, 2**40), so the 300 puts cross one or two."""
    prefix = shared_url.split("prefix=")[1]
    client = redis.Redis.from_url(SHARED)
    client.set(Operations(prefix).seq_key("fifo"), start)
    with Queue(shared_url, name="fifo") as q:
        at = time.time() + 0.05
        many = [{"payload": i, "at": at, "id": f"z{999 - i:04d}"} for i in range(290)]
        ids = q.put_many(many) + [q.put(i, at=at, id=f"a{99 - i:02d}") for i in range(10)]
        got: list[str] = []
        while len(got) < 300:
            batch = q.reserve(wait=PROMPTLY, max=300)
            assert batch
            got += [m.id for m in batch]
        assert got == ids
        assert int(client.get(Operations(prefix).seq_key("fifo")) or 0) == start + 300
    client.close()


def test_a_delay_counts_from_the_ceiling_of_the_servers_now(shared_url: str) -> None:
    """Never early below the millisecond: a delay starts from the server's TIME rounded
    *up* to the millisecond. Each put's due time is checked against the ceiling of a
    TIME read just before it (in microseconds): a put in the same millisecond as that
    read with a due time from the floor would be up to 1 ms early. Most of the 200
    puts land in the millisecond of their TIME read (a round trip is ~0.1 ms)."""
    client = redis.Redis.from_url(SHARED)
    early = []
    with Queue(shared_url, name="ceiling") as q:
        q.stats()  # connected
        for i in range(200):
            delay_ms = 5 + i % 20
            seconds, micros = client.time()
            ceiling_ms = -(-(seconds * 1_000_000 + micros) // 1000)
            due = q.get(q.put(i, delay=delay_ms / 1000)).due_at
            if due < ceiling_ms + delay_ms:
                early.append((seconds, micros, delay_ms, due))
        q.purge()
    client.close()
    assert early == []


def test_due_counts_count_from_the_now_they_are_given(shared_url: str) -> None:
    """``due_counts.lua`` counts from a now it is given (a sharded queue gives every
    shard the first shard's, so a message due at the horizon is counted alike on all)
    and from the server's TIME without one."""
    prefix = shared_url.split("prefix=")[1]
    client = redis.Redis.from_url(SHARED)
    run, ops = Functions(client), Operations(prefix)
    with Queue(shared_url, name="counts") as q:
        base = (int(time.time()) + 3600) * 1000
        for offset in (0, 1, 999, 1000, 2999, 3000, 3001):
            q.put(offset, at=(base + offset) / 1000)
        call = ops.due_counts("counts", 3000, 3, base)
        assert call.decode(run(*_script_call(call))) == (base, [2, 1, 1])
        call = ops.due_counts("counts", 3000, 3, base + 1)
        assert call.decode(run(*_script_call(call))) == (base + 1, [2, 0, 2])
        call = ops.due_counts("counts", 3000, 3)
        start, counts = call.decode(run(*_script_call(call)))
        assert base - 3_700_000 < start < base
        assert counts == [0, 0, 0]
        q.purge()
    client.close()


@pytest.mark.parametrize("skew", [3600.0, -3600.0], ids=["client-ahead", "client-behind"])
def test_client_clock_skew_fires_neither_early_nor_late(
    shared_url: str, skew: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(SHARED)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    with Queue(shared_url, name="skew") as q:
        seconds, micros = client.time()
        server_ms = seconds * 1000 + micros // 1000
        msg_id = q.put("x", delay=0.3)
        due = q.get(msg_id).due_at
        assert server_ms + 300 <= due <= server_ms + 300 + 1000
        started = time.monotonic()
        [msg] = q.reserve(wait=PROMPTLY)
        elapsed = time.monotonic() - started
        seconds, micros = client.time()
        assert seconds * 1000 + micros // 1000 >= msg.due_at
        assert 0.2 <= elapsed < 1.5
        q.ack(msg)
    client.close()


def test_async_face_reserves_and_wakes(shared_url: str) -> None:
    async def main() -> float:
        async with AsyncQueue(shared_url, name="async") as q:
            waiter = asyncio.create_task(q.reserve(wait=PROMPTLY))
            await asyncio.sleep(0.1)
            started = time.monotonic()
            await q.put("x")
            [msg] = await waiter
            await q.ack(msg)
            return time.monotonic() - started

    assert asyncio.run(main()) < 1.0


def test_a_put_from_another_client_wakes_a_waiting_consumer(shared_url: str) -> None:
    with Queue(shared_url, name="cross") as consumer, Queue(shared_url, name="cross") as producer:
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.extend(consumer.reserve(wait=PROMPTLY)))
        thread.start()
        time.sleep(0.2)
        started = time.monotonic()
        producer.put("x")
        thread.join(PROMPTLY)
        assert [m.payload for m in got] == ["x"]
        assert time.monotonic() - started < 1.0


def _put_in_child(queue: Queue, out: Any) -> None:
    """In a forked child: put through the inherited queue, send the ids back."""
    out.send([queue.put(n) for n in range(50)])


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_puts_on_its_own_connection_with_ids_of_its_own(shared_url: str) -> None:
    """The parent's connection and its pool of random id bytes exist at fork time: the
    child must open its own connection (a shared one would mix replies) and draw its
    own ids (drawing on from the parent's pool would repeat the parent's)."""
    with Queue(shared_url, name="fork") as q:
        ids = [q.put(n) for n in range(3)]
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_put_in_child, args=(q, sender))
        child.start()
        ids += [q.put(n) for n in range(50)]
        child_ids = receiver.recv()
        child.join(30)
        assert child.exitcode == 0
        assert len(set(child_ids)) == 50
        assert not set(child_ids) & set(ids)
        assert q.stats().total == 103
        assert q.get(child_ids[-1]).payload == 49


# -- on a private server ----------------------------------------------------------------------


def _calls_of(client: Any, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_evalsha_reloads_the_scripts_after_script_flush(private: PrivateRedis) -> None:
    # EVALSHA is how a server before Redis 7.0 runs the scripts.
    client = redis.Redis.from_url(private.url)
    run, ops = Functions(client, evalsha=True), Operations("flush")

    def call(call: Any) -> Any:
        return call.decode(run(call.script, call.keys, call.args))

    put = [PutRequest(id=f"m{i}", payload=b"1", encoding="json", max_attempts=3) for i in (0, 1)]
    call(ops.put("q", put[:1]))
    client.script_flush()
    call(ops.put("q", put[1:]))
    assert [r.id for r in call(ops.claim("q", 2, 30_000)).records] == ["m0", "m1"]
    assert _calls_of(client, "evalsha") >= 2
    assert _calls_of(client, "fcall") == 0
    client.close()


def test_scripts_run_as_functions_reloaded_after_function_flush_and_flushall(
    private: PrivateRedis,
) -> None:
    client = redis.Redis.from_url(private.url)
    with Queue(private.url, name="functions") as q:
        q.put("a")
        assert _calls_of(client, "fcall") >= 1
        client.function_flush()
        q.put("b")
        assert [m.payload for m in q.reserve(wait=0, max=2)] == ["a", "b"]
        client.flushall()
        q.put("c")
        assert [m.payload for m in q.reserve(wait=0, max=2)] == ["c"]
    assert _calls_of(client, "evalsha") == 0
    client.close()


def test_async_face_reloads_the_library_after_function_flush(private: PrivateRedis) -> None:
    client = redis.Redis.from_url(private.url)

    async def main() -> list[Any]:
        async with AsyncQueue(private.url, name="functions") as q:
            await q.put("a")
            client.function_flush()
            await q.put("b")
            return [m.payload for m in await q.reserve(wait=0, max=2)]

    assert asyncio.run(main()) == ["a", "b"]
    client.close()


def _commands(client: Any) -> int:
    return int(client.info("stats")["total_commands_processed"])


def test_an_idle_consumer_sends_few_commands(private: PrivateRedis) -> None:
    client = redis.Redis.from_url(private.url)
    with Queue(private.url, name="idle") as q:
        q.put("later", delay=3600)
        thread = threading.Thread(target=q.reserve, kwargs={"wait": 2.5})
        thread.start()
        time.sleep(0.3)  # into its wait
        before = _commands(client)
        time.sleep(2.0)
        per_second = (_commands(client) - before - 1) / 2.0
        thread.join(PROMPTLY)
        assert per_second <= 10.0
    client.close()


def test_a_full_redis_refuses_puts_but_its_consumers_still_drain_it(
    private: PrivateRedis,
) -> None:
    """With ``maxmemory`` reached under ``noeviction``, puts fail whole (nothing half
    written) while claims, acks, cancels and lease changes still run: the queue drains,
    and then takes puts again. Without ``allow-oom`` a claim was refused too, and
    nothing could ever free the memory."""
    client = redis.Redis.from_url(private.url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 2_000_000)
    with Queue(private.url, name="full") as q:
        stored: list[str] = []
        for _ in range(1000):
            try:
                stored += q.put_many([{"payload": "x" * 200} for _ in range(100)])
            except redis.exceptions.OutOfMemoryError:
                break
        else:
            pytest.fail("maxmemory never refused a put")
        assert stored
        assert q.stats().ready == len(stored)  # the refused batch left nothing behind
        held = q.reserve(wait=0, max=10)
        q.extend(held[0], lease=60)
        q.release(held[1])
        q.ack(held[2])
        assert q.cancel(stored[-1])
        q.ack_many(held[3:])
        drained = 1 + len(held[3:])
        while batch := q.reserve(wait=0, max=100):
            q.ack_many(batch)
            drained += len(batch)
        assert drained == len(stored) - 1 - 1  # all but the extended one and the cancelled
        stats = q.stats()
        assert (stats.ready, stats.scheduled, stats.active, stats.dead) == (0, 0, 1, 0)
        assert [m.payload for m in q.reserve(wait=0)] == []
        q.put("room again")
        assert [m.payload for m in q.reserve(wait=0)] == ["room again"]
    client.close()


#: New connections allowed over a test's 20 rounds: the listener may retire and come
#: back once or twice when the machine stalls a round past its lingering; the fault it
#: guards against is a new connection per message (20).
FEW_RECONNECTS = 3


def _connections(client: Any) -> int:
    return int(client.info("stats")["total_connections_received"])


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_consumer_reserving_again_and_again_keeps_its_listener_connection(
    private: PrivateRedis, face: str
) -> None:
    """Each put between two waiting reserves sends its marker to the consumer's
    listener while no reserve of it waits: the listener hands the marker back and
    parks with its connection, rather than reconnecting for the next wait (a new
    connection per message cost the consumer its CPU and milliseconds of lateness)."""
    client = redis.Redis.from_url(private.url)
    rounds = 20

    def sync_rounds(producer: Queue) -> list[Any]:
        got = []
        with Queue(private.url, name="loop") as consumer:
            for n in range(rounds):
                producer.put(n)
                [msg] = consumer.reserve(wait=PROMPTLY)
                consumer.ack(msg)
                got.append(msg.payload)
                if n == 0:
                    before = _connections(client)
        assert _connections(client) - before <= FEW_RECONNECTS
        return got

    async def async_rounds(producer: Queue) -> list[Any]:
        got = []
        async with AsyncQueue(private.url, name="loop") as consumer:
            for n in range(rounds):
                producer.put(n)
                await asyncio.sleep(0.02)  # the listener takes the marker, no reserve waiting
                [msg] = await consumer.reserve(wait=PROMPTLY)
                await consumer.ack(msg)
                got.append(msg.payload)
                if n == 0:
                    before = _connections(client)
        assert _connections(client) - before <= FEW_RECONNECTS
        return got

    with Queue(private.url, name="loop") as producer:
        producer.put("warm up")  # the producer's own connection, before counting
        producer.purge()
        got = sync_rounds(producer) if face == "sync" else asyncio.run(async_rounds(producer))
    assert got == list(range(rounds))
    client.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_marker_taken_by_an_idle_listener_reaches_the_waiting_consumer(
    private: PrivateRedis, face: str
) -> None:
    """Consumer A's listener still blocks (lingering after A's reserve gave up) when B
    starts waiting: A's is first in line for the put's marker, and must hand it on, so
    B wakes at once rather than at its listener's next periodic look."""
    got: list[Any] = []

    async def async_idle(url: str) -> None:
        async with AsyncQueue(url, name="two") as a:
            assert await a.reserve(wait=0.2) == []
            await asyncio.sleep(1.5)  # A's loop runs on: its listener lingers

    with Queue(private.url, name="two") as b, Queue(private.url, name="two") as producer:
        if face == "sync":
            a = Queue(private.url, name="two")
            assert a.reserve(wait=0.2) == []
            idle = None
        else:
            a = None
            idle = threading.Thread(target=asyncio.run, args=(async_idle(private.url),))
            idle.start()
            time.sleep(0.3)
        waiter = threading.Thread(target=lambda: got.extend(b.reserve(wait=PROMPTLY)))
        waiter.start()
        time.sleep(0.2)  # B's listener blocks behind A's
        started = time.monotonic()
        producer.put("x")
        waiter.join(PROMPTLY)
        assert [m.payload for m in got] == ["x"]
        assert time.monotonic() - started < 1.0  # the marker, not the 2 s periodic look
        if a is not None:
            a.close()
        if idle is not None:
            idle.join(PROMPTLY)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_parked_listener_recovers_from_a_restart(private: PrivateRedis, face: str) -> None:
    """The listener parks with its connection between two reserves; Redis restarts
    meanwhile. The next wait finds the connection dead, reconnects and is woken by the
    next put, as if nothing had happened."""

    def put_later(payload: str) -> threading.Thread:
        def put() -> None:
            time.sleep(0.5)
            with Queue(private.url, name="park") as producer:
                producer.put(payload)

        thread = threading.Thread(target=put)
        thread.start()
        return thread

    def sync_run() -> list[Any]:
        with Queue(private.url, name="park") as q:
            q.put("first")
            [msg] = q.reserve(wait=PROMPTLY)
            q.ack(msg)
            q.put("second")  # its marker reaches the listener while nothing waits: parked
            time.sleep(0.3)
            private.stop()
            private.start()  # no persistence: "second" is gone
            producer = put_later("after")
            got = q.reserve(wait=10)
            producer.join()
            return [m.payload for m in got]

    async def async_run() -> list[Any]:
        async with AsyncQueue(private.url, name="park") as q:
            await q.put("first")
            [msg] = await q.reserve(wait=PROMPTLY)
            await q.ack(msg)
            await q.put("second")
            await asyncio.sleep(0.3)
            private.stop()
            private.start()
            producer = put_later("after")
            got = await q.reserve(wait=10)
            producer.join()
            return [m.payload for m in got]

    assert (sync_run() if face == "sync" else asyncio.run(async_run())) == ["after"]


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_waiting_consumer_survives_a_redis_restart(private: PrivateRedis, face: str) -> None:
    consumer = WaitingConsumer(private.url, "restart", face, wait=30)
    time.sleep(0.5)  # waiting, its listener blocked in BLPOP
    private.stop()
    time.sleep(0.5)
    private.start()
    time.sleep(0.5)
    with Queue(private.url, name="restart") as producer:
        producer.put("after the restart")
        consumer.thread.join(20)
        assert not consumer.errors, consumer.errors
        assert [m.payload for m in consumer.got] == ["after the restart"]
        assert producer.get(consumer.got[0].id).state is State.ACTIVE


def test_async_reserve_cancelled_mid_claim_gives_the_claim_back(shared_url: str) -> None:
    """Cancelled while its claim is on the wire, a reserve gives back what the claim
    took (release.lua), exactly as it was: no attempt counted, the same place."""
    from delayq.backends.redis import AsyncRedisBackend  # noqa: PLC0415

    async def main() -> None:
        async with AsyncQueue(shared_url, name="mid") as q:
            await q.put("x", id="x")
            await q.put("y", id="y")
            before = await q.get("x")
            backend = q.backend
            assert isinstance(backend, AsyncRedisBackend)
            run = backend._run
            entered, claimed = asyncio.Event(), asyncio.Event()

            async def slow_run(call: Any) -> Any:
                if call.script != "reserve":
                    return await run(call)
                entered.set()
                await asyncio.sleep(0.2)
                try:
                    return await run(call)
                finally:
                    claimed.set()

            backend._run = slow_run  # type: ignore[method-assign]
            task = asyncio.ensure_future(q.reserve(wait=0))
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await claimed.wait()  # the claim ran to its end all the same
            backend._run = run  # type: ignore[method-assign]
            for _ in range(100):
                message = await q.get("x")
                if message is not None and message.state is State.READY:
                    break
                await asyncio.sleep(0.02)
            assert message == before
            assert [m.id for m in await q.reserve(wait=0, max=2)] == ["x", "y"]
            await q.purge()

    asyncio.run(main())


def test_async_claim_cancelled_just_before_a_close_is_given_back(shared_url: str) -> None:
    """A reserve cancelled while its claim is on the wire, and the queue closed at
    once: the close waits for the claim's reply and gives back what it took, so the
    next consumer finds the message ready, not held until its lease runs out."""
    from delayq.backends.redis import AsyncRedisBackend  # noqa: PLC0415

    def linger(backend: Any, claimed: threading.Event) -> None:
        assert isinstance(backend, AsyncRedisBackend)
        run = backend._run

        async def claim_then_linger(call: Any) -> Any:
            reply = await run(call)
            if call.script == "reserve":
                claimed.set()
                await asyncio.sleep(0.3)  # the close comes before this reply
            return reply

        backend._run = claim_then_linger  # type: ignore[method-assign]

    given_back_by_the_close(shared_url, linger)


@pytest.mark.parametrize(
    "options",
    [{}, {"at": 4_000_000_000.5}, {"own": True}, {"max_attempts": 7}, {"payload": b"\x00raw"}],
    ids=["due-now", "at", "own-due-times", "attempts", "bytes"],
)
def test_a_batch_of_drawn_ids_stores_what_the_plain_path_stores(
    shared_url: str, options: dict[str, Any]
) -> None:
    """A uniform batch whose ids the facade drew is stored without looking them up
    (put.lua's on_conflict 'n'); what it stores (records, index entries, seqs, the
    reply) is what the plain path (the same requests, ids given) stores."""
    prefix = shared_url.split("prefix=")[1]
    client = redis.Redis.from_url(SHARED)
    run, ops = Functions(client), Operations(prefix)
    codec = Codec()
    drawn = []
    for i in range(1_200):  # three chunks of the script's HMGET
        item: dict[str, Any] = {"payload": {"n": i, "s": "é" * (i % 3)}}
        if options.get("own"):  # each its own due time
            item["at"] = 4_000_000_000 + i % 5
        else:
            item.update(options)
        drawn.append(build_request(codec, 3, **item))
    assert all(r.generated_id for r in drawn)
    given = [dataclasses.replace(r, generated_id=False) for r in drawn]
    drawn_call, given_call = ops.put("drawn", drawn), ops.put("given", given)
    assert (drawn_call.args[1], given_call.args[1]) == (b"n", b"i")
    assert drawn_call.decode(run(*_script_call(drawn_call))) == (True, [])
    assert given_call.decode(run(*_script_call(given_call))) == (True, [])

    def stored(queue: str) -> tuple[Any, ...]:
        msg, due, _, _, seq, _ = ops.keys(queue)
        members = client.zrange(due, 0, -1, withscores=True)
        # A due time of "now" is each call's own now; the others are exact.
        scores = [score for _, score in members] if {"at", "own"} & set(options) else []
        return client.hgetall(msg), [m for m, _ in members], scores, client.get(seq)

    assert stored("drawn") == stored("given")
    assert len(stored("drawn")[0]) == 1_200
    with Queue(shared_url, name="drawn") as q:
        assert {m.id for m in q.peek(limit=1_200)} == {r.id for r in drawn}
        got = q.get(drawn[5].id)
        assert got is not None
        assert got.payload == options.get("payload", {"n": 5, "s": "éé"})
        q.purge()
    with Queue(shared_url, name="given") as q:
        q.purge()
    client.close()


@pytest.mark.parametrize("start", [0, 2**16 - 700, 2**32 - 700])
@pytest.mark.parametrize("form", ["drawn", "given", "own-due-times", "mixed", "bytes"])
def test_a_batch_stored_unstaged_is_what_the_staged_path_stores(
    shared_url: str, form: str, start: int
) -> None:
    """A batch all ``"ignore"`` is written straight from ARGV, each seq's bytes packed
    once per 256 seqs and each chunk of 500 written as it is built; what it stores
    (records, index entries with their scores, the counter) is byte for byte what the
    staged path stores for the same requests with ``on_conflict="replace"`` (``pack()``
    and ``due_member()`` of each). 1,200 requests, three chunks of which the last is
    partial, with the counter below 256, 2**16 and 2**32, where cmsgpack's form of a
    seq changes; uniform batches (ids drawn or given, one due time or each its own,
    JSON or bytes) and one whose requests differ."""
    prefix = shared_url.split("prefix=")[1]
    client = redis.Redis.from_url(SHARED)
    run, ops = Functions(client), Operations(prefix)
    codec = Codec()
    requests = []
    for i in range(1_200):
        item: dict[str, Any] = {"payload": {"n": i}, "at": 4_000_000_000.5}
        if form != "drawn":
            item["id"] = f"m{i}"
        if form == "own-due-times":
            item["at"] = 4_000_000_000 + i % 7
        elif form == "mixed":
            item["max_attempts"] = 1 + i % 3
        elif form == "bytes":
            item["payload"] = b"\x00raw%d" % i
        requests.append(build_request(codec, 3, **item))
    replacing = [
        dataclasses.replace(r, on_conflict="replace", generated_id=False) for r in requests
    ]
    for queue, batch in (("unstaged", requests), ("staged", replacing)):
        client.set(ops.seq_key(queue), start)
        call = ops.put(queue, batch)
        assert call.decode(run(*_script_call(call))) == (True, [])

    def stored(queue: str) -> tuple[Any, ...]:
        msg, due, _, _, seq, _ = ops.keys(queue)
        return client.hgetall(msg), client.zrange(due, 0, -1, withscores=True), client.get(seq)

    assert stored("unstaged") == stored("staged")
    records, entries, counter = stored("unstaged")
    assert (len(records), len(entries), int(counter)) == (1_200, 1_200, start + 1_200)
    with Queue(shared_url, name="unstaged") as q:
        got = q.get(requests[-1].id)
        assert got is not None
        assert got.seq == start + 1_200
        q.purge()
    with Queue(shared_url, name="staged") as q:
        q.purge()
    client.close()


#: A duration that takes a time of today (~2**40.6 ms) past 2**52 and short of 2**53: a
#: score there has 16 digits, which Lua's own number to text (14) cannot hold exactly.
NEAR_2_53 = 2**53 - 2**42


def test_the_claim_and_ack_paths_store_their_scores_exactly(shared_url: str) -> None:
    """The scripts a worker runs per job hand Redis each score as the text of its whole
    number: a lease expiry from a claim and from an extend, a due time from a nack, all
    near 2**53, and a dead message's seq (its dead score) near 2**53; a due time kept by
    a release and one set by a lease expiry (past 2**31, as every time of today). Each
    is stored as exactly the number the reply gave, in the index and in the record."""
    prefix = shared_url.split("prefix=")[1]
    client = redis.Redis.from_url(SHARED)
    ops = Operations(prefix)

    def scores(queue: str, id: str) -> dict[str, float | None]:
        _, due, lease, dead, _, _ = ops.keys(queue)
        member = pack_id(id)
        entries = client.zrange(due, 0, -1, withscores=True)
        return {
            "due": next((s for m, s in entries if m[8:] == member), None),
            "lease": client.zscore(lease, member),
            "dead": client.zscore(dead, member),
        }

    with Queue(shared_url, name="exact") as q:
        backend = q.backend
        first = 2**53 - 2**20 + 12_345  # an odd seq, so the dead score's last digit counts
        client.set(ops.seq_key("exact"), first - 1)
        put = q.put({"n": 1}, max_attempts=5)
        [claimed] = backend.reserve("exact", limit=1, lease_ms=NEAR_2_53, wait=0)
        assert claimed.lease is not None
        assert claimed.lease_until is not None
        assert 2**52 < claimed.lease_until < 2**53
        assert claimed.seq == first
        assert scores("exact", put) == {"due": None, "lease": claimed.lease_until, "dead": None}

        until = backend.extend("exact", put, claimed.lease, NEAR_2_53 + 1)
        assert 2**52 < until < 2**53
        assert scores("exact", put)["lease"] == until
        assert backend.get("exact", put).lease_until == until  # type: ignore[union-attr]

        assert backend.nack("exact", put, claimed.lease, delay_ms=NEAR_2_53, error=None)
        record = backend.get("exact", put)
        assert record is not None
        assert 2**52 < record.due_at < 2**53
        assert scores("exact", put) == {"due": record.due_at, "lease": None, "dead": None}

        released = q.put({"n": 2})
        [held] = backend.reserve("exact", limit=1, lease_ms=60_000, wait=0)
        assert held.id == released
        assert held.lease is not None
        assert held.due_at > 2**31
        backend.release("exact", released, held.lease)
        assert scores("exact", released) == {"due": held.due_at, "lease": None, "dead": None}

        [held] = backend.reserve("exact", limit=1, lease_ms=1, wait=0)
        assert held.lease_until is not None
        time.sleep(0.01)
        backend.stats("exact")  # settles the expired lease: scheduled at its expiry
        assert scores("exact", released) == {"due": held.lease_until, "lease": None, "dead": None}

        [again] = backend.reserve("exact", limit=1, lease_ms=60_000, wait=0)
        assert again.id == released
        assert again.lease is not None
        assert backend.nack("exact", released, again.lease, delay_ms=0, error="x", dead=True)
        assert scores("exact", released) == {"due": None, "lease": None, "dead": first + 3}
        q.purge()

        client.set(ops.seq_key("dying"), first - 1)
        dying = q.named("dying").put({"n": 3}, max_attempts=1)
        [held] = backend.reserve("dying", limit=1, lease_ms=1, wait=0)
        assert held.id == dying
        assert held.seq == first
        time.sleep(0.01)
        backend.stats("dying")  # the last attempt's lease expired: dead, its seq the score
        assert scores("dying", dying) == {"due": None, "lease": None, "dead": first}
        q.named("dying").purge()
    client.close()
