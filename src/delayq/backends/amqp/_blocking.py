"""The sync face's connection (:class:`~.._replicated.BlockingTransport`): one AMQP
connection on a plain socket (a :class:`~._wire.Wire`, whose frames pamqp makes and
reads), driven from the callers' threads. A call publishes its request from its own
thread and waits there for the reply; a fast put publishes to the intake and waits for
the broker's confirm. The threads of a backend object share the connection and take
turns on its socket: one reads at a time (the others wait on a condition), hands every
reply and confirm it read to whom it is for, and leaves the reading to the next thread
still waiting once its own has come.

Why not the loop thread: a hop there and back costs two thread wake-ups per call, and
aiormq's own cost per publish against pamqp's frames on a plain socket (docs/rabbitmq.md,
"Client library").

Its channels: ``requests`` (publishes, neither confirmed nor ``mandatory``: the reply
is the receipt), ``inbox`` (an exclusive queue bound to the announcements, consumed
without acks), ``intake`` (confirmed) and ``probe`` (who stands for election: a
passive declare of the lock queue, which closes it when there is none). Each
connection declares the namespace's objects as it opens, as the backend object's
loop connection does (the same arguments: a no-op once they exist), so that a backend
object whose calls all go this way never needs the other. A connection that fails is
said as the loop's says it (:func:`~._connect.connect_error`). The connection asks for
no heartbeats (nothing of it runs between two calls); the kernel's keepalive watches
it instead, and each wait is bounded by the caller's deadline.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pamqp import commands

from ._connect import connect_error
from ._constants import (
    META_ARGUMENTS,
    RPC_KEY,
    SOON_KEY,
    Names,
    intake_arguments,
    log_arguments,
    log_mismatch,
)
from ._url import Settings
from ._wire import (
    BrokerClosed,
    ChannelClosed,
    Confirmed,
    ConnectionClosed,
    Delivered,
    Event,
    Method,
    Opened,
    Wire,
)

__all__ = ["BlockingClient"]

_REQUESTS, _INBOX, _INTAKE, _PROBE = 1, 2, 3, 4
#: The reply codes of a queue that does not exist, and of a declare whose arguments
#: differ from the queue's.
_NOT_FOUND, _PRECONDITION_FAILED = 404, 406
_PUTS = commands.Basic.Properties(delivery_mode=2, message_type="puts")
#: The shortest wait of a read, in seconds (its socket timeout also bounds a write).
_MIN_WAIT = 0.01


class _Broker:
    """Where and as whom to connect: one host of the URL's list, parsed as aiormq does."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme.lower() == "amqps"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (5671 if self.tls else 5672)
        self.user = unquote(parts.username or "guest")
        self.password = unquote(parts.password or "guest")
        path = parts.path
        self.vhost = "/" if path in ("", "/") else unquote(path[1:])
        self.query = dict(parse_qsl(parts.query, keep_blank_values=True))

    def context(self) -> ssl.SSLContext:
        """The TLS context of an ``amqps://`` host, from the URL's TLS parameters."""
        query = self.query
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=query.get("cafile"), capath=query.get("capath")
        )
        if query.get("certfile"):
            context.load_cert_chain(query["certfile"], query.get("keyfile"))
        if query.get("no_verify_ssl", "0") != "0":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


