"""The intake's publisher for a thread that blocks (the sync face's fast put): one AMQP
connection on a plain socket, its frames made and read by pamqp (aiormq's own codec),
one confirm channel, each publish returning once the broker confirmed it.

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
import struct
import time
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.exceptions import PAMQPException
from pamqp.frame import marshal, unmarshal
from pamqp.header import ContentHeader, ProtocolHeader

from ._url import Settings

__all__ = ["BlockingIntake"]

#: The frame size a broker that says 0 (no limit) is sent frames of.
_FRAME_MAX = 131_072
#: Bytes of a frame besides its payload: type, channel, size, and the end octet.
_FRAME_OVERHEAD = 8
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
    """One open connection with its confirm channel; every read and write bounded by a
    deadline (``time.monotonic()``), a TimeoutError past it."""

    def __init__(self, broker: _Broker, name: str, deadline: float) -> None:
        self._buffer = b""
        self._sock = self._connect(broker, deadline)
        try:
            self._handshake(broker, name, deadline)
        except BaseException:
            self.close()
            raise
        self._tag = 0

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

    def _handshake(self, broker: _Broker, name: str, deadline: float) -> None:
        self._send(marshal(ProtocolHeader(), 0), deadline)
        self._expect(commands.Connection.Start, deadline)
        response = f"\0{broker.user}\0{broker.password}"
        properties: dict[str, Any] = {"connection_name": name, "product": "delayq"}
        self._send(marshal(commands.Connection.StartOk(properties, "PLAIN", response), 0), deadline)
        tune = self._expect(commands.Connection.Tune, deadline)
        self._frame_max = tune.frame_max or _FRAME_MAX
        ok = commands.Connection.TuneOk(tune.channel_max, self._frame_max, 0)
        self._send(marshal(ok, 0) + marshal(commands.Connection.Open(broker.vhost), 0), deadline)
        self._expect(commands.Connection.OpenOk, deadline)
        self._send(marshal(commands.Channel.Open(), _CHANNEL), deadline)
        self._expect(commands.Channel.OpenOk, deadline)
        self._send(marshal(commands.Confirm.Select(), _CHANNEL), deadline)
        self._expect(commands.Confirm.SelectOk, deadline)

    def publish(self, exchange: str, routing_key: str, body: bytes, deadline: float) -> None:
        """Publish ``body`` persistent and return once the broker confirmed it."""
        frames = [
            marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), _CHANNEL),
            marshal(ContentHeader(0, len(body), _PROPERTIES), _CHANNEL),
        ]
        step = self._frame_max - _FRAME_OVERHEAD
        frames.extend(
            marshal(ContentBody(body[at : at + step]), _CHANNEL) for at in range(0, len(body), step)
        )
        self._tag += 1
        self._send(b"".join(frames), deadline)
        while True:
            frame = self._read(deadline)
            if isinstance(frame, commands.Basic.Ack) and frame.delivery_tag >= self._tag:
                return
            if isinstance(frame, commands.Basic.Nack) and frame.delivery_tag >= self._tag:
                raise ConnectionError("the broker refused the intake append (a nack)")

    def _send(self, data: bytes, deadline: float) -> None:
        self._sock.settimeout(self._left(deadline))
        self._sock.sendall(data)

    def _read(self, deadline: float) -> Any:
        """The next frame of the connection, answering the broker's close of the
        channel or the connection (a ConnectionError, with its reason)."""
        while True:
            if len(self._buffer) >= 7:
                size = struct.unpack_from(">I", self._buffer, 3)[0] + _FRAME_OVERHEAD
                if len(self._buffer) >= size:
                    try:
                        _, channel, frame = unmarshal(self._buffer[:size])
                    except PAMQPException as exc:
                        raise ConnectionError(f"a frame the client cannot read: {exc}") from exc
                    self._buffer = self._buffer[size:]
                    self._closing(channel, frame, deadline)
                    return frame
            self._sock.settimeout(self._left(deadline))
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self._buffer += data

    def _closing(self, channel: int, frame: Any, deadline: float) -> None:
        if isinstance(frame, commands.Connection.Close):
            self._send(marshal(commands.Connection.CloseOk(), 0), deadline)
            raise ConnectionError(
                f"the broker closed the connection: {frame.reply_code} {frame.reply_text}"
            )
        if isinstance(frame, commands.Channel.Close):
            self._send(marshal(commands.Channel.CloseOk(), channel), deadline)
            raise ConnectionError(
                f"the broker closed the channel: {frame.reply_code} {frame.reply_text}"
            )

    def _expect(self, kind: type[Any], deadline: float) -> Any:
        frame = self._read(deadline)
        if not isinstance(frame, kind):
            raise ConnectionError(f"the broker answered {frame.name}, not {kind.__name__}")
        return frame

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer from the broker in time")
        return left

    def close(self) -> None:
        """Drop the socket (no close handshake: the broker closes its side)."""
        self._sock.close()


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
