"""The stored record of ``redis://``: format 2 (a flags byte, cmsgpack values, the payload
as is; a scheduled record takes its due time from the ``due`` score), and format 1
(cmsgpack of every field), which earlier versions wrote and which must stay readable:
users upgrade with messages in Redis. Format 1 records are written here by a script of
the old ``pack()``, then used through the public API."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from delayq.durable import Queue, State

redis = pytest.importorskip("redis")

from delayq.backends.redis._scripts import pack_id, queue_keys  # noqa: E402

SHARED = os.environ.get("DELAYQ_TEST_REDIS", "redis://127.0.0.1:6379/0")
QUEUE = "records"

#: Format 1 as earlier versions wrote it: the record, and its index entry.
_WRITE_FORMAT_1 = """
local state, due, seq = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local fields = {state, due, seq, tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], ARGV[8]}
local n = 7
for i = 8, 11 do
  if ARGV[i + 1] ~= '' then fields[i], n = ARGV[i + 1], i end
end
if fields[11] then fields[11] = tonumber(fields[11]) end
redis.call('HSET', KEYS[1], ARGV[1], cmsgpack.pack(unpack(fields, 1, n)))
if state == 1 then
  redis.call('ZADD', KEYS[2], due, struct.pack('>I8', seq) .. ARGV[1])
elseif state == 2 then
  redis.call('ZADD', KEYS[3], tonumber(fields[11]), ARGV[1])
else
  redis.call('ZADD', KEYS[4], seq, ARGV[1])
end
redis.call('SET', KEYS[5], math.max(seq, tonumber(redis.call('GET', KEYS[5]) or '0')))
"""


@pytest.fixture
def prefix() -> Iterator[str]:
    """A private key prefix on the shared test Redis; its keys are deleted afterwards."""
    client = redis.Redis.from_url(SHARED, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        required = {n.strip() for n in os.environ.get("DELAYQ_REQUIRE", "").split(",")}
        if "redis" in required or "all" in required:
            pytest.fail(f"redis is required by DELAYQ_REQUIRE but unavailable: {exc}")
        pytest.skip(f"redis unavailable: {exc}")
    name = f"delayq-test-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        keys = list(client.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def _write_format_1(
    client: Any,
    prefix: str,
    id: str,
    *,
    state: int,
    due: int,
    seq: int,
    payload: bytes,
    attempts: int = 0,
    max_attempts: int = 3,
    encoding: str = "",
    extra: tuple[str, ...] = (),
) -> None:
    """One record as format 1 stored it (extra: headers, err, lease, lease_until)."""
    tail = [*extra, "", "", "", ""][:4]
    client.eval(
        _WRITE_FORMAT_1,
        5,
        *queue_keys(prefix, QUEUE)[:5],
        pack_id(id),
        state,
        due,
        seq,
        attempts,
        max_attempts,
        encoding,
        payload,
        *tail,
    )


def _raw(client: Any, prefix: str, id: str) -> bytes:
    raw = client.hget(queue_keys(prefix, QUEUE)[0], pack_id(id))
    assert isinstance(raw, bytes)
    return raw


def test_records_written_by_the_previous_format_are_read_and_used(prefix: str) -> None:
    client = redis.Redis.from_url(SHARED)
    now = int(time.time() * 1000)
    later = now + 3_600_000
    generated = uuid.uuid4().hex
    _write_format_1(client, prefix, "plain", state=1, due=now - 50, seq=1, payload=b'{"a":1}')
    _write_format_1(
        client,
        prefix,
        generated,
        state=1,
        due=now - 40,
        seq=2,
        payload=b"\x00raw",
        encoding="bytes",
    )
    _write_format_1(
        client,
        prefix,
        "headed",
        state=1,
        due=later,
        seq=3,
        payload=b'"h"',
        attempts=1,
        max_attempts=5,
        extra=('{"k":"v"}', "boom"),
    )
    _write_format_1(
        client, prefix, "dead", state=3, due=now - 1000, seq=4, payload=b"1", attempts=3,
        extra=("", "gave up"),
    )  # fmt: skip
    _write_format_1(
        client, prefix, "held", state=2, due=now - 2000, seq=5, payload=b"2", attempts=1,
        extra=("", "", "old-token", str(now - 100)),
    )  # fmt: skip
    with Queue(f"{SHARED}?prefix={prefix}", name=QUEUE) as q:
        headed = q.get("headed")
        assert headed is not None
        assert (headed.state, headed.due_at, headed.payload) == (State.SCHEDULED, later, "h")
        assert (headed.attempts, headed.max_attempts, headed.last_error) == (1, 5, "boom")
        assert headed.headers == {"k": "v"}
        dead = q.get("dead")
        assert dead is not None
        assert (dead.state, dead.last_error, dead.attempts) == (State.DEAD, "gave up", 3)
        stats = q.stats()  # settles the expired lease of "held": due again at its expiry
        assert (stats.ready, stats.scheduled, stats.active, stats.dead) == (3, 1, 0, 1)

        got = q.reserve(max=10, wait=0)
        assert [m.id for m in got] == ["held", "plain", generated]
        assert [m.payload for m in got] == [2, {"a": 1}, b"\x00raw"]
        assert got[0].attempts == 2
        assert got[0].last_error == "lease expired"
        assert got[1].due_at == now - 50
        assert got[1].max_attempts == 3
        for message in got:
            assert _raw(client, prefix, message.id)[0] >= 128, "rewritten in format 2"
        assert q.ack_many(got) == []
        assert q.retry_dead() == 1
        assert q.reschedule("headed", delay=0)
        again = q.reserve(max=10, wait=0)
        assert sorted(m.id for m in again) == ["dead", "headed"]
        by_id = {m.id: m for m in again}
        assert by_id["headed"].headers == {"k": "v"}
        assert by_id["headed"].payload == "h"
        assert by_id["dead"].last_error == "gave up"
        assert by_id["dead"].attempts == 1
    client.close()


class _Named:
    """A serializer with its own name: stored among the record's extra values."""

    name = "named-json"

    @staticmethod
    def dumps(value: Any) -> bytes:
        return repr(value).encode()

    @staticmethod
    def loads(data: bytes) -> Any:
        return data.decode()


