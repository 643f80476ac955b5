"""The sync face's short path to the server: one connection per thread, no pool.

A script call through ``redis.Redis`` costs 60-70 us of Python per call on top of the
round trip (pool checkout and return, argument encoding, response callbacks,
observability hooks): more than the server spends running a put. :class:`Link` keeps one
redis-py ``Connection`` per thread (and per process: a forked child opens its own) and
lets redis-py connect it: TCP or unix socket, TLS, AUTH, SELECT, RESP version and
timeouts are the URL's, as redis-py applies them. The call itself skips redis-py's
layers: ``FCALL`` packed by hiredis goes out in one ``sendall`` on the connected socket,
and the reply is read with ``recv_into`` into a hiredis ``Reader`` of the connection's
own, made as redis-py makes its own: error replies come out as redis-py's exception
classes, by redis-py's table (``ResponseError``, ``NoScriptError``,
``BusyLoadingError``...), and a RESP3 push that arrives before the reply goes to
redis-py's parser, which handles it as it would. A failing socket raises what redis-py
raises (``redis.TimeoutError``, ``redis.ConnectionError``) and the connection is
dropped. Where this direct exchange does not apply (no hiredis, no ``poll()``, TLS,
RESP3 with a hiredis that cannot tell pushes apart, a redis-py whose connection has no
``_sock`` or ``_parser``), the call goes through the connection's
``send_packed_command`` and ``read_response`` instead, under the same rules.

Errors and retries, which decide whether a write may run twice:

* a failure while connecting or sending means the server never got the whole command
  (Redis runs only complete commands), so the call is retried on a fresh connection,
  with backoff, up to :data:`REDIS_RETRIES` times;
* a failure while reading the reply leaves it unknown whether the script ran: only the
  scripts in :data:`~._scripts.RESEND_SAFE` (their second run changes nothing and answers
  the same; the list every face uses) are sent again; any other raises the connection
  error (a put, a claim, an ack... may or may not have happened, as for any call cut off
  in flight);
* a connection the server closed while it sat idle (a restart) is seen before sending
  and replaced, so nothing is lost to it: its socket reads as ready (end of file) while
  nothing was asked of it, which one ``poll`` of the socket shows before each call
  (redis-py's ``can_read`` on the fallback path), as it shows stray bytes or a push
  that came while idle (replaced too); a ``LOADING`` reply (a restarted server still
  reading its data) ran nothing and is retried too.

The library is loaded (``FUNCTION LOAD REPLACE``) when the server says the function is
missing, then the call is sent again (it did not run). A server without ``FCALL`` (Redis
before 7.0) hands every call to :class:`~._functions.Functions`, which runs EVALSHA.
"""

from __future__ import annotations

import select
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import redis
from redis.backoff import ExponentialBackoff

from ..._constants import REDIS_RETRIES, REDIS_RETRY_BASE, REDIS_RETRY_CAP
from ..._fork import generation
from ._functions import Functions, FunctionsBase, function_missing, functions_unsupported
from ._listen import CONNECTION_ERRORS
from ._scripts import RESEND_SAFE, SCRIPT_NAMES, function_name, library_source

__all__ = [
    "CLOSED",
    "MORE",
    "READ_SIZE",
    "Link",
    "LinkBase",
    "load_hiredis",
    "raise_errors",
    "reader_options",
]

Packer = Callable[[tuple[Any, ...]], bytes]

#: What redis-py raises for a socket the server closed.
CLOSED = "Connection closed by server."
#: The reply reader's "not enough data yet" (None and False are replies in RESP3).
MORE = object()
#: Bytes read from the socket at a time (redis-py's default ``socket_read_size``).
READ_SIZE = 65536


def load_hiredis() -> Any:
    """The hiredis module, or None when it is not installed."""
    try:
        import hiredis  # noqa: PLC0415 (optional: redis-py works without it)
    except ImportError:
        return None
    return hiredis


def reader_options(connection: Any, parse_error: Callable[[str], Any]) -> dict[str, Any]:
    """The keyword arguments of a hiredis ``Reader`` that reads replies as redis-py's
    parser of ``connection`` does: error replies become redis-py's exception classes by
    its table (``parse_error``), text is decoded as the connection's encoder says."""
    options: dict[str, Any] = {
        "protocolError": redis.exceptions.InvalidResponse,
        "replyError": parse_error,
        "notEnoughData": MORE,
    }
    encoder = getattr(connection, "encoder", None)
    if encoder is not None:
        options["errors"] = encoder.encoding_errors
        if encoder.decode_responses:
            options["encoding"] = encoder.encoding
    return options


