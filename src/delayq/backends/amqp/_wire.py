"""An AMQP 0-9-1 connection without I/O: bytes in, events out, bytes to send.

:class:`Wire` keeps what a connection is (the handshake's steps, the tuned limits,
each channel's confirm numbering and the content being assembled on it) and nothing
of how its bytes travel: a driver reads a socket (blocking, or an event loop's) and
hands what it read to :meth:`Wire.receive`, which returns the events those bytes
made; the driver writes :meth:`Wire.data_to_send`. The frames are made and read by
pamqp's public codec (aiormq's own). What the broker asks of a connection is
answered here: its Connection.Start and Tune (the handshake), its close of a channel
or of the connection (the CloseOk is queued, and the event says why).

Heartbeats have no clock here: a driver that asked for them calls :meth:`Wire.tick`
every half interval, which queues a heartbeat when nothing else was sent since the
previous tick and raises ConnectionError once nothing was received for two whole
intervals.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.exceptions import PAMQPException
from pamqp.frame import marshal, unmarshal
from pamqp.header import ContentHeader, ProtocolHeader
from pamqp.heartbeat import Heartbeat

__all__ = [
    "BrokerClosed",
    "ChannelClosed",
    "Confirmed",
    "ConnectionClosed",
    "Delivered",
    "Event",
    "Method",
    "Opened",
    "Returned",
    "Wire",
]

#: The frame size used when the broker says 0 (no limit).
FRAME_MAX = 131_072
#: Bytes of a frame besides its payload: type, channel, size, and the end octet.
FRAME_OVERHEAD = 8
#: How many ticks (half intervals) without a frame from the broker mean it is gone.
_SILENT_TICKS = 4
_HEARTBEAT = marshal(Heartbeat(), 0)
_FRAME_SIZE = struct.Struct(">I")


class Opened(NamedTuple):
    """The handshake is over: the connection is open on its virtual host."""

    frame_max: int
    channel_max: int
    heartbeat: int  # seconds, 0: none
    server_properties: dict[str, Any]


class Method(NamedTuple):
    """A method frame the broker sent on ``channel`` that is none of the events below
    (a reply: Channel.OpenOk, Queue.DeclareOk, Basic.ConsumeOk, ...; or a notice:
    Connection.Blocked, Basic.Cancel). ``method`` is pamqp's."""

    channel: int
    method: Any


class Confirmed(NamedTuple):
    """The broker confirmed (``ack``) or refused (not ``ack``: a nack) the publishes
    of a confirm channel up to ``delivery_tag`` (with ``multiple``) or that one."""

    channel: int
    delivery_tag: int
    multiple: bool
    ack: bool

    def covers(self, tag: int) -> bool:
        """Whether this confirm settles the publish numbered ``tag``."""
        return self.delivery_tag == tag or (self.multiple and self.delivery_tag >= tag)


class Delivered(NamedTuple):
    """A message a consumer of ``channel`` was given (Basic.Deliver), or got
    (Basic.GetOk): the method, its properties and its whole body."""

    channel: int
    method: Any
    properties: commands.Basic.Properties
    body: bytes


class Returned(NamedTuple):
    """A mandatory publish the broker could route nowhere (Basic.Return), with its
    properties and body; its confirm (an ack) follows."""

    channel: int
    method: commands.Basic.Return
    properties: commands.Basic.Properties
    body: bytes


class ChannelClosed(NamedTuple):
    """The broker closed ``channel`` (its CloseOk is queued): why, as it said."""

    channel: int
    reply_code: int
    reply_text: str


class ConnectionClosed(NamedTuple):
    """The broker closed the connection (its CloseOk is queued): why, as it said."""

    reply_code: int
    reply_text: str