@pytest.mark.parametrize(
    "payload", [b"", b"x" * 100, "text", {"n": [1, 2]}, b"\xff\x00" * 300], ids=repr
)
def test_format_2_keeps_every_field_through_every_state(prefix: str, payload: object) -> None:
    with Queue(f"{SHARED}?prefix={prefix}", name=QUEUE) as q:
        id = q.put(payload, headers={"h": "1"}, max_attempts=2, delay=3600)
        plain = q.put(payload)
        message = q.get(id)
        assert message is not None
        assert (message.payload, message.headers, message.max_attempts) == (payload, {"h": "1"}, 2)
        assert q.reschedule(id, delay=0)
        got = {m.id: m for m in q.reserve(max=2, wait=0)}
        assert set(got) == {id, plain}
        assert got[plain].payload == payload
        assert got[plain].headers == {}
        assert q.nack(got[id], error="first", delay=0) is State.SCHEDULED
        assert q.nack(q.reserve(wait=0)[0], error="second") is State.DEAD
        dead = q.get(id)
        assert dead is not None
        assert (dead.payload, dead.last_error, dead.attempts, dead.headers) == (
            payload,
            "second",
            2,
            {"h": "1"},
        )
    with Queue(f"{SHARED}?prefix={prefix}", name="named", serializer=_Named()) as named:
        id = named.put("v", delay=3600)
        message = named.get(id)
        assert message is not None
        assert message.payload == "'v'"


def test_a_scheduled_record_holds_no_due_time_and_fits_a_small_allocation(prefix: str) -> None:
    client = redis.Redis.from_url(SHARED)
    with Queue(f"{SHARED}?prefix={prefix}", name=QUEUE) as q:
        for _ in range(70_000 // 1000):
            q.put_many([{"payload": "x" * 98, "delay": 3600}] * 1000)  # seq past 65535
        id = q.put(b"y" * 100, delay=3600)
        raw = _raw(client, prefix, id)
        # flags, seq (uint32), attempts, max, then the payload: 108 bytes, so the
        # hash value is a 112-byte allocation (sds header 3 + 108 + NUL).
        assert len(raw) == 108
        assert raw.endswith(b"y" * 100)
        # A batch's record is laid out the same (put.lua packs the part after the seq
        # once per batch): only the seq differs.
        [batched] = q.put_many([{"payload": b"z" * 100, "delay": 3600}])
        raw_batched = _raw(client, prefix, batched)
        assert len(raw_batched) == 108
        assert raw_batched[:2] + raw_batched[6:8] == raw[:2] + raw[6:8]
        assert raw_batched.endswith(b"z" * 100)
        q.purge()
    client.close()


def test_a_claim_gives_each_message_as_get_shows_it_with_its_lease(prefix: str) -> None:
    """reserve.lua sends a claimed message's values alone, flat (its state, lease token
    and lease end follow from the call): every field still reads as get() reads it
    from the full record, whatever the message holds."""
    with Queue(f"{SHARED}?prefix={prefix}", name=QUEUE) as q:
        ids = [
            q.put({"n": 1}),
            q.put(b"\xff\x00raw", headers={"h": "1"}, max_attempts=3),
            q.put("text", id="named id \u00e9"),
        ]
        [failed] = q.reserve(wait=0)
        assert failed.id == ids[0]
        assert q.nack(failed, error="boom \u00e9", delay=0) is State.SCHEDULED
        claimed = q.reserve(max=10, wait=0, lease=20)
        assert sorted(m.id for m in claimed) == sorted(ids)
        tokens = set()
        for message in claimed:
            shown = q.get(message.id)
            assert shown is not None
            assert shown.state is message.state is State.ACTIVE
            assert shown.lease is None
            assert message.lease is not None
            tokens.add(message.lease)
            for field in (
                "id",
                "queue",
                "payload",
                "due_at",
                "attempts",
                "max_attempts",
                "headers",
                "last_error",
                "lease_expires_at",
                "payload_error",
                "seq",
                "headers_error",
            ):
                assert getattr(message, field) == getattr(shown, field), field
            assert 0 < message.lease_expires_at - time.time() * 1000 <= 20_000 + 5
        assert len(tokens) == 3
        by_id = {m.id: m for m in claimed}
        assert (by_id[ids[0]].attempts, by_id[ids[0]].last_error) == (2, "boom \u00e9")
        assert by_id[ids[1]].payload == b"\xff\x00raw"
        assert by_id[ids[1]].headers == {"h": "1"}
        assert q.ack_many(claimed) == []
        # Claimed ahead of its due time (a waiting reserve that fires ahead): its lease
        # runs from its due time, as get() shows it.
        id = q.put("soon", delay=0.3)
        [held] = q.reserve(wait=5, lease=20)
        shown = q.get(id)
        assert shown is not None
        assert held.lease_expires_at == shown.lease_expires_at
        assert held.lease_expires_at >= held.due_at + 20_000
        q.ack(held)