class _Connection:
    """One open connection with its three channels: a :class:`~._wire.Wire` on a plain
    socket. Writes go under a lock (a publish's frames are one run on the socket, and
    the confirm numbers follow the order the broker reads them in); reads are made by
    one thread at a time (:class:`BlockingClient`'s turn). ``lost`` once it failed."""

    def __init__(
        self, broker: _Broker, name: str, names: Names, retention_bytes: int, deadline: float
    ) -> None:
        self._wire = Wire(broker.user, broker.password, broker.vhost, name=name)
        self._lock = threading.Lock()
        self.lost = False
        #: Whether the probe channel is open, and the count of its last declare (None:
        #: not come yet).
        self.probe_open = False
        self.counted: int | None = None
        #: Events read during the handshake that were not its own (an announcement
        #: right behind the ConsumeOk): handed out by the first read.
        self._early: list[Event] = []
        #: The intake publishes the broker confirmed (True) or refused (False).
        self.settled: dict[int, bool] = {}
        self._sock = self._connect(broker, deadline)
        self._poller = select.poll()
        self._poller.register(self._sock, select.POLLIN)
        try:
            self.inbox = self._handshake(names, retention_bytes, deadline)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _connect(broker: _Broker, deadline: float) -> socket.socket:
        # A TLS file that cannot be read is said before connecting, as aiormq does.
        context = broker.context() if broker.tls else None
        sock = socket.create_connection(
            (broker.host, broker.port), timeout=max(deadline - time.monotonic(), 0.001)
        )
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=broker.host)
        except BaseException:
            sock.close()
            raise
        return sock

    def _handshake(self, names: Names, retention_bytes: int, deadline: float) -> str:
        """Open the channels, declare the namespace's objects and consume the inbox; its
        name. The steps that need no answer of the one before leave together (three
        round trips after the connection's own, not eight: a slow link pays each)."""
        wire = self._wire
        events = names.events
        self._until(lambda event: isinstance(event, Opened), deadline)
        for channel in (_REQUESTS, _INBOX, _INTAKE):
            wire.send(channel, commands.Channel.Open())
        for channel in (_REQUESTS, _INBOX, _INTAKE):
            self._until(_replied(commands.Channel.OpenOk, channel), deadline)
        wire.send(_INTAKE, commands.Confirm.Select())
        # Declared as the backend object's loop connection declares them (the same
        # arguments: a no-op once they exist), in order on one channel (a bind after
        # the declares it needs).
        declares = [
            commands.Exchange.Declare(exchange=names.rpc, exchange_type="direct", durable=True),
            commands.Queue.Declare(
                queue=names.log, durable=True, arguments=log_arguments(retention_bytes)
            ),
            commands.Queue.Declare(queue=names.meta, durable=True, arguments=META_ARGUMENTS),
            commands.Queue.Declare(
                queue=names.intake, durable=True, arguments=intake_arguments(retention_bytes)
            ),
            commands.Queue.Bind(queue=names.intake, exchange=names.rpc, routing_key=SOON_KEY),
        ]
        for method in declares:
            wire.send(_REQUESTS, method)
        wire.send(
            _INBOX, commands.Exchange.Declare(exchange=events, exchange_type="fanout", durable=True)
        )
        wire.send(
            _INBOX,
            commands.Queue.Declare(
                queue="", exclusive=True, auto_delete=True, arguments={"x-queue-type": "classic"}
            ),
        )
        self._until(_replied(commands.Confirm.SelectOk, _INTAKE), deadline)
        try:
            self._until(_replied(commands.Queue.BindOk, _REQUESTS), deadline)
        except BrokerClosed as exc:
            if exc.reply_code == _PRECONDITION_FAILED and names.log in exc.reply_text:
                raise log_mismatch(names.log, retention_bytes, exc.reply_text) from None
            raise
        self._until(_replied(commands.Exchange.DeclareOk, _INBOX), deadline)
        declared = self._until(_replied(commands.Queue.DeclareOk, _INBOX), deadline)
        assert isinstance(declared, Method)
        inbox: str = declared.method.queue
        wire.send(_INBOX, commands.Queue.Bind(queue=inbox, exchange=events))
        wire.send(_INBOX, commands.Basic.Consume(queue=inbox, no_ack=True))
        self._until(_replied(commands.Queue.BindOk, _INBOX), deadline)
        self._until(_replied(commands.Basic.ConsumeOk, _INBOX), deadline)
        return inbox

    def _until(self, wanted: Callable[[Event], bool], deadline: float) -> Event:
        """Send what the wire has queued, then read until an event is ``wanted`` (the
        handshake's own steps, on this thread alone); the others read meanwhile are
        kept, in order, for the next read."""
        self._flush()
        skipped: list[Event] = []
        try:
            while True:
                events = self.read(_left(deadline))
                for index, event in enumerate(events):
                    if wanted(event):
                        skipped += events[index + 1 :]
                        return event
                    skipped.append(event)
        finally:
            self._early[:0] = skipped

    def publish(self, channel: int, exchange: str, key: str, body: bytes, properties: Any) -> int:
        """Publish ``body`` (its confirm number on the intake channel, else 0)."""
        with self._lock:
            wire = self._wire
            tag = wire.publish(channel, exchange, key, body, properties)
            self._sock.sendall(wire.data_to_send())
        return tag

    def send(self, channel: int, *methods: Any) -> None:
        """Send ``methods`` (pamqp's) on ``channel``, as one run on the socket."""
        with self._lock:
            for method in methods:
                self._wire.send(channel, method)
            self._flush_locked()

    def _flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        data = self._wire.data_to_send()
        if data:
            self._sock.sendall(data)

    def ready(self) -> bool:
        """Whether something came that :meth:`read` would return at once."""
        sock = self._sock
        return bool(
            self._early
            or (isinstance(sock, ssl.SSLSocket) and sock.pending())
            or self._poller.poll(0)
        )

    def read(self, timeout: float) -> list[Event]:
        """The events of what came within ``timeout`` seconds (none: nothing came);
        ConnectionError when the broker closed the channel or the connection."""
        if self._early:
            early, self._early = self._early, []
            return early
        sock = self._sock
        # The timeout bounds a concurrent write too: never below _MIN_WAIT.
        sock.settimeout(max(timeout, _MIN_WAIT))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return []
        with self._lock:
            wire = self._wire
            events = wire.receive(data)
            out = wire.data_to_send()  # a CloseOk the wire queued
            if out:
                sock.sendall(out)
        for event in events:
            if isinstance(event, Confirmed) and event.channel == _INTAKE:
                self.settled[event.delivery_tag] = event.ack  # one publish in flight
            elif isinstance(event, (Method, ChannelClosed)) and event.channel == _PROBE:
                self._probed(event)
            elif isinstance(event, ChannelClosed):
                raise BrokerClosed(event.reply_code, event.reply_text, connection=False)
            elif isinstance(event, ConnectionClosed):
                raise BrokerClosed(event.reply_code, event.reply_text, connection=True)
        return events

    def _probed(self, event: Method | ChannelClosed) -> None:
        """The probe channel's answer: the lock queue's consumers (its DeclareOk), or
        none when it does not exist (its close, NOT_FOUND)."""
        if isinstance(event, ChannelClosed):
            self.probe_open = False
            if event.reply_code != _NOT_FOUND:
                raise BrokerClosed(event.reply_code, event.reply_text, connection=False)
            self.counted = 0
        elif isinstance(event.method, commands.Queue.DeclareOk):
            self.counted = event.method.consumer_count or 0

    def close(self) -> None:
        """Drop the socket (no close handshake: the broker closes its side); a thread
        reading it wakes."""
        self.lost = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _replied(kind: type[Any], channel: int) -> Callable[[Event], bool]:
    """Whether an event is the broker's method ``kind`` on ``channel``."""
    return lambda event: (
        isinstance(event, Method) and event.channel == channel and isinstance(event.method, kind)
    )


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no answer from the broker in time")
    return left


