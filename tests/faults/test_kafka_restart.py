"""``kafka://`` across a restart of its broker, on both faces: a private Tansu broker on
s3 storage (tests/backends/_tansu.py, ``s3_broker``: its records in a ``moto_server``
bucket that outlives the broker), stopped and started again on the same port while a
namespace has messages scheduled, some falling due during the outage and some after.

What a user relies on: every put that returned is delivered once, none before its
time; the scheduler reconnects and goes on by itself (nobody reopens anything); a put
made while the broker is down either returns once it is back or fails with an error
that says so (an outage, or an unknown outcome), never returns and is lost; the elected
scheduler killed (SIGKILL) across the restart is replaced by another candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from delayq.errors import OutcomeUnknown

from ._faces import Face
from ._faces import reserve as _reserve
from ._faces import settle as _settle
from ._history import History, check

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

pytest.importorskip("aiokafka")
from backends._tansu import TansuBroker  # noqa: E402
from backends.test_amqp_standby import Scheduler, schedulers  # noqa: E402
from delayq.backends.kafka import OUTAGE_ERRORS  # noqa: E402 (needs aiokafka)

#: A call rides an outage out for this long (s) before it fails: longer than the
#: broker's stop and start on a loaded machine (its stop alone takes some 5 s).
REQUEST_TIMEOUT = 20.0
#: Messages of each kind: due during the outage, due after it.
EACH = 4
#: The later ones' delay (s): past the broker's stop and start.
LATER = 12.0
#: The tailing readers' fetch wait (ms). Tansu answers a waiting fetch when its wait
#: ends, and on s3 storage each fetch reads the bucket: at 5 ms (the memory broker's
#: suites) the readers of three backend objects kept the local S3 server so busy that
#: a fetch at a partition's end went unanswered for tens of seconds (docs/kafka.md).
FETCH_WAIT_MS = 200
#: How long after the broker is back every message must have come out (s).
RECOVERY = 30.0


def _url(broker: TansuBroker, prefix: str, scheduler: str) -> str:
    return (
        f"kafka://{broker.bootstrap}?prefix={prefix}&scheduler={scheduler}"
        f"&idempotence=off&fetch_wait_ms={FETCH_WAIT_MS}&request_timeout={REQUEST_TIMEOUT:g}"
        "&session_timeout=6"  # a killed scheduler's session: the least Kafka takes
    )


def test_every_acknowledged_message_is_delivered_once_across_a_broker_restart(
    s3_broker: TansuBroker,
) -> None:
    """Both faces in one namespace (a restart costs seconds): the scheduler on the sync
    face, a producer on each, the consumer on the asyncio face."""
    prefix = f"delayq-test-{secrets.token_hex(4)}"
    history = History(unknown=[OutcomeUnknown])
    ids = [f"soon-{n}" for n in range(EACH)] + [f"later-{n}" for n in range(EACH)]

    async def put(q: Face, id: str, delay: float, **options: Any) -> None:
        with history.call("put", id, delay=delay):
            await q.call("put", id, id=id, delay=delay, **options)

    async def put_during(q: Face, id: str) -> None:
        """A put while the broker is down: it returns once the broker is back, or fails
        as an outage or an unknown outcome (its history says which)."""
        with contextlib.suppress(*OUTAGE_ERRORS, OutcomeUnknown):
            await put(q, id, 0.5, on_conflict="replace")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with (
            Face("sync", _url(s3_broker, prefix, "on"), "restart") as scheduler,
            Face("sync", _url(s3_broker, prefix, "off"), "restart") as producer,
            Face("async", _url(s3_broker, prefix, "off"), "restart") as consumer,
        ):
            await scheduler.call("stats")  # elected
            for q in (producer, consumer):
                await q.call("stats")
            for n in range(EACH):
                # Plain puts (the log) and fast puts (the intake), from both faces.
                plain = {"on_conflict": "replace"} if n % 2 else {}
                q = producer if n < EACH // 2 else consumer
                await put(q, f"soon-{n}", 0.5, **plain)
                await put(q, f"later-{n}", LATER, **plain)
            later_due = time.time() + LATER - 1.0
            await loop.run_in_executor(None, s3_broker.stop)
            during = [
                loop.create_task(put_during(producer, "during-sync")),
                loop.create_task(put_during(consumer, "during-async")),
            ]
            await asyncio.sleep(1.0)  # the outage, with those puts in flight
            await loop.run_in_executor(None, s3_broker.start)
            back = time.monotonic()
            assert time.time() < later_due, "the restart took longer than the later delay"
            await asyncio.gather(*during)
            # Every message, once, none early: nobody reopened anything.
            stored = {op.id for op in history.ops if op.outcome != "failed"}
            got: set[str] = set()
            while not stored <= got:
                assert time.monotonic() - back < RECOVERY, f"missing: {sorted(stored - got)}"
                try:
                    messages = await _reserve(consumer, history, wait=2, max=20, lease=60)
                except OUTAGE_ERRORS:
                    continue  # the consumer's own reconnection, on a loaded machine
                for message in messages:
                    got.add(message.id)
                    await _settle(consumer, history, "ack", message)
            assert set(ids) <= got
            stats = await consumer.call("stats")
            assert (stats.ready, stats.scheduled, stats.active) == (0, 0, 0)

    asyncio.run(main())
    report = check(history)
    report.assert_ok()
    assert report.duplicates == 0
    assert report.messages >= 2 * EACH


def test_a_scheduler_killed_across_a_broker_restart_is_replaced(
    s3_broker: TansuBroker, tmp_path: Path
) -> None:
    """The elected scheduler, a ``delayq scheduler`` process, killed (SIGKILL) and the
    broker restarted right after: the other candidate, another such process, is
    elected by itself and every acknowledged message comes out once, none early."""
    prefix = f"delayq-test-{secrets.token_hex(4)}"
    history = History(unknown=[OutcomeUnknown])
    ids = [f"soon-{n}" for n in range(EACH)] + [f"later-{n}" for n in range(EACH)]
    url = _url(s3_broker, prefix, "off").replace("&scheduler=off", "")

    async def main(first: Scheduler, start: Callable[[str], Scheduler]) -> None:
        loop = asyncio.get_running_loop()
        client_url = _url(s3_broker, prefix, "off").replace(
            f"request_timeout={REQUEST_TIMEOUT:g}", "request_timeout=60"
        )
        async with Face("sync", client_url, "killed") as client:
            for n in range(EACH):
                for id, delay in ((f"soon-{n}", 0.5), (f"later-{n}", LATER)):
                    with history.call("put", id, delay=delay):
                        await client.call("put", id, id=id, delay=delay, on_conflict="replace")
            second = start(url)
            await loop.run_in_executor(None, second.wait_for, "scheduler_standing")
            first.kill()
            await loop.run_in_executor(None, s3_broker.restart)
            await loop.run_in_executor(None, second.wait_for, "scheduler_elected")
            got: set[str] = set()
            while not set(ids) <= got:
                messages = await _reserve(client, history, wait=5, max=20, lease=60)
                assert messages or set(ids) <= got, f"missing: {sorted(set(ids) - got)}"
                for message in messages:
                    got.add(message.id)
                    await _settle(client, history, "ack", message)

    with schedulers(tmp_path) as start:
        first = start(url)
        first.wait_for("scheduler_elected")
        asyncio.run(main(first, start))
    report = check(history)
    report.assert_ok()
    assert report.duplicates == 0
    assert report.messages == 2 * EACH