def raise_errors(reply: Any) -> Any:
    """``reply`` as a hiredis reader built by :func:`reader_options` gives it, or the
    error it is raised as redis-py raises it."""
    if isinstance(reply, redis.RedisError):
        raise reply  # a ResponseError, or a ConnectionError (BusyLoadingError...)
    if type(reply) is list and reply and isinstance(reply[0], redis.ConnectionError):
        raise reply[0]
    return reply


class _Direct:
    """The direct exchange on one connected socket: a poll of it, a reply reader and a
    read buffer of its own; ``push``: the reader's type of a RESP3 push, which
    ``on_push`` (redis-py's parser) handles, as redis-py does between replies."""

    __slots__ = ("buffer", "on_push", "pack", "poll", "push", "reader", "sock")

    def __init__(
        self,
        sock: socket.socket,
        reader: Any,
        pack: Packer,
        push: type | None,
        on_push: Callable[[Any], object] | None,
    ) -> None:
        self.sock = sock
        self.reader = reader
        self.pack = pack
        self.push = push
        self.on_push = on_push
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        self.poll = poller.poll
        self.buffer = bytearray(READ_SIZE)
        _kernel_timeouts(sock)

    def idle(self) -> bool:
        """Nothing buffered and nothing to read (no end of file, no stray bytes)."""
        return not (self.reader.has_data() or self.poll(0))

    def send(self, command: tuple[Any, ...]) -> None:
        """Write ``command`` whole, or raise what redis-py raises when a write fails
        (the caller drops the connection after any failure here)."""
        try:
            self.sock.sendall(self.pack(command))
        except (TimeoutError, BlockingIOError):  # Python's timeout, or the kernel's
            raise redis.TimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            raise redis.ConnectionError(f"Error while writing to socket: {exc}") from exc

    def receive(self) -> Any:
        """Read one reply; an error reply is raised as redis-py raises it (the caller
        drops the connection after any failure but a ``ResponseError``)."""
        reader = self.reader
        while True:
            reply = reader.gets()
            while reply is MORE:
                self._read()
                reply = reader.gets()
            if self.push is None or not isinstance(reply, self.push):
                break
            if self.on_push is not None:
                self.on_push(reply)
        return raise_errors(reply)

    def _read(self) -> None:
        buffer = self.buffer
        try:
            size = self.sock.recv_into(buffer)
        except (TimeoutError, BlockingIOError):  # Python's timeout, or the kernel's
            raise redis.TimeoutError("Timeout reading from socket") from None
        except OSError as exc:
            raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
        if not size:
            raise redis.ConnectionError(CLOSED)
        self.reader.feed(buffer, 0, size)