class BrokerClosed(ConnectionError):
    """What a driver raises when the broker closed a channel or (``connection``) the
    connection: its reply code and words, as it said them."""

    def __init__(self, reply_code: int, reply_text: str, *, connection: bool) -> None:
        what = "connection" if connection else "channel"
        super().__init__(f"the broker closed the {what}: {reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.connection = connection


Event = Opened | Method | Confirmed | Delivered | Returned | ChannelClosed | ConnectionClosed


class _Content:
    """A message being assembled on a channel: its method, then its header, then
    body frames until ``size`` bytes came."""

    __slots__ = ("header", "method", "parts", "size")

    def __init__(self, method: Any) -> None:
        self.method = method
        self.header: ContentHeader | None = None
        self.parts: list[bytes] = []
        self.size = 0


class Wire:
    """One AMQP connection's state, logged in as ``user`` on ``vhost``, named ``name``
    in the broker's list of connections. ``heartbeat``: the interval in seconds asked
    for (0: none; the broker's own, when smaller, wins)."""

    def __init__(
        self, user: str, password: str, vhost: str, *, name: str, heartbeat: int = 0
    ) -> None:
        self._login = (user, password, vhost, name)
        self._heartbeat_asked = heartbeat
        self.frame_max = FRAME_MAX
        self.heartbeat = 0
        self.opened = False
        #: Set once either side closed the connection: nothing more is sent.
        self.closed = False
        self._out: list[bytes] = [marshal(ProtocolHeader(), 0)]
        self._buffer = b""
        #: Per confirm channel, the number of its last publish.
        self._tags: dict[int, int] = {}
        self._selecting: set[int] = set()
        self._content: dict[int, _Content] = {}
        self._sent = False
        self._silent = 0

    # -- what the driver sends ------------------------------------------------------

    def data_to_send(self) -> bytes:
        """The bytes queued since the last call (empty when none)."""
        out = self._out
        if not out:
            return b""
        self._out = []
        self._sent = True
        return out[0] if len(out) == 1 else b"".join(out)

    def send(self, channel: int, method: Any) -> None:
        """Queue ``method`` (pamqp's) on ``channel``. A Confirm.Select makes the channel
        number its publishes from its SelectOk on."""
        self._check_open()
        if isinstance(method, commands.Confirm.Select):
            self._selecting.add(channel)
        elif isinstance(method, commands.Connection.Close):
            self.closed = True
        self._out.append(marshal(method, channel))

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties,
        *,
        mandatory: bool = False,
    ) -> int:
        """Queue a publish of ``body``; its number on a confirm channel (what a
        :class:`Confirmed` covers), else 0."""
        self._check_open()
        out = self._out
        out.append(
            marshal(
                commands.Basic.Publish(
                    exchange=exchange, routing_key=routing_key, mandatory=mandatory
                ),
                channel,
            )
        )
        out.append(marshal(ContentHeader(0, len(body), properties), channel))
        step = self.frame_max - FRAME_OVERHEAD
        if len(body) <= step:
            if body:
                out.append(marshal(ContentBody(body), channel))
        else:
            out.extend(
                marshal(ContentBody(body[at : at + step]), channel)
                for at in range(0, len(body), step)
            )
        tag = self._tags.get(channel)
        if tag is None:
            return 0
        self._tags[channel] = tag + 1
        return tag + 1

    def tick(self) -> None:
        """Called every half heartbeat interval by a driver that asked for heartbeats:
        queue one when nothing was sent since the last tick; ConnectionError when
        nothing came from the broker for two intervals."""
        self._silent += 1
        if self._silent >= _SILENT_TICKS:
            raise ConnectionError(
                f"no heartbeat from the broker in {2 * self.heartbeat} s: it is gone"
            )
        if not self._sent and not self.closed and not self._out:
            self._out.append(_HEARTBEAT)
        self._sent = False

    def _check_open(self) -> None:
        if self.closed:
            raise ConnectionError("the connection is closed")

    # -- what the driver received ---------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """The events of ``data``, the next bytes read from the connection (any
        number: a frame may come in pieces). ConnectionError on a frame that cannot be
        read, or an empty ``data`` (the broker closed the socket)."""
        if not data:
            self.closed = True
            raise ConnectionError("the broker closed the connection")
        self._silent = 0
        buffer = self._buffer + data if self._buffer else data
        events: list[Event] = []
        at = 0
        end = len(buffer)
        while end - at >= 7:
            size = _FRAME_SIZE.unpack_from(buffer, at + 3)[0] + FRAME_OVERHEAD
            if end - at < size:
                break
            frame_bytes = buffer if at == 0 and size == end else buffer[at : at + size]
            at += size
            try:
                _, channel, frame = unmarshal(frame_bytes)
            except PAMQPException as exc:
                self.closed = True
                raise ConnectionError(f"a frame the client cannot read: {exc}") from exc
            event = self._on_frame(channel, frame)
            if event is not None:
                events.append(event)
        self._buffer = buffer[at:] if at < end else b""
        return events

    def _on_frame(self, channel: int, frame: Any) -> Event | None:
        if isinstance(frame, (commands.Basic.Ack, commands.Basic.Nack)):
            return Confirmed(
                channel, frame.delivery_tag, frame.multiple, isinstance(frame, commands.Basic.Ack)
            )
        content = self._content.get(channel)
        if content is not None:
            return self._on_content(channel, content, frame)
        if isinstance(frame, (commands.Basic.Deliver, commands.Basic.Return, commands.Basic.GetOk)):
            self._content[channel] = _Content(frame)
            return None
        if isinstance(frame, Heartbeat):
            return None
        if channel == 0:
            return self._on_connection(frame)
        if isinstance(frame, commands.Confirm.SelectOk):
            if channel in self._selecting:
                self._selecting.discard(channel)
                self._tags[channel] = 0
        elif isinstance(frame, commands.Channel.Close):
            self._forget(channel)
            if not self.closed:
                self._out.append(marshal(commands.Channel.CloseOk(), channel))
            return ChannelClosed(channel, frame.reply_code or 0, frame.reply_text or "")
        elif isinstance(frame, commands.Channel.CloseOk):
            self._forget(channel)
        return Method(channel, frame)

    def _on_content(self, channel: int, content: _Content, frame: Any) -> Event | None:
        if content.header is None:
            if not isinstance(frame, ContentHeader):
                raise self._broken(f"{frame.name} where a content header was due")
            content.header = frame
        elif isinstance(frame, ContentBody):
            content.parts.append(frame.value)
            content.size += len(frame.value)
        else:
            raise self._broken(f"{frame.name} where a content body was due")
        if content.size < content.header.body_size:
            return None
        del self._content[channel]
        parts = content.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        properties = content.header.properties
        if isinstance(content.method, commands.Basic.Return):
            return Returned(channel, content.method, properties, body)
        return Delivered(channel, content.method, properties, body)

    def _on_connection(self, frame: Any) -> Event | None:
        user, password, vhost, name = self._login
        if isinstance(frame, commands.Connection.Start):
            if "PLAIN" not in frame.mechanisms.split():
                raise self._broken(f"the broker offers no PLAIN login ({frame.mechanisms})")
            self._server_properties = dict(frame.server_properties or {})
            properties: dict[str, Any] = {
                "connection_name": name,
                "product": "delayq",
                "capabilities": {
                    "publisher_confirms": True,
                    "consumer_cancel_notify": True,
                    "basic.nack": True,
                    "connection.blocked": True,
                    "authentication_failure_close": True,
                },
            }
            self._out.append(
                marshal(
                    commands.Connection.StartOk(properties, "PLAIN", f"\0{user}\0{password}"), 0
                )
            )
            return None
        if isinstance(frame, commands.Connection.Tune):
            self.frame_max = frame.frame_max or FRAME_MAX
            asked, offered = self._heartbeat_asked, frame.heartbeat
            self.heartbeat = min(asked, offered) if asked and offered else asked
            self._channel_max = frame.channel_max
            tune_ok = commands.Connection.TuneOk(frame.channel_max, self.frame_max, self.heartbeat)
            self._out.append(marshal(tune_ok, 0))
            self._out.append(marshal(commands.Connection.Open(vhost), 0))
            return None
        if isinstance(frame, commands.Connection.OpenOk):
            self.opened = True
            return Opened(
                self.frame_max, self._channel_max, self.heartbeat, self._server_properties
            )
        if isinstance(frame, commands.Connection.Close):
            if not self.closed:
                self._out.append(marshal(commands.Connection.CloseOk(), 0))
            self.closed = True
            return ConnectionClosed(frame.reply_code or 0, frame.reply_text or "")
        if isinstance(frame, commands.Connection.CloseOk):
            self.closed = True
        return Method(0, frame)

    def _forget(self, channel: int) -> None:
        self._tags.pop(channel, None)
        self._selecting.discard(channel)
        self._content.pop(channel, None)

    def _broken(self, what: str) -> ConnectionError:
        self.closed = True
        return ConnectionError(f"the broker broke the protocol: {what}")