class BlockingClient:
    """See :class:`~.._replicated.BlockingTransport`: ``settings``' namespace (``names``:
    its intake, requests' exchange and announcements' exchange) on a connection of its
    own, opened on first use (to the URL's hosts in turn, from the last one that took
    it) and again after one failed. ``on_reply`` and ``on_elected`` are called by the
    thread reading, its turn held."""

    def __init__(
        self,
        settings: Settings,
        names: Names,
        on_reply: Callable[[str, str, bytes], None],
        on_elected: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._brokers = [_Broker(url) for url in settings.broker_urls]
        self._first = 0
        self._name = f"delayq {settings.prefix} sync"
        self._names = names
        self._intake, self._rpc = names.intake, names.rpc
        self._probing = threading.Lock()
        self._on_reply = on_reply
        self._on_elected = on_elected
        self._connection: _Connection | None = None
        self._opened = 0
        self._opening = threading.Lock()
        #: Guards the turn to read (taken as itself: one call less than the
        #: condition's); the threads waiting for it wait on ``_turn``.
        self._turn_lock = threading.Lock()
        self._turn = threading.Condition(self._turn_lock)
        self._reading = False
        #: How many threads wait for their turn (none: no one to wake).
        self._waiting = 0

    def connect(self, deadline: float) -> None:
        """See :meth:`~.._replicated.BlockingTransport.connect`."""
        self._connected(deadline)

    def _connected(self, deadline: float) -> _Connection:
        connection = self._connection
        if connection is not None and not connection.lost:
            return connection
        with self._opening:
            connection = self._connection
            if connection is not None and not connection.lost:
                return connection
            error: BaseException | None = None
            for step in range(len(self._brokers)):
                index = (self._first + step) % len(self._brokers)
                try:
                    connection = _Connection(
                        self._brokers[index],
                        self._name,
                        self._names,
                        self._settings.retention_bytes,
                        deadline,
                    )
                except (ConnectionError, OSError) as exc:
                    error = exc
                    if isinstance(exc, TimeoutError):
                        break  # the deadline passed
                    continue
                self._first = index
                self._connection = connection
                self._opened += 1
                return connection
            assert error is not None
            if not isinstance(error, TimeoutError):  # said by the caller, who knows how long
                said = connect_error(self._settings.url, self._settings.broker_urls, error)
                if said is not None:
                    raise said from error
            raise error

    @property
    def opened(self) -> int:
        """See :attr:`~.._replicated.BlockingTransport.opened`."""
        return self._opened

    def candidates(self, deadline: float) -> int:
        """See :meth:`~.._replicated.BlockingTransport.candidates`: the consumers of the
        lock queue, by a passive declare on the probe channel (kept open for the next;
        the broker closes it when the lock was never declared: none)."""
        connection = self._connected(deadline)
        try:
            with self._probing:
                connection.counted = None
                opening = [] if connection.probe_open else [commands.Channel.Open()]
                connection.probe_open = True
                declare = commands.Queue.Declare(queue=self._names.lock, passive=True)
                connection.send(_PROBE, *opening, declare)
            self.wait(lambda: connection.counted is not None, deadline, connection)
        except BaseException:
            self._drop(connection)
            raise
        if connection.counted is None:
            self._drop(connection)
            raise TimeoutError("the broker did not say who stands in time")
        return connection.counted

    def request(
        self, op: str, request_id: str, body: bytes, ttl_ms: int | None, deadline: float
    ) -> None:
        """See :meth:`~.._replicated.BlockingTransport.request`."""
        connection = self._connected(deadline)
        properties = commands.Basic.Properties(
            reply_to=connection.inbox,
            correlation_id=request_id,
            message_id=request_id,
            message_type=op,
            expiration=None if ttl_ms is None else str(ttl_ms),
        )
        try:
            connection.publish(_REQUESTS, self._rpc, RPC_KEY, body, properties)
        except BaseException:
            self._drop(connection)
            raise

    def append(self, body: bytes, *, nudge: bool, deadline: float) -> None:
        """See :meth:`~.._replicated.BlockingTransport.append`."""
        connection = self._connected(deadline)
        exchange, key = (self._rpc, SOON_KEY) if nudge else ("", self._intake)
        try:
            tag = connection.publish(_INTAKE, exchange, key, body, _PUTS)
            self.wait(lambda: tag in connection.settled, deadline, connection)
            if tag not in connection.settled:
                raise TimeoutError("no confirm from the intake in time")
            if not connection.settled.pop(tag):
                raise ConnectionError("the broker refused the intake append (a nack)")
        except BaseException:
            self._drop(connection)  # its state is unknown: the next call opens another
            raise

    def wait(self, done: Callable[[], bool], until: float, connection: Any = None) -> None:
        """See :meth:`~.._replicated.BlockingTransport.wait`."""
        connection = connection or self._connection
        if connection is None:
            raise ConnectionError("the AMQP connection is closed")
        turn = self._turn
        with self._turn_lock:
            while True:
                if done():
                    return
                if connection.lost:
                    raise ConnectionError("the AMQP connection closed")
                left = until - time.monotonic()
                if left <= 0:
                    return
                if not self._reading:
                    self._reading = True
                    break
                self._waiting += 1
                try:
                    turn.wait(left)
                finally:
                    self._waiting -= 1
        try:
            self._read(connection, done, until)
        except BaseException as exc:
            with self._turn_lock:
                self._reading = False
                turn.notify_all()
            # An interrupt between a read and its decoding leaves the wire's state
            # unknown too: the connection goes (its calls are sent again on the next).
            self._drop(connection)
            if isinstance(exc, (ConnectionError, OSError)):
                raise ConnectionError(f"the AMQP connection failed: {exc}") from exc
            raise

    def poll(self) -> None:
        """See :meth:`~.._replicated.BlockingTransport.poll`."""
        connection = self._connection
        if connection is None or connection.lost:
            return
        with self._turn_lock:
            if self._reading:
                return  # the thread reading hands out what comes
            self._reading = True
        try:
            while connection.ready():
                events = connection.read(0.0)
                with self._turn_lock:
                    self._hand_out(events)
        except BaseException as exc:
            self._drop(connection)
            if not isinstance(exc, (ConnectionError, OSError)):
                raise
        finally:
            with self._turn_lock:
                self._reading = False
                if self._waiting:
                    self._turn.notify_all()  # a thread waiting for the turn takes it

    def _hand_out(self, events: list[Event]) -> None:
        """Hand the deliveries of the inbox among ``events`` to whom they are for (the
        turn lock held)."""
        for event in events:
            if isinstance(event, Delivered) and event.channel == _INBOX:
                properties = event.properties
                if properties.message_type == "elected":
                    self._on_elected()
                else:
                    self._on_reply(
                        properties.correlation_id or "",
                        properties.message_type or "",
                        event.body,
                    )

    def _read(self, connection: _Connection, done: Callable[[], bool], until: float) -> None:
        """Read ``connection`` (this thread's turn) until ``done()`` or ``until``,
        handing out what comes; the turn passes on as it ends."""
        turn = self._turn
        while True:
            events = connection.read(until - time.monotonic())
            with self._turn_lock:
                self._hand_out(events)
                over = done() or time.monotonic() >= until
                if over:
                    self._reading = False
                if self._waiting and (events or over):
                    turn.notify_all()
                if over:
                    return

    def _drop(self, connection: _Connection) -> None:
        connection.close()
        with self._turn:
            self._turn.notify_all()  # its waiters see it lost

    def close(self) -> None:
        """See :meth:`~.._replicated.BlockingTransport.close`."""
        connection = self._connection
        if connection is not None:
            self._drop(connection)
