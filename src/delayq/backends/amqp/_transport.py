"""RabbitMQ's part of the replicated backend (:class:`~.._replicated.Transport`), on
aiormq: the log is a stream, the election a single-active-consumer quorum queue,
requests go through a direct exchange to the scheduler's exclusive queue and replies
to each client's exclusive inbox (docs/rabbitmq.md, "Broker objects").

One connection per backend object; its channels: ``requests`` (the client's
publishes, neither confirmed nor ``mandatory``: the reply is the receipt), ``inbox``
(replies and announcements), and once a candidate: ``lock`` (the election), ``log``
(appends and checkpoint pointers, confirmed), ``reader`` (the log read back), ``meta``
(the pointers read), ``serve`` (the requests), ``replies`` (confirmed, ``mandatory``:
a reply carrying claimed messages, so that a gone client is seen), ``answers`` (every
other reply, unconfirmed) and ``deliver`` (publishes to a user's exchange, confirmed,
``mandatory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import datetime, timezone
from typing import Any, cast

import aiormq
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage
from pamqp.commands import Basic
from pamqp.common import FieldTable

from ..._log import log_event
from ..._timeout import within
from ...durable.message import Record
from .._replicated import Delivery, LogEntry
from ._blocking import BlockingClient
from ._connect import connect_error, final, quiet_connect_errors
from ._constants import (
    CONTENT_TYPES,
    DEFAULT_REQUEST_TIMEOUT,
    INTAKE_ACK_WITHIN,
    LOCK_ARGUMENTS,
    LOG_PREFETCH,
    LOG_PREFETCH_FEW,
    META_ARGUMENTS,
    RPC_KEY,
    SOON_KEY,
    TOKEN_RETRIES,
    Names,
    intake_arguments,
    log_arguments,
    log_mismatch,
)
from ._url import Settings

__all__ = ["AmqpTransport", "Hosts"]

_TOKEN = b"token"


def _stream_offset(headers: dict[str, Any]) -> int:
    """The offset a stream delivered a message from (its ``x-stream-offset`` header)."""
    return int(headers.get("x-stream-offset", -1))


def _persistent(kind: str, reign: str, mark: str = "") -> Basic.Properties:
    headers: FieldTable = {"v": 1, "reign": reign}
    if mark:
        headers["mark"] = mark
    return Basic.Properties(delivery_mode=2, message_type=kind, headers=headers)


class Hosts:
    """The brokers of one backend object (the URL's list of hosts), tried in turn from
    the last one that took a connection: a node that is down costs a failed connect,
    not the backend. Each connection is named ``delayq <prefix>`` (what RabbitMQ's
    tools list as its ``connection_name``)."""

    def __init__(self, urls: tuple[str, ...], prefix: str) -> None:
        self._urls = urls
        self._first = 0
        self._properties: FieldTable = {"connection_name": f"delayq {prefix}"}
        quiet_connect_errors()

    async def connect(self) -> AbstractConnection:
        """A connection to the first host that takes one; the last host's error when
        none does, at once when no other host can mend it (see :func:`~._connect.final`)."""
        error: BaseException | None = None
        for step in range(len(self._urls)):
            index = (self._first + step) % len(self._urls)
            try:
                connection = await aiormq.connect(
                    self._urls[index], client_properties=self._properties
                )
            except (aiormq.exceptions.AMQPConnectionError, OSError) as exc:
                if final(exc) is not None:
                    raise
                error = exc
                continue
            self._first = index
            return connection
        assert error is not None
        raise error


class AmqpTransport:
    """One AMQP connection of a backend object (see the module's docstring)."""

    def __init__(self, settings: Settings, hosts: Hosts) -> None:
        self._settings = settings
        self._hosts = hosts
        self._names = Names(settings.prefix)
        self._connection: AbstractConnection | None = None
        self._channels: dict[str, AbstractChannel] = {}
        self._inbox = ""
        self._lock_tag: int | None = None
        self._reopening = asyncio.Lock()
        # Work of its own in the background (_background: a channel's close, a late
        # ack of the intake's reader): held until it ends.
        self._closing: set[asyncio.Task[None]] = set()

    def _channel(self, name: str) -> AbstractChannel:
        channel = self._channels.get(name)
        if channel is None:
            raise ConnectionError("the AMQP connection is closed")
        return channel

    @property
    def retention_bytes(self) -> int:
        """See :attr:`~.._replicated.Transport.retention_bytes`."""
        return self._settings.retention_bytes

    @property
    def namespace(self) -> str:
        """See :attr:`~.._replicated.Transport.namespace`."""
        return self._settings.prefix

    async def _open_channel(self, name: str, *, confirms: bool) -> AbstractChannel:
        if self._connection is None:
            raise ConnectionError("the AMQP connection is closed")
        channel = await self._connection.channel(publisher_confirms=confirms)
        self._channels[name] = channel
        return channel

    async def open(
        self,
        on_reply: Callable[[str, str, bytes], None],
        on_elected: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        """See :meth:`~.._replicated.Transport.open`."""
        try:
            await self._open(on_reply, on_elected, on_lost)
        except (
            aiormq.exceptions.AMQPError,
            aiormq.exceptions.ChannelInvalidStateError,
            OSError,
        ) as exc:
            await self.close()
            said = connect_error(self._settings.url, self._settings.broker_urls, exc)
            raise (said or ConnectionError(f"could not open the AMQP connection: {exc!r}")) from exc
        except ValueError:
            await self.close()
            raise

    async def _open(
        self,
        on_reply: Callable[[str, str, bytes], None],
        on_elected: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        self._connection = await self._hosts.connect()
        self._connection.closing.add_done_callback(lambda _: on_lost())
        requests = await self._open_channel("requests", confirms=False)
        names = self._names
        await requests.exchange_declare(names.rpc, exchange_type="direct", durable=True)
        await requests.exchange_declare(names.events, exchange_type="fanout", durable=True)
        await self._declare_log(requests)
        await requests.queue_declare(names.meta, durable=True, arguments=META_ARGUMENTS)
        await requests.queue_declare(
            names.intake, durable=True, arguments=intake_arguments(self._settings.retention_bytes)
        )
        await requests.queue_bind(names.intake, names.rpc, routing_key=SOON_KEY)
        inbox = await self._open_channel("inbox", confirms=False)
        declared = await inbox.queue_declare(
            "", exclusive=True, auto_delete=True, arguments={"x-queue-type": "classic"}
        )
        self._inbox = declared.queue or ""
        await inbox.queue_bind(self._inbox, names.events, routing_key="")

        async def deliver(message: DeliveredMessage) -> None:
            properties = message.header.properties
            if properties.message_type == "elected":
                on_elected()
            else:
                on_reply(
                    properties.correlation_id or "", properties.message_type or "", message.body
                )

        await inbox.basic_consume(self._inbox, deliver, no_ack=True)

    async def _declare_log(self, channel: AbstractChannel) -> None:
        retention = self._settings.retention_bytes
        try:
            await channel.queue_declare(
                self._names.log, durable=True, arguments=log_arguments(retention)
            )
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            # The broker closed the channel: the next declare opens another.
            self._channels.pop("requests", None)
            said = str(exc.args[-1] if exc.args else exc)
            raise log_mismatch(self._names.log, retention, said) from None

    async def candidates(self) -> int:
        """See :meth:`~.._replicated.Transport.candidates`: the consumers of the lock
        queue (every candidate consumes it; the broker makes one of them active), by a
        passive declare on a channel of its own (a lock never declared, which closes
        the channel: none)."""
        try:
            channel = await self._open_channel("probe", confirms=False)
            try:
                declared = await channel.queue_declare(self._names.lock, passive=True)
            finally:
                self._unsubscribe_soon("probe", channel)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return 0
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
            raise ConnectionError(f"could not count the candidates: {exc!r}") from exc
        return declared.consumer_count or 0

    async def request(self, op: str, request_id: str, body: bytes, ttl_ms: int | None) -> None:
        """See :meth:`~.._replicated.Transport.request`."""
        properties = Basic.Properties(
            reply_to=self._inbox,
            correlation_id=request_id,
            message_id=request_id,
            message_type=op,
            expiration=None if ttl_ms is None else str(ttl_ms),
        )
        # Neither confirmed nor mandatory: the reply is the request's receipt. One that
        # no scheduler took (none bound, or its queue went with its connection) is
        # dropped by the broker, and its caller resends it when a scheduler announces
        # itself, or fails after its timeout (NoScheduler).
        await self._sent(
            "request",
            self._channel("requests").basic_publish(
                body, exchange=self._names.rpc, routing_key=RPC_KEY, properties=properties
            ),
        )

    async def _sent(self, what: str, publish: Awaitable[Any]) -> None:
        """Await a client's ``publish``; a ConnectionError when the broker or the
        connection failed it."""
        try:
            await publish
        except asyncio.CancelledError:
            # A channel closed under a publish cancels what the publish awaits: when this
            # transport was closed (not the caller's task cancelled), say so.
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", None)  # Python 3.11+
            if self._connection is None and (cancelling is None or not cancelling()):
                raise ConnectionError(f"the AMQP connection closed during the {what}") from None
            raise
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
            raise ConnectionError(f"the AMQP {what} failed: {exc!r}") from exc

    async def campaign(self, on_token: Callable[[], None]) -> None:
        """See :meth:`~.._replicated.Transport.campaign`."""
        try:
            await self._campaign(on_token)
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
            raise ConnectionError(f"could not stand for election: {exc!r}") from exc

    async def _campaign(self, on_token: Callable[[], None]) -> None:
        lock = await self._open_channel("lock", confirms=True)
        await self._open_channel("log", confirms=True)
        await self._open_channel("replies", confirms=True)
        await self._open_channel("answers", confirms=False)
        await lock.basic_qos(prefetch_count=1)
        declared = await lock.queue_declare(
            self._names.lock, durable=True, arguments=LOCK_ARGUMENTS
        )
        if not declared.message_count and not declared.consumer_count:
            # No token waits and nobody holds one: put one in. Two candidates racing
            # here put two, which is harmless (the broker, not the token, picks the
            # active consumer; the token only tells it that it is).
            await self._put_token(lock)

        async def token(message: DeliveredMessage) -> None:
            first = self._lock_tag is None
            self._lock_tag = message.delivery_tag
            if first:
                on_token()

        await lock.basic_consume(self._names.lock, token)
        self._watch("lock", lock)

    async def _put_token(self, lock: AbstractChannel) -> None:
        # A quorum queue declared a moment ago by several candidates at once may nack
        # a publish while its replicas are still starting: try again, briefly.
        for pause in TOKEN_RETRIES:
            try:
                await lock.basic_publish(
                    _TOKEN,
                    routing_key=self._names.lock,
                    properties=Basic.Properties(delivery_mode=2),
                )
                return
            except aiormq.exceptions.DeliveryError:
                await asyncio.sleep(pause)
        raise ConnectionError(f"RabbitMQ refused the election token of {self._names.lock}")

    async def renew(self) -> None:
        """See :meth:`~.._replicated.Transport.renew`: a new token in, the held one acked
        (the active consumer stays active and receives the new one)."""
        lock = self._channel("lock")
        held = self._lock_tag
        await self._put_token(lock)
        if held is not None:
            await lock.basic_ack(held)

    async def append(self, kind: str, reign: str, body: bytes, mark: str = "") -> None:
        """See :meth:`~.._replicated.Transport.append`."""
        try:
            await self._channel("log").basic_publish(
                body, routing_key=self._names.log, properties=_persistent(kind, reign, mark)
            )
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
            raise ConnectionError(f"the log append was not confirmed: {exc!r}") from exc

    async def read_log(self, start: int | None, *, few: bool = False) -> AsyncIterator[LogEntry]:
        """See :meth:`~.._replicated.Transport.read_log`."""
        offset: int | str = "first" if start is None else start
        prefetch = LOG_PREFETCH_FEW if few else LOG_PREFETCH
        channel, arrived = await self._subscribe(self._names.log, offset, "reader", prefetch)
        unacked = 0
        try:
            while True:
                message = await arrived.get()
                unacked += 1
                if unacked >= prefetch // 2 or arrived.empty():
                    await channel.basic_ack(message.delivery_tag or 0, multiple=True)
                    unacked = 0
                properties = message.header.properties
                headers: dict[str, Any] = dict(properties.headers or {})
                yield LogEntry(
                    _stream_offset(headers),
                    properties.message_type or "",
                    str(headers.get("reign", "")),
                    str(headers.get("mark", "")),
                    message.body,
                )
        finally:
            # Closed in a task of its own: a read cancelled (a timed-out locate, its
            # scheduler stopping) must not await, and its consumer must not stay on
            # the stream, taking deliveries no one reads.
            self._unsubscribe_soon("reader", channel)

    async def _subscribe(
        self, queue: str, offset: int | str, name: str, prefetch: int
    ) -> tuple[AbstractChannel, asyncio.Queue[DeliveredMessage]]:
        """Consume the stream ``queue`` from ``offset`` on a channel of its own (acked
        by the reader: a stream consumer must ack to get more). Shielded: a caller that
        gives up (a timed-out locate) leaves it to finish and be closed, as a channel
        cut between its calls could stay open with no one to close it."""
        subscribing = asyncio.ensure_future(self._consume(queue, offset, name, prefetch))
        try:
            return await asyncio.shield(subscribing)
        except asyncio.CancelledError:
            subscribing.add_done_callback(lambda done: self._abandoned(name, done))
            raise

    def _abandoned(
        self,
        name: str,
        done: asyncio.Future[tuple[AbstractChannel, asyncio.Queue[DeliveredMessage]]],
    ) -> None:
        if not done.cancelled() and done.exception() is None:
            self._unsubscribe_soon(name, done.result()[0])

    async def _consume(
        self, queue: str, offset: int | str, name: str, prefetch: int
    ) -> tuple[AbstractChannel, asyncio.Queue[DeliveredMessage]]:
        channel = await self._open_channel(name, confirms=False)
        arrived: asyncio.Queue[DeliveredMessage] = asyncio.Queue()
        await channel.basic_qos(prefetch_count=prefetch)
        await channel.basic_consume(queue, arrived.put, arguments={"x-stream-offset": offset})
        return channel, arrived

    def _unsubscribe_soon(self, name: str, channel: AbstractChannel) -> None:
        if self._channels.get(name) is channel:
            del self._channels[name]
        self._background(self._quietly(channel.close()))

    async def append_intake(self, body: bytes, *, nudge: bool = False) -> None:
        """See :meth:`~.._replicated.Transport.append_intake`: persistent, on a confirm
        channel of its own (opened on the first fast put); with ``nudge``, through the
        requests' exchange, whose key ``soon`` routes it to the intake and to the
        scheduler's requests (confirmed once both have it)."""
        await self._sent("intake append", self._publish_intake(body, nudge))

    async def _publish_intake(self, body: bytes, nudge: bool) -> None:
        # aiormq's Channel (what a connection opens) takes ``wait``; its abstract one
        # does not say so.
        channel = cast("aiormq.Channel", await self._confirm_channel("intake"))
        names = self._names
        # wait=False: awaits the confirm only, not also the writer's turn that puts the
        # frames on the socket first (one loop turn less a put; the write queue keeps
        # the order, and a write that fails fails the confirm).
        await channel.basic_publish(
            body,
            exchange=names.rpc if nudge else "",
            routing_key=SOON_KEY if nudge else names.intake,
            properties=Basic.Properties(delivery_mode=2, message_type="puts"),
            wait=False,
        )

    def blocking(
        self, on_reply: Callable[[str, str, bytes], None], on_elected: Callable[[], None]
    ) -> BlockingClient:
        """See :meth:`~.._replicated.Transport.blocking`."""
        return BlockingClient(self._settings, self._names, on_reply, on_elected)

    async def tail_intake(
        self,
        start: int | None,
        on_put: Callable[[int, bytes], None],
        on_marker: Callable[[bytes], None],
        on_gap: Callable[[int, int], None],
    ) -> None:
        """See :meth:`~.._replicated.Transport.tail_intake`: a stream consumer on a
        channel of its own, acked every half prefetch (a stream consumer must ack to
        get more; it never redelivers). A stream says nothing of where it ends, so a
        marker is appended and the call returns once it is read.

        Offsets run on by one a message, and by two where a segment opens (an entry
        of the broker's own): a longer step is what the retention dropped. Asked for
        an offset it dropped, RabbitMQ starts further on than its first message, so
        the intake's first offset is looked up first and read from there."""
        marker = uuid.uuid4().hex.encode()
        await self.mark_intake(marker)  # so the intake is not empty
        # None: no scheduler of the namespace ever folded a message of the intake, which
        # begins at offset 0; one that begins further on dropped puts nobody folded.
        offset = 0 if start is None else start
        first = await self._first_offset(self._names.intake)
        if first > offset + 1:
            on_gap(offset, first)
            offset = first
        channel = await self._open_channel("tail", confirms=False)
        await channel.basic_qos(prefetch_count=LOG_PREFETCH)
        loop = asyncio.get_running_loop()
        reached: asyncio.Future[None] = loop.create_future()
        unacked = 0
        last_tag = 0
        acking: asyncio.TimerHandle | None = None
        expected = offset  # the next offset

        async def ack() -> None:
            nonlocal unacked, acking
            if acking is not None:
                acking.cancel()
                acking = None
            if unacked and not channel.is_closed:
                unacked = 0
                await channel.basic_ack(last_tag, multiple=True)

        def ack_late() -> None:
            # A delivery left unacknowledged for the broker's consumer_timeout (30
            # min by default) closes the channel: the intake's messages come a few a
            # minute when it holds only markers, so acks go out within a second too,
            # not only every half prefetch.
            nonlocal acking
            acking = None
            self._background(self._quietly(ack()))

        async def deliver(message: DeliveredMessage) -> None:
            nonlocal unacked, expected, last_tag, acking
            properties = message.header.properties
            headers: dict[str, Any] = dict(properties.headers or {})
            at = _stream_offset(headers)
            if at > expected + 1:
                on_gap(expected, at)  # dropped while this consumer was behind
            expected = max(at + 1, expected)
            if properties.message_type == "marker":
                if message.body == marker:
                    if not reached.done():
                        reached.set_result(None)
                else:
                    on_marker(message.body)
            else:
                on_put(at, message.body)
            unacked += 1
            last_tag = message.delivery_tag or 0
            if unacked >= LOG_PREFETCH // 2:
                await ack()
            elif acking is None:
                acking = loop.call_later(INTAKE_ACK_WITHIN, ack_late)

        try:
            await channel.basic_consume(
                self._names.intake, deliver, arguments={"x-stream-offset": offset}
            )
            # However long the backlog (a scheduler down for hours), until the channel
            # closes.
            either: set[asyncio.Future[Any]] = {reached, channel.closing}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except aiormq.exceptions.AMQPError as exc:
            raise ConnectionError(f"could not read the intake to its end: {exc!r}") from exc
        if not reached.done():
            raise ConnectionError("the connection closed while the intake was read")
        self._watch("tail", channel)

    def _watch(self, name: str, channel: AbstractChannel) -> None:
        """The channel ``name`` must live as long as the connection (the election's
        consumer, the intake's reader): one the broker closes under it (an error of the
        broker's, such as a consumer_timeout) takes the connection down with it, so
        that the lost-connection path takes over (the scheduler steps down and stands
        again), rather than serving on while it no longer holds the election or
        nothing folds the intake."""

        def closed(done: asyncio.Future[Any]) -> None:
            why = None if done.cancelled() else done.exception()
            connection = self._connection
            if (
                connection is None
                or connection.is_closed
                or self._channels.get(name) is not channel
            ):
                return  # closed with the connection, or by the transport's own close
            log_event(logging.WARNING, "channel_closed_by_broker", channel=name, error=repr(why))
            self._background(self._quietly(connection.close()))

        channel.closing.add_done_callback(closed)

    def _background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _quietly(coro: Coroutine[Any, Any, Any]) -> None:
        with contextlib.suppress(Exception):
            await coro

    async def _first_offset(self, stream: str) -> int:
        """The offset of the first message ``stream`` holds (it holds one at least)."""
        channel, arrived = await self._subscribe(stream, "first", "peek", 1)
        try:
            message = await within(arrived.get(), DEFAULT_REQUEST_TIMEOUT)
        except asyncio.TimeoutError:
            raise ConnectionError(f"no message read from {stream} in time") from None
        finally:
            self._unsubscribe_soon("peek", channel)
        return _stream_offset(dict(message.header.properties.headers or {}))

    async def mark_intake(self, body: bytes) -> None:
        """See :meth:`~.._replicated.Transport.mark_intake`."""
        await self._channel("log").basic_publish(
            body,
            routing_key=self._names.intake,
            properties=Basic.Properties(delivery_mode=2, message_type="marker"),
        )

    async def warn_full(self) -> None:
        """See :meth:`~.._replicated.Transport.warn_full`."""
        await self._tell("full")

    async def _tell(self, kind: str) -> None:
        """Publish an announcement of ``kind`` (no body) to every client's inbox."""
        await self._channel("replies").basic_publish(
            b"", exchange=self._names.events, properties=Basic.Properties(message_type=kind)
        )

    async def tell_nudges(self, wanted: bool) -> None:
        """See :meth:`~.._replicated.Transport.tell_nudges`."""
        await self._tell("nudge" if wanted else "quiet")

    async def read_pointer(self) -> bytes | None:
        """See :meth:`~.._replicated.Transport.read_pointer`: read the meta stream from
        its last chunk, publish a marker and read up to it (a stream says nothing of
        where it ends); the last pointer before the marker is the one. A marker in the
        last chunk with no pointer before it (a scheduler that died between its marker
        and its pointer) finds none: the caller then looks in the log itself."""
        marker = uuid.uuid4().hex.encode()
        found: bytes | None = None
        channel, arrived = await self._subscribe(self._names.meta, "last", "meta", LOG_PREFETCH)
        try:
            await self._channel("log").basic_publish(
                marker,
                routing_key=self._names.meta,
                properties=Basic.Properties(delivery_mode=2, message_type="marker"),
            )
            while True:
                message = await within(arrived.get(), DEFAULT_REQUEST_TIMEOUT)
                await channel.basic_ack(message.delivery_tag or 0)
                kind = message.header.properties.message_type
                if kind == "pointer":
                    found = message.body
                elif kind == "marker" and message.body == marker:
                    return found
        except (aiormq.exceptions.AMQPError, asyncio.TimeoutError) as exc:
            raise ConnectionError(f"could not read the checkpoint pointer: {exc!r}") from exc
        finally:
            self._unsubscribe_soon("meta", channel)

    async def point(self, body: bytes) -> None:
        """See :meth:`~.._replicated.Transport.point`."""
        try:
            await self._channel("log").basic_publish(
                body,
                routing_key=self._names.meta,
                properties=Basic.Properties(delivery_mode=2, message_type="pointer"),
            )
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError) as exc:
            raise ConnectionError(f"the checkpoint pointer was not confirmed: {exc!r}") from exc

    async def serve(self, on_request: Callable[[Delivery], None]) -> None:
        """See :meth:`~.._replicated.Transport.serve`."""
        channel = await self._open_channel("serve", confirms=False)
        declared = await channel.queue_declare(
            "", exclusive=True, auto_delete=True, arguments={"x-queue-type": "classic"}
        )
        queue = declared.queue or ""
        await channel.queue_bind(queue, self._names.rpc, routing_key=RPC_KEY)
        await channel.queue_bind(queue, self._names.rpc, routing_key=SOON_KEY)

        def take(message: DeliveredMessage) -> None:
            properties = message.header.properties
            on_request(
                Delivery(
                    properties.message_type or "",
                    properties.correlation_id or "",
                    properties.reply_to or "",
                    message.body,
                )
            )

        async def deliver(message: DeliveredMessage) -> None:
            take(message)

        await channel.basic_consume(queue, deliver, no_ack=True)

    async def reply(
        self, reply_to: str, request_id: str, kind: str, body: bytes, *, confirm: bool
    ) -> bool:
        """See :meth:`~.._replicated.Transport.reply`: with ``confirm``, ``mandatory`` on a
        confirm channel (a gone client's inbox returns it); without, on a plain one."""
        properties = Basic.Properties(correlation_id=request_id, message_type=kind)
        if not confirm:
            await self._channel("answers").basic_publish(
                body, routing_key=reply_to, properties=properties
            )
            return True
        try:
            await self._channel("replies").basic_publish(
                body, routing_key=reply_to, properties=properties, mandatory=True
            )
        except aiormq.exceptions.DeliveryError:
            return False  # returned, or nacked: its inbox went with its connection
        return True

    async def deliver(
        self, exchange: str, routing_key: str, queue: str, record: Record
    ) -> str | None:
        """See :meth:`~.._replicated.Transport.deliver`."""
        headers: FieldTable = dict(record.headers)
        headers.update(
            {
                "x-delayq-queue": queue,
                "x-delayq-due-at": record.due_at,
                "x-delayq-attempt": record.attempts,
            }
        )
        properties = Basic.Properties(
            message_id=record.id,
            delivery_mode=2,
            timestamp=datetime.fromtimestamp(record.due_at // 1000, timezone.utc),
            content_type=CONTENT_TYPES.get(
                record.encoding, f"application/x-delayq-{record.encoding}"
            ),
            headers=headers,
        )
        where = f"exchange={exchange} routing_key={routing_key}"
        try:
            channel = await self._confirm_channel("deliver")
            await channel.basic_publish(
                record.payload,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=True,
            )
        except aiormq.exceptions.PublishError:
            return f"unroutable: {where}"
        except aiormq.exceptions.DeliveryError:
            return f"refused by the broker: {where}"
        except aiormq.exceptions.ChannelClosed as exc:
            # The broker closes the channel of a publish to a missing exchange (404):
            # the next publish opens another.
            return f"refused by the broker: {where}: {exc}"
        return None

    async def _confirm_channel(self, name: str) -> AbstractChannel:
        """The confirm channel ``name``, opened on first use (and again once the broker
        closed it)."""
        channel = self._channels.get(name)
        if channel is None or channel.is_closed:
            async with self._reopening:
                channel = self._channels.get(name)
                if channel is None or channel.is_closed:
                    channel = await self._open_channel(name, confirms=True)
        return channel

    async def announce(self, reign: str) -> None:
        """See :meth:`~.._replicated.Transport.announce`."""
        await self._channel("replies").basic_publish(
            reign.encode(),
            exchange=self._names.events,
            properties=Basic.Properties(message_type="elected"),
        )

    async def close(self) -> None:
        """See :meth:`~.._replicated.Transport.close`."""
        connection, self._connection = self._connection, None
        self._channels.clear()
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
