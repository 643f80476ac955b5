"""The async face's short path to the server: the asyncio counterpart of :mod:`._link`.

A script call through ``redis.asyncio.Redis`` costs about as much Python as the round
trip itself (pool lock and checkout, the retry wrapper, timeouts through ``wait_for``,
response callbacks, observability hooks): the async face put half as fast as a bare
exchange on the same connection. :class:`AsyncLink` keeps connections of its own, one
per call in flight, kept for the next call when it ends (a connection belongs to the
event loop that opened it). redis-py makes and connects each from the client's pool
settings (TCP or unix socket, AUTH, SELECT, timeouts, as redis-py applies them); the
call itself writes ``FCALL`` packed by hiredis to the connection's stream and reads the
reply into a hiredis ``Reader`` made as redis-py makes its own, so error replies come
out as redis-py's exception classes, by redis-py's table.

The direct exchange applies to RESP2 over TCP or a unix socket with hiredis installed;
otherwise (TLS, RESP3, no hiredis, a redis-py whose connection lacks the attributes
used) every call goes through :class:`~._functions.AsyncFunctions`, redis-py's path,
under the same rules. Errors and retries are :mod:`._link`'s: a failed connect or send
is retried with backoff, a lost reply only for :data:`~._scripts.RESEND_SAFE` scripts, a
``LOADING`` reply always; a connection the server closed while idle is seen before
sending (end of file in the stream, or one ``poll`` of the socket) and replaced. A call
cancelled while on the wire drops its connection: the reply may still come.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import sys
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio

from ..._constants import REDIS_RETRIES
from ._functions import AsyncFunctions, function_missing, functions_unsupported
from ._link import CLOSED, MORE, READ_SIZE, LinkBase, reader_options
from ._listen import CONNECTION_ERRORS
from ._scripts import RESEND_SAFE

__all__ = ["AsyncLink"]

T = TypeVar("T")

if sys.version_info >= (3, 11):

    async def _within(awaitable: Awaitable[T], timeout: float | None) -> T:
        """``await awaitable``; ``asyncio.TimeoutError`` after ``timeout`` s."""
        async with asyncio.timeout(timeout):
            return await awaitable

else:  # pragma: no cover (3.10: no asyncio.timeout)

    async def _within(awaitable: Awaitable[T], timeout: float | None) -> T:
        """``await awaitable``; ``asyncio.TimeoutError`` after ``timeout`` s."""
        return await asyncio.wait_for(awaitable, timeout)


class _Indirect(Exception):
    """The direct exchange does not apply to this client's connections."""


class _Wire:
    """One connection of the link: redis-py's connected ``Connection``, its stream, a
    reply reader and a poll of its socket."""

    __slots__ = ("connection", "loop", "poll", "replies", "stream", "writer")

    def __init__(
        self,
        connection: Any,
        loop: asyncio.AbstractEventLoop,
        replies: Any,
        poll: Any,
    ) -> None:
        self.connection = connection
        self.loop = loop
        self.stream: asyncio.StreamReader = connection._reader
        self.writer: asyncio.StreamWriter = connection._writer
        self.replies = replies
        self.poll = poll

    def ready(self) -> bool:
        """Nothing buffered, no end of file seen and nothing to read on the socket."""
        return not (
            self.replies.has_data()
            or self.stream.at_eof()
            or self.stream.exception() is not None
            or self.poll(0)
        )

    def drop(self) -> None:
        """Close the connection at once (it is never used again)."""
        close = getattr(self.connection, "_close", None)  # also forgets the streams
        with contextlib.suppress(Exception):  # its loop may be closed already
            if close is not None:
                close()
            else:
                self.writer.close()

    async def send(self, data: bytes, timeout: float | None) -> None:
        """Write ``data`` whole, or raise what redis-py raises when a write fails."""
        writer = self.writer
        try:
            writer.write(data)
            if writer.transport.get_write_buffer_size():  # not all out yet: wait for it
                await _within(writer.drain(), timeout)
        except asyncio.TimeoutError:
            raise redis.TimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            raise redis.ConnectionError(f"Error while writing to socket: {exc}") from exc

    async def receive(self, timeout: float | None) -> Any:
        """Read one reply; an error reply is raised as redis-py raises it."""
        replies = self.replies
        reply = replies.gets()
        while reply is MORE:
            try:
                data = await _within(self.stream.read(READ_SIZE), timeout)
            except asyncio.TimeoutError:
                raise redis.TimeoutError("Timeout reading from socket") from None
            except OSError as exc:
                raise redis.ConnectionError(f"Error while reading from socket: {exc}") from exc
            if not data:
                raise redis.ConnectionError(CLOSED)
            replies.feed(data)
            reply = replies.gets()
        if isinstance(reply, redis.RedisError):
            raise reply  # a ResponseError, or a ConnectionError (BusyLoadingError...)
        if type(reply) is list and reply and isinstance(reply[0], redis.ConnectionError):
            raise reply[0]
        return reply


