"""The async face's short path to the server: the asyncio counterpart of :mod:`._link`.

A script call through ``redis.asyncio.Redis`` costs about as much Python as the round
trip itself (pool lock and checkout, the retry wrapper, timeouts through ``wait_for``,
response callbacks, observability hooks), and takes a connection of its own.
:class:`AsyncLink` keeps one connection per event loop and pipelines on it: a call writes
``FCALL`` packed by hiredis to the connection's stream at once and waits for its reply;
one reader task per connection reads the replies, in order, with a hiredis ``Reader``
made as redis-py makes its own (error replies come out as redis-py's exception classes,
by redis-py's table), and hands each to its call. Calls made at the same moment by many
tasks go out and come back together, as node-redis and ioredis's auto-pipelining do;
redis-py makes and connects the connection from the client's pool settings (TCP or unix
socket, AUTH, SELECT, timeouts, as redis-py applies them).

It applies to RESP2 over TCP or a unix socket with hiredis installed; otherwise (TLS,
RESP3, no hiredis, a redis-py whose connection lacks the attributes used) every call goes
through :class:`~._functions.AsyncFunctions`, redis-py's path, under the same rules.

Errors and retries are :mod:`._link`'s: a failed connect is retried with backoff; a call
whose connection fails after it was written is sent again only for a
:data:`~._scripts.RESEND_SAFE` script, a ``LOADING`` reply always. A reply later than
the socket timeout fails the connection and every call waiting on it (as redis-py drops
a connection that timed out). A connection the server closed while idle is seen before
writing (end of file in the stream, or one ``poll`` of the socket) and replaced. A call
cancelled while waiting leaves its reply to be read and dropped: the connection stays in
step for the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio

from ..._constants import REDIS_RETRIES
from ._functions import AsyncFunctions, function_missing, functions_unsupported
from ._link import LinkBase
from ._listen import CONNECTION_ERRORS
from ._resend import not_cancelled
from ._scripts import RESEND_SAFE

__all__ = ["AsyncLink"]

#: What redis-py raises for a socket the server closed.
CLOSED = "Connection closed by server."
#: The reply reader's "not enough data yet" (None and False are replies in RESP3).
MORE = object()
#: Bytes read from the socket at a time (redis-py's default ``socket_read_size``).
READ_SIZE = 65536


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


class _Indirect(Exception):
    """The direct exchange does not apply to this client's connections."""