def _kernel_timeouts(sock: socket.socket) -> None:
    """Hand ``sock``'s timeout to the kernel (Linux): a blocking socket with
    ``SO_RCVTIMEO`` and ``SO_SNDTIMEO``. Python polls a socket that has a timeout before
    every send and every receive; the kernel's timeouts cost nothing until they expire,
    when the call fails with EAGAIN (``BlockingIOError``). A put is then three system
    calls (the idle poll, a send, a receive) instead of five."""
    timeout = sock.gettimeout()
    if not timeout or sys.platform != "linux":
        return
    microseconds = max(1, round(timeout * 1_000_000))
    timeval = struct.pack("ll", *divmod(microseconds, 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    sock.settimeout(None)


class _Wire:
    """One thread's connection, and its direct exchange while it has one."""

    __slots__ = ("connection", "direct", "fork")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.fork = generation()
        self.direct: _Direct | None = None

    def drop(self) -> None:
        """Close the connection (the next call connects again)."""
        self.direct = None
        self.connection.disconnect()


class _Local(threading.local):
    wire: _Wire | None = None


F = TypeVar("F", bound=FunctionsBase)


class LinkBase(Generic[F]):
    """What the sync and async links hold: the client's connection settings, the
    library's function names and code, hiredis, the retry backoff, and ``functions``,
    redis-py's path (EVALSHA too) for calls the direct exchange does not take."""

    def __init__(self, client: Any, functions: F) -> None:
        pool = client.connection_pool
        self._connection_class: Any = pool.connection_class
        self._connection_kwargs = dict(pool.connection_kwargs)
        self._functions = functions
        self._names = {name: function_name(name).encode() for name in SCRIPT_NAMES}
        self._code = library_source()[1]
        self._hiredis = load_hiredis()
        self._backoff = ExponentialBackoff(REDIS_RETRY_CAP, REDIS_RETRY_BASE)


class Link(LinkBase[Functions]):
    """Runs the library's functions for one ``redis.Redis`` client's server, on a
    connection per thread made from the client's pool settings (``max_connections``
    does not apply to them)."""

    def __init__(self, client: redis.Redis, functions: Functions) -> None:
        super().__init__(client, functions)
        self._local = _Local()
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def __call__(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run ``script`` with ``keys`` and ``args``; its raw reply."""
        if self._functions.evalsha:
            return self._functions(script, keys, args)
        command = (b"FCALL", self._names[script], len(keys), *keys, *args)
        safe = script in RESEND_SAFE
        try:
            return self._exchange(command, safe)
        except redis.ResponseError as exc:
            if functions_unsupported(exc):
                return self._functions(script, keys, args)  # switches it to EVALSHA
            if not function_missing(exc):
                raise
        self._exchange((b"FUNCTION", b"LOAD", b"REPLACE", self._code), True)
        return self._exchange(command, safe)

    def close(self) -> None:
        """Close every thread's connection; later calls open new ones."""
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            connection.disconnect()

    def _wire(self) -> _Wire:
        wire = self._local.wire
        if wire is None or wire.fork != generation():
            connection = self._connection_class(**self._connection_kwargs)
            wire = self._local.wire = _Wire(connection)
            with self._lock:
                self._open.add(connection)
        return wire

    def _ready(self, wire: _Wire) -> _Direct | None:
        """Connect if needed; replace a connection that reads as ready before anything
        was sent: the server closed it while idle (a restart), or stray bytes. Returns
        the direct exchange, None to go through redis-py."""
        connection = wire.connection
        direct = wire.direct
        if direct is not None:
            # The same socket as last time (not dropped since by close() or redis-py),
            # nothing buffered, nothing to read: ready.
            if direct.sock is connection._sock and direct.idle():
                return direct
            wire.drop()
        else:
            try:
                stale = connection.can_read(0)  # connects first when not connected
            except CONNECTION_ERRORS:
                stale = True
            if stale:
                connection.disconnect()
        connection.connect()
        wire.direct = self._attach(connection)
        return wire.direct

    def _attach(self, connection: Any) -> _Direct | None:
        """The direct exchange on ``connection``'s fresh socket; None where it does not
        apply (the call goes through redis-py)."""
        hiredis = self._hiredis
        if hiredis is None or not hasattr(select, "poll"):
            return None
        sock = getattr(connection, "_sock", None)
        parser = getattr(connection, "_parser", None)
        parse_error = getattr(parser, "parse_error", None)
        # RESP3 may push between replies: the reader must tell pushes apart.
        push = getattr(hiredis, "PushNotification", None)
        resp2 = str(getattr(connection, "protocol", 2)) == "2"
        if (
            not isinstance(sock, socket.socket)
            or hasattr(sock, "pending")  # TLS: bytes may wait above the socket
            or parse_error is None
            or (push is None and not resp2)
        ):
            return None
        on_push = getattr(parser, "handle_push_response", None)
        reader = hiredis.Reader(**reader_options(connection, parse_error))
        return _Direct(sock, reader, hiredis.pack_command, push, on_push)

    def _packed(self, connection: Any, command: tuple[Any, ...]) -> list[bytes]:
        if self._hiredis is not None:
            return [self._hiredis.pack_command(command)]
        packed: list[bytes] = connection.pack_command(*command)
        return packed

    def _exchange(self, command: tuple[Any, ...], resend_safe: bool) -> Any:
        """Send ``command`` and read its reply, retrying as the module docstring says."""
        failures = 0
        while True:
            wire = self._wire()
            sent = False
            try:
                direct = self._ready(wire)
                if direct is not None:
                    try:
                        direct.send(command)
                    except BaseException:
                        wire.drop()  # maybe a partial write: out of step
                        raise
                    sent = True
                    return direct.receive()
                connection = wire.connection
                connection.send_packed_command(self._packed(connection, command), False)
                sent = True
                return connection.read_response()
            except redis.BusyLoadingError:
                # The server refused the command while it loads its data: retry.
                wire.drop()
                failures += 1
                if failures > REDIS_RETRIES:
                    raise
            except redis.ResponseError:
                raise  # an error reply: the connection is in step
            except CONNECTION_ERRORS:
                wire.drop()
                failures += 1
                if (sent and not resend_safe) or failures > REDIS_RETRIES:
                    raise
            except BaseException:
                if not sent:
                    raise
                wire.drop()  # the reply may still come: out of step
                raise
            time.sleep(self._backoff.compute(failures))
