"""Kafka's part of the replicated backend (:class:`~.._replicated.Transport`), on
aiokafka's public API (docs/kafka.md, "Topics").

One producer per backend object (``acks=all``, idempotent unless ``idempotence=off``)
writes every topic of the namespace: the log, the intake, the checkpoint pointers, the
requests, the replies and the events. The readers are consumers without a group,
assigned their partitions: the client's inbox (its partition of the replies, and the
events), and once a candidate the scheduler's (the log, the intake, the requests).
The election is a consumer group (:mod:`._lock`).

A client's inbox is one partition of ``<prefix>.replies`` (picked by its id) read
from its end, a reply keyed by the client's id: a topic per client would be left
behind by every client that goes (Kafka has no topic that dies with its reader), and
one partition for all would make every client read every reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.helpers import create_ssl_context

from ..._redact import redact_url
from ..._timeout import within
from ...durable.message import Record
from .._replicated import Delivery, LogEntry, Refused, ServerRefused
from ._constants import (
    HEARTBEAT_MS,
    JOIN_TIMEOUT_MS,
    MAX_RECORD_BYTES,
    REBALANCE_TIMEOUT_MS,
    REPLY_PARTITIONS,
    Names,
    log_config,
)
from ._fence import Deposed, ReignFence
from ._lock import LockListener, lock_assignor
from ._url import Settings

__all__ = ["KafkaTransport"]

T = TypeVar("T")

#: The error codes of CreateTopics that leave the topic usable: none, and "exists".
_CREATED = (0, 36)
#: Records a reader of the log takes at a time (few: a reader that looks for one
#: entry a few entries on).
_MANY = 1000
_FEW = 8
#: Fetches again of a gap in a partition's offsets before it is taken for real, and
#: the pause before each (see KafkaTransport._records).
GAP_TRIES = 5
GAP_PAUSE = 0.005
#: ``fetch.max.wait.ms`` of the election's member (it reads nothing).
LOCK_FETCH_WAIT_MS = 1000
#: How long the replies and the events are kept: a reply is read at once or never.
_SHORT_RETENTION = {
    "cleanup.policy": "delete",
    "retention.ms": "3600000",
    "max.message.bytes": str(MAX_RECORD_BYTES),
}


def _headers(record: Any) -> dict[str, str]:
    return {key: value.decode(errors="replace") for key, value in record.headers or ()}


def _now_ms() -> int:
    return int(time.time() * 1000)


class KafkaTransport:
    """One backend object's clients of the Kafka cluster (see the module's docstring)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._names = Names(settings.prefix)
        self._inbox = uuid.uuid4().hex
        self._partition = zlib.crc32(self._inbox.encode()) % REPLY_PARTITIONS
        self._admin: AIOKafkaAdminClient | None = None
        self._producer: AIOKafkaProducer | None = None
        self._consumers: list[AIOKafkaConsumer] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock: LockListener | None = None
        self._on_lost: Callable[[], None] | None = None
        self._fence: ReignFence | None = None
        self._closed = False

    @property
    def retention_bytes(self) -> int:
        """See :attr:`~.._replicated.Transport.retention_bytes`."""
        return self._settings.retention_bytes

    @property
    def namespace(self) -> str:
        """See :attr:`~.._replicated.Transport.namespace`."""
        return self._settings.prefix

    def _common(self) -> dict[str, Any]:
        """The connection settings every client of this transport takes."""
        settings = self._settings
        common: dict[str, Any] = {
            "bootstrap_servers": list(settings.bootstrap),
            "client_id": f"delayq-{settings.prefix}",
            "request_timeout_ms": int(settings.request_timeout * 1000),
            **settings.security,
        }
        if settings.security["security_protocol"] in ("SSL", "SASL_SSL"):
            try:
                common["ssl_context"] = create_ssl_context(**settings.tls)
            except (OSError, ValueError) as exc:
                files = ", ".join(f"ssl_{key}={path}" for key, path in settings.tls.items())
                raise ValueError(f"cannot use the TLS files ({files or 'none'}): {exc}") from exc
        return common

    # -- the connection ---------------------------------------------------------------

    async def open(
        self,
        on_reply: Callable[[str, str, bytes], None],
        on_elected: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        """See :meth:`~.._replicated.Transport.open`: the namespace's topics created
        (those that exist are left as they are), the producer started, the inbox read
        from its end."""
        self._on_lost = on_lost
        try:
            await self._open(on_reply, on_elected)
        except BaseException as exc:
            await self.close()
            raise self._said(exc) from exc

    def _said(self, exc: BaseException) -> BaseException:
        """What an open that failed with ``exc`` raises (see Transport.open)."""
        where = ",".join(self._settings.bootstrap)
        if isinstance(exc, KafkaConnectionError):
            return ServerRefused(
                f"cannot use the queue at {redact_url(self._settings.url)}: "
                f"no Kafka broker answers at {where}"
            )
        if isinstance(exc, KafkaError) and not exc.retriable:
            return Refused(exc)
        if isinstance(exc, (OSError, ValueError)) and not isinstance(exc, ConnectionError):
            return Refused(exc)  # a TLS file that cannot be read, a bad certificate
        if isinstance(exc, KafkaError):
            return ConnectionError(f"could not open the Kafka clients of {where}: {exc!r}")
        return exc

    async def _open(
        self, on_reply: Callable[[str, str, bytes], None], on_elected: Callable[[], None]
    ) -> None:
        common = self._common()
        self._admin = AIOKafkaAdminClient(**common)
        await self._admin.start()
        await self._declare()
        self._producer = AIOKafkaProducer(
            **common,
            acks="all",
            enable_idempotence=self._settings.idempotence,
            linger_ms=0,
            max_request_size=MAX_RECORD_BYTES,
        )
        try:
            await self._producer.start()
        except KafkaError as exc:
            if self._settings.idempotence and not isinstance(exc, KafkaConnectionError):
                raise ValueError(
                    f"the Kafka broker refused an idempotent producer ({exc!r}): a broker "
                    f"without InitProducerId takes idempotence=off (docs/kafka.md)"
                ) from exc
            raise
        names = self._names
        partitions = [
            TopicPartition(names.replies, self._partition),
            TopicPartition(names.events, 0),
        ]
        inbox = await self._reader(partitions, None)

        def take(record: Any) -> None:
            headers = _headers(record)
            kind = headers.get("kind", "")
            if record.topic == names.events:
                if kind == "elected":
                    on_elected()
                else:
                    on_reply("", kind, record.value or b"")
            elif record.key == self._inbox.encode():
                on_reply(headers.get("rid", ""), kind, record.value or b"")

        self._spawn(self._follow(inbox, take))

    async def _declare(self) -> None:
        assert self._admin is not None
        names = self._names
        log = log_config(self._settings.retention_bytes)
        topics = [
            NewTopic(names.log, 1, 1, topic_configs=log),
            NewTopic(names.intake, 1, 1, topic_configs=log),
            NewTopic(names.meta, 1, 1, topic_configs={"cleanup.policy": "compact"}),
            NewTopic(names.lock, 1, 1),
            NewTopic(names.requests, 1, 1, topic_configs=_SHORT_RETENTION),
            NewTopic(names.replies, REPLY_PARTITIONS, 1, topic_configs=_SHORT_RETENTION),
            NewTopic(names.events, 1, 1, topic_configs=_SHORT_RETENTION),
        ]
        response = await self._admin.create_topics(topics)
        for name, code, *said in response.topic_errors:
            if code not in _CREATED:
                message = said[0] if said and said[0] else f"error code {code}"
                raise ValueError(f"Kafka did not create the topic {name}: {message}")

    async def _reader(
        self, partitions: Sequence[TopicPartition], start: int | None, *, end: bool = True
    ) -> AIOKafkaConsumer:
        """A consumer without a group, assigned ``partitions`` and positioned at
        ``start`` (None: their end, or with ``end=False`` their first record)."""
        consumer = AIOKafkaConsumer(
            **self._common(),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self._settings.fetch_wait_ms,
            max_partition_fetch_bytes=MAX_RECORD_BYTES,
            fetch_max_bytes=MAX_RECORD_BYTES,
        )
        self._consumers.append(consumer)
        await consumer.start()
        consumer.assign(list(partitions))
        if start is not None:
            for partition in partitions:
                consumer.seek(partition, start)
        elif end:
            await consumer.seek_to_end(*partitions)
            for partition in partitions:  # resolved now, not at the first fetch
                await consumer.position(partition)
        else:
            await consumer.seek_to_beginning(*partitions)
        return consumer

    async def _drop(self, consumer: AIOKafkaConsumer) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)
        with contextlib.suppress(Exception):
            await consumer.stop()

    async def _follow(self, consumer: AIOKafkaConsumer, take: Callable[[Any], None]) -> None:
        """Hand every record ``consumer`` fetches to ``take``, until this transport
        closes; a failure of the reader is a lost connection."""
        try:
            async for record in self._records(consumer, _MANY):
                take(record)
        except asyncio.CancelledError:
            raise
        except Exception:  # any failure of the reader ends this transport
            self._lost()

    async def _records(self, consumer: AIOKafkaConsumer, most: int) -> AsyncIterator[Any]:
        """The records of ``consumer``'s partitions, each partition's in offset order
        with none skipped. Offsets run on by one a record in the topics of a namespace
        (no transaction, no compaction but the pointers'), so a fetch that starts past
        the next offset expected is fetched again from it, up to GAP_TRIES times: a
        broker may show a record before one appended a moment earlier (Tansu does,
        docs/kafka.md), and a reader that moved past the earlier one would never see
        it. A gap that stays is real (retention dropped the records), and is passed on
        (the caller sees the offsets)."""
        expected = {tp: await consumer.position(tp) for tp in consumer.assignment()}
        tries = 0
        while True:
            batches = await self._fetched(consumer.getmany(timeout_ms=1000, max_records=most))
            for tp, records in batches.items():
                for record in records:
                    want = expected.get(tp, record.offset)
                    if record.offset < want:
                        continue  # fetched again after a seek back
                    if record.offset > want and tries < GAP_TRIES:
                        tries += 1
                        consumer.seek(tp, want)
                        await asyncio.sleep(GAP_PAUSE)
                        break
                    tries = 0
                    expected[tp] = record.offset + 1
                    yield record

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _lost(self) -> None:
        on_lost, self._on_lost = self._on_lost, None
        if on_lost is not None and not self._closed:
            on_lost()

    async def _produce(
        self,
        what: str,
        topic: str,
        value: bytes,
        headers: dict[str, str],
        *,
        key: bytes | None = None,
        partition: int = 0,
    ) -> int:
        """Produce one record and wait for the brokers' acknowledgement (``acks=all``):
        its offset; ConnectionError when it was not given within the request timeout.

        Bounded here: through a link that hangs (packets dropped, no reset) the
        producer's own timeouts add up, a wait for the partition's leader and then
        for the produce's answer, each ``request_timeout_ms``, so a call's request
        took twice its timeout to fail."""
        producer = self._producer
        if producer is None:
            raise ConnectionError("the Kafka clients are closed")
        timeout = self._settings.request_timeout
        try:
            sent = await within(
                producer.send_and_wait(
                    topic,
                    value,
                    key=key,
                    partition=partition,
                    headers=[(name, text.encode()) for name, text in headers.items()],
                ),
                timeout,
            )
        except asyncio.TimeoutError:
            raise ConnectionError(
                f"the Kafka {what} was not acknowledged in {timeout:g} s"
            ) from None
        except KafkaError as exc:
            raise ConnectionError(f"the Kafka {what} was not acknowledged: {exc!r}") from exc
        return int(sent.offset)

    # -- requests and replies ----------------------------------------------------------

    async def candidates(self) -> int:
        """See :meth:`~.._replicated.Transport.candidates`: the members of the
        election's consumer group, as the group's coordinator describes them."""
        admin = self._admin
        if admin is None:
            raise ConnectionError("the Kafka clients are closed")
        try:
            described = await admin.describe_consumer_groups([self._names.lock])
        except KafkaError as exc:
            raise ConnectionError(f"could not count the candidates: {exc!r}") from exc
        return sum(len(group[5]) for response in described for group in response.groups)

    async def request(self, op: str, request_id: str, body: bytes, ttl_ms: int | None) -> None:
        """See :meth:`~.._replicated.Transport.request`: a record of the requests
        topic, its expiry (epoch ms, the client's clock) in a header: a scheduler drops
        one it reads after that."""
        headers = {"op": op, "rid": request_id, "reply_to": f"{self._partition}:{self._inbox}"}
        if ttl_ms is not None:
            headers["expires"] = str(_now_ms() + ttl_ms)
        await self._produce("request", self._names.requests, body, headers)

    async def serve(self, on_request: Callable[[Delivery], None]) -> None:
        """See :meth:`~.._replicated.Transport.serve`: the requests topic read from
        its end as it is now."""
        consumer = await self._reader([TopicPartition(self._names.requests, 0)], None)

        def take(record: Any) -> None:
            headers = _headers(record)
            expires = headers.get("expires")
            if expires is not None and int(expires) < _now_ms():
                return  # its caller gave up on it
            on_request(
                Delivery(
                    headers.get("op", ""),
                    headers.get("rid", ""),
                    headers.get("reply_to", ""),
                    record.value or b"",
                )
            )

        self._spawn(self._follow(consumer, take))

    async def reply(
        self, reply_to: str, request_id: str, kind: str, body: bytes, *, confirm: bool
    ) -> bool:
        """See :meth:`~.._replicated.Transport.reply`: to the client's partition of the
        replies topic, keyed by its id. Kafka cannot say whether its client still
        reads: True once the brokers acknowledged it, ``confirm`` or not (a gone
        client's claims wait out their lease; docs/kafka.md)."""
        partition, _, inbox = reply_to.partition(":")
        if not partition.isdigit() or not inbox:
            return False
        await self._produce(
            "reply",
            self._names.replies,
            body,
            {"rid": request_id, "kind": kind},
            key=inbox.encode(),
            partition=int(partition) % REPLY_PARTITIONS,
        )
        return True

    async def _tell(self, kind: str, body: bytes = b"") -> None:
        await self._produce("announcement", self._names.events, body, {"kind": kind})

    async def announce(self, reign: str) -> None:
        """See :meth:`~.._replicated.Transport.announce`."""
        await self._tell("elected", reign.encode())

    async def warn_full(self) -> None:
        """See :meth:`~.._replicated.Transport.warn_full`."""
        await self._tell("full")

    async def tell_nudges(self, wanted: bool) -> None:
        """See :meth:`~.._replicated.Transport.tell_nudges`."""
        await self._tell("nudge" if wanted else "quiet")

    def blocking(
        self, on_reply: Callable[[str, str, bytes], None], on_elected: Callable[[], None]
    ) -> None:
        """See :meth:`~.._replicated.Transport.blocking`: none yet (the sync face calls
        through its loop thread)."""
        return None

    # -- the election -------------------------------------------------------------------

    async def campaign(self, on_token: Callable[[], None]) -> None:
        """See :meth:`~.._replicated.Transport.campaign`: join the election's consumer
        group (:mod:`._lock`); a member the group later leaves out is deposed, which
        ends this transport as a lost connection does."""
        lock = self._names.lock
        listener = LockListener(lock, on_token, self._lost)
        self._lock = listener
        common = self._common()
        # Its JoinGroup requests wait for the rebalance (JOIN_TIMEOUT_MS).
        common["request_timeout_ms"] = max(common["request_timeout_ms"], JOIN_TIMEOUT_MS)
        consumer = AIOKafkaConsumer(
            **common,
            group_id=lock,
            max_poll_interval_ms=REBALANCE_TIMEOUT_MS,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
            enable_auto_commit=False,
            session_timeout_ms=self._settings.session_timeout_ms,
            heartbeat_interval_ms=HEARTBEAT_MS,
            partition_assignment_strategy=(lock_assignor(lock, lambda: listener.held),),
            # Nothing is ever written to the lock: its fetches only wait.
            fetch_max_wait_ms=LOCK_FETCH_WAIT_MS,
        )
        self._consumers.append(consumer)
        try:
            await consumer.start()
            consumer.subscribe([lock], listener=listener)
        except KafkaError as exc:
            raise ConnectionError(f"could not stand for election: {exc!r}") from exc
        self._spawn(self._follow(consumer, lambda record: None))

    async def renew(self) -> None:
        """See :meth:`~.._replicated.Transport.renew`: nothing to do, the group's
        heartbeats hold the election."""

    # -- the log ------------------------------------------------------------------------

    async def append(self, kind: str, reign: str, body: bytes, mark: str = "") -> None:
        """See :meth:`~.._replicated.Transport.append`: returns once the entry is
        acknowledged and the log, read back up to it, holds no other reign's ``reign``
        entry between this reign's and it (:mod:`._fence`); :class:`~._fence.Deposed`
        when one is there (no replay keeps the entry)."""
        headers = {"kind": kind, "reign": reign}
        if mark:
            headers["mark"] = mark
        offset = await self._produce("log append", self._names.log, body, headers)
        fence = self._fence
        if kind == "reign":
            if fence is not None:
                raise Deposed(f"a second reign ({reign}) began on one connection")
            self._fence = ReignFence(reign, offset)
            consumer = await self._reader([TopicPartition(self._names.log, 0)], offset + 1)

            def take(record: Any) -> None:
                headers = _headers(record)
                assert self._fence is not None
                self._fence.seen(record.offset, headers.get("kind", ""), headers.get("reign", ""))

            self._spawn(self._follow(consumer, take))
            return
        if fence is None or fence.reign != reign:
            raise Deposed(f"an entry of reign {reign}, which this connection did not begin")
        try:
            await within(fence.passed(offset), self._settings.request_timeout)
        except asyncio.TimeoutError:
            raise ConnectionError(
                f"the log was not read back up to offset {offset} in time"
            ) from None
        fence.check(offset)

    async def read_log(self, start: int | None, *, few: bool = False) -> AsyncIterator[LogEntry]:
        """See :meth:`~.._replicated.Transport.read_log`: an offset the log no longer
        holds is out of range, and the reader resets to its first."""
        consumer = await self._reader([TopicPartition(self._names.log, 0)], start, end=False)
        try:
            async for record in self._records(consumer, _FEW if few else _MANY):
                headers = _headers(record)
                yield LogEntry(
                    record.offset,
                    headers.get("kind", ""),
                    headers.get("reign", ""),
                    headers.get("mark", ""),
                    record.value or b"",
                )
        finally:
            await self._drop(consumer)

    @staticmethod
    async def _fetched(fetch: Awaitable[T]) -> T:
        try:
            return await fetch
        except KafkaError as exc:
            raise ConnectionError(f"the Kafka read failed: {exc!r}") from exc

    async def read_pointer(self) -> bytes | None:
        """See :meth:`~.._replicated.Transport.read_pointer`: the pointers' topic
        (compacted, keyed ``pointer``) read from its first record up to a marker
        appended first, since a broker's latest offset may lag what it holds."""
        marker = uuid.uuid4().hex.encode()
        meta = self._names.meta
        await self._produce("marker", meta, marker, {"kind": "marker"}, key=b"marker")
        consumer = await self._reader([TopicPartition(meta, 0)], None, end=False)
        found: bytes | None = None
        try:
            give_up = time.monotonic() + self._settings.request_timeout
            while time.monotonic() < give_up:
                batches = await self._fetched(consumer.getmany(timeout_ms=500))
                for records in batches.values():
                    for record in records:
                        kind = _headers(record).get("kind")
                        if kind == "pointer":
                            found = record.value
                        elif kind == "marker" and record.value == marker:
                            return found
        finally:
            await self._drop(consumer)
        raise ConnectionError("the checkpoint pointer's marker was not read in time")

    async def point(self, body: bytes) -> None:
        """See :meth:`~.._replicated.Transport.point`."""
        await self._produce("pointer", self._names.meta, body, {"kind": "pointer"}, key=b"pointer")

    # -- the intake ----------------------------------------------------------------------

    async def append_intake(self, body: bytes, *, nudge: bool = False) -> None:
        """See :meth:`~.._replicated.Transport.append_intake`: with ``nudge``, a copy
        goes to the requests topic too (op ``puts``), produced alongside."""
        intake = self._produce("intake append", self._names.intake, body, {"kind": "puts"})
        if not nudge:
            await intake
            return
        copy = self._produce("nudge", self._names.requests, body, {"op": "puts"})
        await asyncio.gather(intake, copy)

    async def mark_intake(self, body: bytes) -> None:
        """See :meth:`~.._replicated.Transport.mark_intake`."""
        await self._produce("intake marker", self._names.intake, body, {"kind": "marker"})

    async def tail_intake(
        self,
        start: int | None,
        on_put: Callable[[int, bytes], None],
        on_marker: Callable[[bytes], None],
        on_gap: Callable[[int, int], None],
    ) -> None:
        """See :meth:`~.._replicated.Transport.tail_intake`: a marker appended, then the
        intake read from ``start`` until it comes (and on, until this transport
        closes). Kafka's offsets run on by one a record: a longer step, or a first
        record past ``start``, is what the retention dropped."""
        marker = uuid.uuid4().hex.encode()
        await self.mark_intake(marker)
        consumer = await self._reader([TopicPartition(self._names.intake, 0)], start, end=False)
        reached: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # None: no scheduler of the namespace ever folded a record of the intake, which
        # begins at offset 0; a first record further on follows puts nobody folded.
        expected = 0 if start is None else start

        def take(record: Any) -> None:
            nonlocal expected
            at = record.offset
            if at > expected:
                on_gap(expected, at)
            expected = at + 1
            value = record.value or b""
            if _headers(record).get("kind") == "marker":
                if value == marker:
                    if not reached.done():
                        reached.set_result(None)
                else:
                    on_marker(value)
            else:
                on_put(at, value)

        following = self._spawn(self._follow(consumer, take))
        # However long the backlog (a scheduler down for hours), until the reader ends.
        await asyncio.wait({reached, following}, return_when=asyncio.FIRST_COMPLETED)
        if not reached.done():
            raise ConnectionError("the Kafka clients closed while the intake was read")

    # -- a user's topic -------------------------------------------------------------------

    async def deliver(
        self, exchange: str, routing_key: str, queue: str, record: Record
    ) -> str | None:
        """See :meth:`~.._replicated.Transport.deliver`: ``exchange`` is the user's
        topic, ``routing_key`` the record's key (none when empty); the payload as it
        is, delayq's fields and the message's headers in the record's headers."""
        headers = {str(name): str(value) for name, value in record.headers.items()}
        headers.update(
            {
                "x-delayq-id": record.id,
                "x-delayq-queue": queue,
                "x-delayq-due-at": str(record.due_at),
                "x-delayq-attempt": str(record.attempts),
                "x-delayq-encoding": record.encoding,
            }
        )
        producer = self._producer
        if producer is None:
            return "the Kafka clients are closed"
        try:
            await within(
                producer.send_and_wait(
                    exchange,
                    record.payload,
                    key=routing_key.encode() or None,
                    headers=[(name, text.encode()) for name, text in headers.items()],
                ),
                self._settings.request_timeout,
            )
        except asyncio.TimeoutError:
            return f"not acknowledged in time: topic={exchange} (does it exist?)"
        except KafkaError as exc:
            return f"refused by the broker: topic={exchange}: {exc!r}"
        return None

    async def close(self) -> None:
        """See :meth:`~.._replicated.Transport.close`: every client stopped (a
        candidate leaves the election's group)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.stop()
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()