class _Wire:
    """One pipelined connection: redis-py's connected ``Connection``, its stream, a reply
    reader, a poll of its socket, the calls waiting for their replies (in the order they
    were written) and the task that reads them."""

    __slots__ = (
        "connection",
        "failure",
        "loop",
        "outbox",
        "pending",
        "poll",
        "reader",
        "replies",
        "stream",
        "timeout",
        "watch",
        "writer",
    )

    def __init__(
        self,
        connection: Any,
        loop: asyncio.AbstractEventLoop,
        replies: Any,
        poll: Any,
        timeout: float | None,
    ) -> None:
        self.connection = connection
        self.loop = loop
        self.stream: asyncio.StreamReader = connection._reader
        self.writer: asyncio.StreamWriter = connection._writer
        self.replies = replies
        self.poll = poll
        #: The calls written, oldest first: each one's future and the time its reply is
        #: due by (the socket timeout after it was written).
        self.pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.timeout = timeout
        #: The timer that fails the connection when the oldest reply is late.
        self.watch: asyncio.TimerHandle | None = None
        #: Commands written by calls of this turn of the loop, sent together at its end.
        self.outbox: list[bytes] = []
        #: Why the connection can no longer be used (None while it can).
        self.failure: BaseException | None = None
        self.reader = loop.create_task(self._read_replies())

    def usable(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a call on ``loop`` may write here: not failed, this loop's, and when
        no call waits on it, nothing buffered, no end of file and nothing to read."""
        if self.failure is not None or self.loop is not loop:
            return False
        if self.pending:
            return True
        return not (
            self.replies.has_data()
            or self.stream.at_eof()
            or self.stream.exception() is not None
            or self.poll(0)
        )

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        """Write ``packed``; the future of its reply (an error reply is its value).

        With no call on the wire it goes out at once. Otherwise replies are due, and
        the calls they wake will write too in this turn of the loop: it waits in the
        outbox, and the outbox goes out in one write at the end of the turn (one
        system call and, on the server, one read for them all), in call order."""
        if self.failure is not None:  # nothing written
            raise _copy(self.failure)
        loop = self.loop
        future: asyncio.Future[Any] = loop.create_future()
        if self.outbox:
            self.outbox.append(packed)
        elif self.pending:
            self.outbox.append(packed)
            loop.call_soon(self._flush)
        else:
            self.writer.write(packed)
        timeout = self.timeout
        due = float("inf") if timeout is None else loop.time() + timeout
        self.pending.append((future, due))
        if self.watch is None and timeout is not None:
            self.watch = loop.call_at(due, self._check_late)
        return future

    def _check_late(self) -> None:
        """The watch: fail the connection if the oldest reply is late, else watch the
        (new) oldest one. One timer per connection, not one per call."""
        self.watch = None
        if self.failure is not None or not self.pending:
            return
        due = self.pending[0][1]
        if due <= self.loop.time():
            self.fail(redis.TimeoutError("Timeout reading from socket"))
        else:
            self.watch = self.loop.call_at(due, self._check_late)

    def _flush(self) -> None:
        outbox, self.outbox = self.outbox, []
        if self.failure is None:
            self.writer.write(b"".join(outbox))

    def fail(self, failure: BaseException) -> None:
        """Give up the connection: every call still waiting gets a connection error,
        and it is closed at once."""
        if self.failure is not None:
            return
        self.failure = failure
        self.outbox = []
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        pending, self.pending = self.pending, deque()
        for future, _ in pending:
            if not future.done():
                future.set_exception(_copy(failure))
        if self.reader is not asyncio.current_task():
            self.reader.cancel()
        close = getattr(self.connection, "_close", None)  # also forgets the streams
        with contextlib.suppress(Exception):  # its loop may be closed already
            if close is not None:
                close()
            else:
                self.writer.close()

    async def _read_replies(self) -> None:
        """Hand each reply to the oldest waiting call, until the connection fails (or
        the loop ends: ``asyncio.run`` cancels this task)."""
        replies, pending = self.replies, self.pending
        try:
            while True:
                data = await self.stream.read(READ_SIZE)
                if not data:
                    raise redis.ConnectionError(CLOSED)
                replies.feed(data)
                reply = replies.gets()
                while reply is not MORE:
                    if not pending:  # bytes nothing asked for: out of step
                        raise redis.ConnectionError("a reply that no call waits for")
                    future = pending.popleft()[0]
                    if not future.done():  # a cancelled call's reply is dropped
                        future.set_result(reply)
                    reply = replies.gets()
        except asyncio.CancelledError:
            self.fail(redis.ConnectionError("the connection was closed"))
            raise
        except redis.RedisError as exc:  # end of file, a protocol error, stray bytes
            self.fail(exc)
        except Exception as exc:  # OSError from the socket, or worse
            self.fail(redis.ConnectionError(f"Error while reading from socket: {exc}"))


def _copy(failure: BaseException) -> BaseException:
    """A new exception like ``failure``, for one call (each raises its own)."""
    if isinstance(failure, redis.RedisError):
        with contextlib.suppress(Exception):
            return type(failure)(*failure.args)
    return redis.ConnectionError(f"the connection failed: {failure}")


class AsyncLink(LinkBase[AsyncFunctions]):
    """Runs the library's functions for one ``redis.asyncio.Redis`` client's server, on
    one pipelined connection per event loop made from the client's pool settings."""

    def __init__(self, client: redis.asyncio.Redis, functions: AsyncFunctions) -> None:
        super().__init__(client, functions)
        self._wire: _Wire | None = None
        self._connecting: asyncio.Task[_Wire] | None = None
        self._direct = (
            self._hiredis is not None
            and hasattr(select, "poll")
            and not issubclass(self._connection_class, redis.asyncio.SSLConnection)
            and str(self._connection_kwargs.get("protocol", 2)) == "2"
        )
        self._timeout: float | None = self._connection_kwargs.get("socket_timeout")
        self._closed = False

    async def __call__(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run ``script`` with ``keys`` and ``args``; its raw reply."""
        if not self._direct or self._functions.evalsha:
            return await self._through_redis_py(script, keys, args)
        command = (b"FCALL", self._names[script], len(keys), *keys, *args)
        safe = script in RESEND_SAFE
        try:
            try:
                return await self._exchange(command, safe)
            except redis.ResponseError as exc:
                if functions_unsupported(exc):  # switches it to EVALSHA
                    return await self._through_redis_py(script, keys, args)
                if not function_missing(exc):
                    raise
            await self._exchange((b"FUNCTION", b"LOAD", b"REPLACE", self._code), True)
            return await self._exchange(command, safe)
        except _Indirect:  # raised before anything was sent
            return await self._through_redis_py(script, keys, args)

    async def _through_redis_py(
        self, script: str, keys: Sequence[bytes], args: Sequence[Any]
    ) -> Any:
        """The call on redis-py's path (:class:`~._functions.AsyncFunctions`)."""
        return await not_cancelled(self._functions(script, keys, args))

    async def aclose(self) -> None:
        """Close the connection, once the calls waiting on it have their replies (or
        the socket timeout has passed)."""
        self._closed = True
        wire, self._wire = self._wire, None
        if wire is None or wire.failure is not None:
            return
        if wire.loop is asyncio.get_running_loop():
            waiting = [future for future, _ in wire.pending if not future.done()]
            if waiting:
                await asyncio.wait(waiting, timeout=self._timeout)
        wire.fail(redis.ConnectionError("the queue was closed"))

    async def _take(self) -> _Wire:
        """This loop's connection, or a new one when it has none or its connection
        failed or was closed by the server (raises :class:`_Indirect` when the direct
        exchange does not apply). Calls that find none at once share one connect."""
        loop = asyncio.get_running_loop()
        wire = self._wire
        if wire is not None:
            if wire.usable(loop):
                return wire
            if wire.loop is loop:
                wire.fail(redis.ConnectionError("closed by the server while idle"))
            self._wire = None  # another loop's: that loop closes it (or closed it)
        connecting = self._connecting
        if connecting is None or connecting.get_loop() is not loop:
            connecting = self._connecting = loop.create_task(self._connect(loop))
            connecting.add_done_callback(self._connected)
        return await asyncio.shield(connecting)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Wire:
        connection = self._connection_class(**self._connection_kwargs)
        await connection.connect()
        wire = self._attach(connection, loop)
        if wire is None:
            self._direct = False
            await connection.disconnect()
            raise _Indirect
        return wire

    def _connected(self, task: asyncio.Task[_Wire]) -> None:
        if self._connecting is task:
            self._connecting = None
        if task.cancelled() or task.exception() is not None:
            return
        if self._closed:  # closed while it connected: the call fails, as it would have
            task.result().fail(redis.ConnectionError("the queue was closed"))
        else:
            self._wire = task.result()

    def _attach(self, connection: Any, loop: asyncio.AbstractEventLoop) -> _Wire | None:
        writer = getattr(connection, "_writer", None)
        stream = getattr(connection, "_reader", None)
        parse_error = getattr(getattr(connection, "_parser", None), "parse_error", None)
        if not isinstance(writer, asyncio.StreamWriter):
            return None
        sock = writer.get_extra_info("socket")
        if (
            not isinstance(stream, asyncio.StreamReader)
            or parse_error is None
            or sock is None
            or writer.get_extra_info("sslcontext") is not None
        ):
            return None
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        reader = self._hiredis.Reader(**reader_options(connection, parse_error))
        return _Wire(connection, loop, reader, poller.poll, self._timeout)

    async def _exchange(self, command: tuple[Any, ...], resend_safe: bool) -> Any:
        """Send ``command`` and wait for its reply, retrying as the module docstring
        says."""
        failures = 0
        packed: bytes = self._hiredis.pack_command(command)
        while True:
            wire = self._wire
            sent = False
            try:
                if wire is None or not wire.usable(asyncio.get_running_loop()):
                    wire = await self._take()
                future = wire.send(packed)
                sent = True
                return raise_errors(await future)
            except redis.BusyLoadingError:
                # The server refused the command while it loads its data: it ran
                # nothing, so retry (on the same connection: it is in step).
                failures += 1
                if failures > REDIS_RETRIES:
                    raise
            except redis.ResponseError:
                raise  # an error reply: the connection is in step
            except CONNECTION_ERRORS as exc:
                if wire is not None:
                    wire.fail(exc)  # a connection error the server answered, or worse
                failures += 1
                if (sent and not resend_safe) or failures > REDIS_RETRIES:
                    raise
            await asyncio.sleep(self._backoff.compute(failures))
