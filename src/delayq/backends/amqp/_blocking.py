"""The intake's publisher for a thread that blocks (the sync face's fast put): one AMQP
connection on a plain socket (a :class:`~._wire.Wire`, whose frames pamqp makes and
reads, driven from the calling thread), one confirm channel, each publish returning
once the broker confirmed it.

Why a second connection: the sync face's calls run on a private event loop thread
(:class:`~.._replicated.ThreadLink`), and the hop there and back costs two thread
wake-ups per put, on this kind of machine a quarter of a put one by one. A put that
publishes from its caller's thread, and reads its confirm there, pays none.

Only :meth:`BlockingIntake.append` is offered, to the intake and (a nudge) the
requests' exchange, which the backend object's own connection declared first. The
connection asks for no heartbeats (nothing of it runs between two puts); the kernel's
keepalive watches it instead, and each wait is bounded by the caller's deadline.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pamqp import commands

from ._url import Settings
from ._wire import (
    ChannelClosed,
    Confirmed,
    ConnectionClosed,
    Event,
    Method,
    Opened,
    Wire,
)

__all__ = ["BlockingIntake"]

_CHANNEL = 1
_PROPERTIES = commands.Basic.Properties(delivery_mode=2, message_type="puts")


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
    """One open connection with its confirm channel: a :class:`~._wire.Wire` driven on
    a plain socket from the calling thread, every read and write bounded by a deadline
    (``time.monotonic()``), a TimeoutError past it."""

    def __init__(self, broker: _Broker, name: str, deadline: float) -> None:
        self._wire = Wire(broker.user, broker.password, broker.vhost, name=name)
        self._sock = self._connect(broker, deadline)
        try:
            self._handshake(deadline)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _connect(broker: _Broker, deadline: float) -> socket.socket:
        sock = socket.create_connection(
            (broker.host, broker.port), timeout=max(deadline - time.monotonic(), 0.001)
        )
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if broker.tls:
                sock = broker.context().wrap_socket(sock, server_hostname=broker.host)
        except BaseException:
            sock.close()
            raise
        return sock

    def _handshake(self, deadline: float) -> None:
        wire = self._wire
        self._until(lambda event: isinstance(event, Opened), deadline)
        wire.send(_CHANNEL, commands.Channel.Open())
        self._until(_replied(commands.Channel.OpenOk), deadline)
        wire.send(_CHANNEL, commands.Confirm.Select())
        self._until(_replied(commands.Confirm.SelectOk), deadline)

    def publish(self, exchange: str, routing_key: str, body: bytes, deadline: float) -> None:
        """Publish ``body`` persistent and return once the broker confirmed it."""
        tag = self._wire.publish(_CHANNEL, exchange, routing_key, body, _PROPERTIES)
        event = self._until(
            lambda event: isinstance(event, Confirmed) and event.covers(tag), deadline
        )
        assert isinstance(event, Confirmed)
        if not event.ack:
            raise ConnectionError("the broker refused the intake append (a nack)")

    def _until(self, wanted: Callable[[Event], bool], deadline: float) -> Event:
        """Send what the wire has queued, then read until an event is ``wanted`` (the
        broker's close of the channel or the connection: a ConnectionError, with its
        reason)."""
        wire = self._wire
        sock = self._sock
        while True:
            data = wire.data_to_send()
            if data:
                sock.settimeout(_left(deadline))
                sock.sendall(data)
            sock.settimeout(_left(deadline))
            for event in wire.receive(sock.recv(65536)):
                if wanted(event):
                    return event
                if isinstance(event, (ChannelClosed, ConnectionClosed)):
                    data = wire.data_to_send()  # the CloseOk
                    if data:
                        sock.settimeout(_left(deadline))
                        sock.sendall(data)
                    what = "channel" if isinstance(event, ChannelClosed) else "connection"
                    raise ConnectionError(
                        f"the broker closed the {what}: {event.reply_code} {event.reply_text}"
                    )

    def close(self) -> None:
        """Drop the socket (no close handshake: the broker closes its side)."""
        self._sock.close()


def _replied(kind: type[Any]) -> Callable[[Event], bool]:
    """Whether an event is the broker's method ``kind``."""
    return lambda event: isinstance(event, Method) and isinstance(event.method, kind)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("no answer from the broker in time")
    return left


class BlockingIntake:
    """See :class:`~.._replicated.BlockingIntake`: the intake of ``settings``'
    namespace, on a connection of its own, opened on the first append (to the URL's
    hosts in turn, from the last one that took it) and again after one failed."""

    def __init__(self, settings: Settings, intake: str, rpc: str, soon_key: str) -> None:
        self._brokers = [_Broker(url) for url in settings.broker_urls]
        self._first = 0
        self._name = f"delayq {settings.prefix} intake"
        self._intake = intake
        self._nudge = (rpc, soon_key)
        self._connection: _Connection | None = None

    def connect(self, deadline: float) -> None:
        """See :meth:`~.._replicated.BlockingIntake.connect`."""
        self._connected(deadline)

    def _connected(self, deadline: float) -> _Connection:
        if self._connection is not None:
            return self._connection
        error: BaseException | None = None
        for step in range(len(self._brokers)):
            index = (self._first + step) % len(self._brokers)
            try:
                self._connection = _Connection(self._brokers[index], self._name, deadline)
            except (ConnectionError, OSError) as exc:
                error = exc
                continue
            self._first = index
            return self._connection
        assert error is not None
        raise error

    def append(self, body: bytes, *, nudge: bool, deadline: float) -> None:
        """See :meth:`~.._replicated.BlockingIntake.append`."""
        connection = self._connected(deadline)
        exchange, key = self._nudge if nudge else ("", self._intake)
        try:
            connection.publish(exchange, key, body, deadline)
        except BaseException:
            self.close()  # its state is unknown: the next append opens another
            raise

    def close(self) -> None:
        """See :meth:`~.._replicated.BlockingIntake.close`."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