class AsyncLink(LinkBase[AsyncFunctions]):
    """Runs the library's functions for one ``redis.asyncio.Redis`` client's server, on
    connections of its own made from the client's pool settings (``max_connections``
    does not apply to them: there are as many as calls in flight at once)."""

    def __init__(self, client: redis.asyncio.Redis, functions: AsyncFunctions) -> None:
        super().__init__(client, functions)
        self._idle: list[_Wire] = []
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
            return await self._functions(script, keys, args)
        command = (b"FCALL", self._names[script], len(keys), *keys, *args)
        safe = script in RESEND_SAFE
        try:
            try:
                return await self._exchange(command, safe)
            except redis.ResponseError as exc:
                if functions_unsupported(exc):
                    return await self._functions(script, keys, args)  # switches to EVALSHA
                if not function_missing(exc):
                    raise
            await self._exchange((b"FUNCTION", b"LOAD", b"REPLACE", self._code), True)
            return await self._exchange(command, safe)
        except _Indirect:  # raised before anything was sent
            return await self._functions(script, keys, args)

    async def aclose(self) -> None:
        """Close the idle connections; one in flight is closed when its call ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for wire in idle:
            with contextlib.suppress(Exception):
                await wire.connection.disconnect()

    async def _take(self) -> _Wire:
        """An idle connection of this loop that is ready, else a new one (raises
        :class:`_Indirect` when the direct exchange does not apply to it)."""
        loop = asyncio.get_running_loop()
        idle = self._idle
        while idle:
            wire = idle.pop()
            if wire.loop is loop and wire.ready():
                return wire
            wire.drop()  # another loop's, or closed by the server while idle
        connection = self._connection_class(**self._connection_kwargs)
        await connection.connect()
        attached = self._attach(connection, loop)
        if attached is None:
            self._direct = False
            await connection.disconnect()
            raise _Indirect
        return attached

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
        return _Wire(connection, loop, reader, poller.poll)

    def _give_back(self, wire: _Wire) -> None:
        if self._closed:
            wire.drop()
        else:
            self._idle.append(wire)

    async def _exchange(self, command: tuple[Any, ...], resend_safe: bool) -> Any:
        """Send ``command`` and read its reply, retrying as the module docstring says."""
        failures = 0
        packed: bytes = self._hiredis.pack_command(command)
        while True:
            wire = None
            sent = False
            try:
                wire = await self._take()
                await wire.send(packed, self._timeout)
                sent = True
                reply = await wire.receive(self._timeout)
            except redis.BusyLoadingError:
                # The server refused the command while it loads its data: retry.
                if wire is not None:
                    wire.drop()
                failures += 1
                if failures > REDIS_RETRIES:
                    raise
            except redis.ResponseError:
                if wire is not None:
                    self._give_back(wire)  # an error reply: the connection is in step
                raise
            except CONNECTION_ERRORS:
                if wire is not None:
                    wire.drop()
                failures += 1
                if (sent and not resend_safe) or failures > REDIS_RETRIES:
                    raise
            except BaseException:
                if wire is not None:
                    wire.drop()  # cancelled, or worse: the reply may still come
                raise
            else:
                self._give_back(wire)
                return reply
            await asyncio.sleep(self._backoff.compute(failures))
