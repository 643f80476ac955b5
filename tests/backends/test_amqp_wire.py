"""``amqp://``'s connection without I/O (``delayq.backends.amqp._wire.Wire``), driven
here on a plain socket against the test RabbitMQ: the handshake, a confirm channel's
publishes and their confirms, a consumer given messages larger than a frame, a
mandatory publish returned, a nack, the broker's close of a channel (the connection
goes on) and of the connection, heartbeats both ways, and the bytes read one at a
time (a frame in pieces gives the same events).

Each test declares its own exclusive queues (deleted with their connection)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import unquote, urlsplit

import pytest
from pamqp import commands
from pamqp.frame import unmarshal

from delayq.backends.amqp._wire import (
    ChannelClosed,
    Confirmed,
    ConnectionClosed,
    Delivered,
    Event,
    Method,
    Opened,
    Returned,
    Wire,
)

_PERSISTENT = commands.Basic.Properties(delivery_mode=2, message_type="test")


class Driven:
    """A Wire on a socket to the test broker, read ``chunk`` bytes at a time; every
    event it gave, in order."""

    def __init__(self, *, heartbeat: int = 0, chunk: int = 65536, vhost: str | None = None) -> None:
        base = os.environ.get("DELAYQ_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
        parts = urlsplit(base)
        path = unquote(parts.path[1:]) if parts.path not in ("", "/") else "/"
        self.wire = Wire(
            unquote(parts.username or "guest"),
            unquote(parts.password or "guest"),
            path if vhost is None else vhost,
            name=f"delayq-test-wire {uuid.uuid4().hex[:8]}",
            heartbeat=heartbeat,
        )
        try:
            self.sock = socket.create_connection(
                (parts.hostname or "127.0.0.1", parts.port or 5672), timeout=2
            )
        except OSError as exc:
            pytest.skip(f"no RabbitMQ at {parts.hostname}:{parts.port}: {exc}")
        self.chunk = chunk
        self.events: list[Event] = []  # every event, in order
        self.pending: list[Event] = []  # those no until() took

    def close(self) -> None:
        self.sock.close()

    def flush(self) -> None:
        data = self.wire.data_to_send()
        if data:
            self.sock.sendall(data)

    def until(self, wanted: Callable[[Event], bool], timeout: float = 10) -> Event:
        """Send what is queued, then read until an event not taken yet is ``wanted``;
        take it."""
        deadline = time.monotonic() + timeout
        while True:
            for index, event in enumerate(self.pending):
                if wanted(event):
                    del self.pending[index]
                    return event
            self.flush()
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            events = self.wire.receive(self.sock.recv(self.chunk))
            self.events.extend(events)
            self.pending.extend(events)

    def reply(self, channel: int, kind: type) -> object:
        event = self.until(
            lambda e: isinstance(e, Method) and e.channel == channel and isinstance(e.method, kind)
        )
        assert isinstance(event, Method)
        return event.method

    def open(self) -> Opened:
        event = self.until(lambda e: isinstance(e, Opened))
        assert isinstance(event, Opened)
        return event

    def channel(self, channel: int, *, confirm: bool = False) -> None:
        self.wire.send(channel, commands.Channel.Open())
        self.reply(channel, commands.Channel.OpenOk)
        if confirm:
            self.wire.send(channel, commands.Confirm.Select())
            self.reply(channel, commands.Confirm.SelectOk)

    def queue(self, channel: int, **arguments: object) -> str:
        name = f"delayq-test-wire-{uuid.uuid4().hex[:12]}"
        self.wire.send(
            channel, commands.Queue.Declare(queue=name, exclusive=True, arguments=arguments)
        )
        self.reply(channel, commands.Queue.DeclareOk)
        return name

    def confirm(self, channel: int, tag: int) -> Confirmed:
        """The confirm that covers publish ``tag`` (one may cover several: not taken)."""

        def covers(e: Event) -> bool:
            return isinstance(e, Confirmed) and e.channel == channel and e.covers(tag)

        while not any(covers(e) for e in self.events):
            self.until(covers)
        event = next(e for e in self.events if covers(e))
        assert isinstance(event, Confirmed)
        return event


@pytest.fixture
def driven() -> Iterator[Driven]:
    with contextlib.closing(Driven()) as d:
        yield d


def test_the_handshake_opens_with_the_brokers_limits(driven: Driven) -> None:
    opened = driven.open()
    assert driven.wire.opened
    assert opened.frame_max > 4096
    assert opened.heartbeat == 0  # none asked
    assert opened.server_properties["product"] == "RabbitMQ"


def test_publishes_are_numbered_and_confirmed_then_consumed_whole(driven: Driven) -> None:
    """Three publishes on a confirm channel (one body three frames long, one empty):
    numbered 1, 2, 3 and confirmed; a consumer gets each whole, in order, with its
    properties."""
    opened = driven.open()
    driven.channel(1, confirm=True)
    name = driven.queue(1)
    big = os.urandom(2 * opened.frame_max + 100)
    bodies = [b"first", big, b""]
    tags = [driven.wire.publish(1, "", name, body, _PERSISTENT) for body in bodies]
    assert tags == [1, 2, 3]
    for tag in tags:
        assert driven.confirm(1, tag).ack
    driven.channel(2)
    driven.wire.send(2, commands.Basic.Consume(queue=name, consumer_tag="c", no_ack=True))
    delivered: list[Delivered] = []
    for _ in bodies:
        event = driven.until(lambda e: isinstance(e, Delivered))
        assert isinstance(event, Delivered)
        delivered.append(event)
    assert [event.body for event in delivered] == bodies
    assert all(event.properties.message_type == "test" for event in delivered)
    assert all(event.properties.delivery_mode == 2 for event in delivered)
    assert [event.method.consumer_tag for event in delivered] == ["c"] * 3


def test_a_channel_without_confirms_numbers_nothing(driven: Driven) -> None:
    driven.open()
    driven.channel(1)
    name = driven.queue(1)
    assert driven.wire.publish(1, "", name, b"x", _PERSISTENT) == 0
    driven.wire.send(1, commands.Basic.Get(queue=name, no_ack=True))
    event = driven.until(lambda e: isinstance(e, Delivered))
    assert isinstance(event, Delivered)
    assert event.body == b"x"
    assert isinstance(event.method, commands.Basic.GetOk)


def test_a_mandatory_publish_routed_nowhere_is_returned_then_confirmed(driven: Driven) -> None:
    driven.open()
    driven.channel(1, confirm=True)
    nowhere = f"delayq-test-wire-nowhere-{uuid.uuid4().hex[:8]}"
    tag = driven.wire.publish(1, "", nowhere, b"lost", _PERSISTENT, mandatory=True)
    assert driven.confirm(1, tag).ack
    returned = [event for event in driven.events if isinstance(event, Returned)]
    assert len(returned) == 1
    assert returned[0].body == b"lost"
    assert returned[0].method.reply_code == 312  # NO_ROUTE
    assert returned[0].method.routing_key == nowhere


def test_a_publish_into_a_full_queue_that_rejects_is_nacked(driven: Driven) -> None:
    driven.open()
    driven.channel(1, confirm=True)
    name = driven.queue(1, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    first = driven.wire.publish(1, "", name, b"1", _PERSISTENT)
    second = driven.wire.publish(1, "", name, b"2", _PERSISTENT)
    assert driven.confirm(1, first).ack
    assert not driven.confirm(1, second).ack


def test_the_broker_closes_a_channel_and_the_connection_goes_on(driven: Driven) -> None:
    """A passive declare of a queue that does not exist: the broker closes the channel
    (404); the wire answers its CloseOk, forgets the channel's numbering, and the
    connection serves the channel opened again."""
    driven.open()
    driven.channel(1, confirm=True)
    assert driven.wire.publish(1, "", "nowhere", b"x", _PERSISTENT) == 1
    driven.confirm(1, 1)
    driven.wire.send(
        1, commands.Queue.Declare(queue=f"delayq-test-wire-{uuid.uuid4().hex}", passive=True)
    )
    closed = driven.until(lambda e: isinstance(e, ChannelClosed))
    assert isinstance(closed, ChannelClosed)
    assert (closed.channel, closed.reply_code) == (1, 404)
    assert "NOT_FOUND" in closed.reply_text
    driven.channel(1, confirm=True)  # the broker took the CloseOk: the number is free
    name = driven.queue(1)
    assert driven.wire.publish(1, "", name, b"y", _PERSISTENT) == 1  # numbered afresh
    assert driven.confirm(1, 1).ack
    assert not driven.wire.closed


def test_the_broker_closes_the_connection_and_says_why() -> None:
    """A virtual host that does not exist: the broker closes the connection after the
    login (530); the wire says why, answers its CloseOk and refuses to send more."""
    with contextlib.closing(Driven(vhost=f"delayq-test-{uuid.uuid4().hex}")) as driven:
        closed = driven.until(lambda e: isinstance(e, ConnectionClosed))
        assert isinstance(closed, ConnectionClosed)
        assert closed.reply_code == 530
        assert driven.wire.closed
        data = driven.wire.data_to_send()
        _, _, close_ok = unmarshal(data)
        assert isinstance(close_ok, commands.Connection.CloseOk)
        with pytest.raises(ConnectionError):
            driven.wire.publish(1, "", "q", b"x", _PERSISTENT)
        driven.sock.sendall(data)
        driven.sock.settimeout(5)
        with pytest.raises(ConnectionError):  # the wire's "closed", or a reset
            read_until_the_end(driven)


def read_until_the_end(driven: Driven) -> None:
    """Read until the broker ends the socket (an error)."""
    while True:
        driven.wire.receive(driven.sock.recv(65536))


def test_heartbeats_are_sent_when_idle_and_the_brokers_keep_it_alive() -> None:
    """Asked for 1 s: the broker's heartbeats come (the wire stays alive across more
    ticks than two intervals hold), and a tick with nothing else sent queues one."""
    with contextlib.closing(Driven(heartbeat=1)) as driven:
        opened = driven.open()
        assert opened.heartbeat == 1
        assert driven.wire.heartbeat == 1
        driven.flush()
        driven.wire.tick()  # the handshake's frames were sent since the last
        assert driven.wire.data_to_send() == b""
        driven.wire.tick()
        _, channel, frame = unmarshal(driven.wire.data_to_send())
        assert (channel, frame.name) == (0, "Heartbeat")
        # Five ticks, every half second, reading what comes between them: four without
        # a frame from the broker would have raised.
        for _ in range(5):
            until = time.monotonic() + 0.5
            while (left := until - time.monotonic()) > 0:
                driven.sock.settimeout(left)
                try:
                    driven.wire.receive(driven.sock.recv(65536))
                except TimeoutError:
                    break
            driven.wire.tick()
            driven.flush()
        assert not driven.wire.closed


def test_a_silent_broker_is_said_gone_after_two_intervals() -> None:
    wire = Wire("guest", "guest", "/", name="silent", heartbeat=5)
    wire.tick()
    wire.tick()
    wire.tick()
    with pytest.raises(ConnectionError, match="no heartbeat"):
        wire.tick()


def test_bytes_read_one_at_a_time_give_the_same_events() -> None:
    """The whole exchange of the publish test with the socket read a byte at a time:
    every frame arrives in pieces, and the events are the same."""
    with contextlib.closing(Driven(chunk=1)) as driven:
        driven.open()
        driven.channel(1, confirm=True)
        name = driven.queue(1)
        body = os.urandom(3000)
        tag = driven.wire.publish(1, "", name, body, _PERSISTENT)
        assert driven.confirm(1, tag).ack
        driven.wire.send(1, commands.Basic.Get(queue=name, no_ack=True))
        event = driven.until(lambda e: isinstance(e, Delivered))
        assert isinstance(event, Delivered)
        assert event.body == body
