"""The async face's short path to the server: the asyncio counterpart of :mod:`._link`.

A script call through ``redis.asyncio.Redis`` costs about as much Python as the round
trip itself (pool lock and checkout, the retry wrapper, timeouts through ``wait_for``,
response callbacks, observability hooks), and takes a connection of its own.
:class:`AsyncLink` keeps one redis-py ``Connection`` per event loop, made from the client
pool's ``connection_class`` and ``connection_kwargs`` (TCP or unix socket, TLS, AUTH,
SELECT, as redis-py applies them), and pipelines on it through its public methods only:
a call writes ``FCALL`` (packed by hiredis, else by ``pack_command``) with
``send_packed_command(..., check_health=False)`` and waits for its reply; one reader
task per connection calls ``read_response()`` again and again and hands each reply, in
order, to the oldest call waiting (error replies come out as redis-py's exception
classes). Calls made at the same moment by many tasks go out and come back together,
as node-redis and ioredis's auto-pipelining do. The connection is made without a socket
timeout, so redis-py wraps neither a write nor a read in one: the link times replies
itself, with one timer per connection.

It speaks RESP2 (whatever redis-py's default); a URL that asks for RESP3, where the
server may push between replies, has every call go through
:class:`~._functions.AsyncFunctions`, redis-py's path, under the same rules.

Errors and retries are the one rule of :mod:`._resend` (the loop
:func:`~._io._async.retry.call_async`, the decision :func:`~._resend.again`), as on
:mod:`._link`: a failed connect is retried with backoff (one that timed out is not); a
call whose connection fails once it was handed to the connection counts as written, so
it is sent again only for a :data:`~._scripts.RESEND_SAFE` script, a ``LOADING`` reply
always, and any other raises :class:`~delayq.errors.OutcomeUnknown`. A reply later than the socket
timeout fails the connection and every call waiting on it (as redis-py drops a
connection that timed out). A call writes its command itself only onto an idle
connection and when it is at most :data:`DIRECT_MAX` bytes, which asyncio's buffer
takes without waiting; any other write is the writer task's, which failing the
connection cancels: a server that stopped reading (a partition) cannot hold a call in
a write past the socket timeout. A connection the server closed while idle is replaced
before writing: the reader task, always reading, meets its end of file as soon as the
loop looks at the socket; and before a call on a connection quiet for
:data:`IDLE_CHECK` seconds or more, :data:`LOOKS` turns of the loop let it look (a loop
kept busy or blocked meanwhile may not have seen a restart yet). A call cancelled while
waiting leaves its reply to be read and dropped: the connection stays in step for the
others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from ..._timeout import within
from ._functions import AsyncFunctions, function_missing, functions_unsupported
from ._io._async.retry import call_async
from ._link import LinkBase
from ._resend import Attempt
from ._scripts import RESEND_SAFE
from ._transport import CONNECTION_ERRORS

__all__ = ["DIRECT_MAX", "IDLE_CHECK", "LOOKS", "AsyncLink"]

#: Seconds a connection may sit quiet before a call gives the loop a look at it first.
IDLE_CHECK = 0.02
#: The longest command a call writes itself (bytes); a longer one goes through the
#: writer task. Below asyncio's write buffer limit (64 KiB), so a call's own write onto
#: an idle connection never waits for the server to read.
DIRECT_MAX = 32 * 1024
#: Turns of the loop that look takes: one to poll the socket, one for the transport to
#: read its end of file, one for the reader task to meet it, and one to spare.
LOOKS = 4


class _Wire:
    """One pipelined connection: redis-py's connected ``Connection``, the calls waiting
    for their replies (in the order they were written) and the task that reads them."""

    __slots__ = (
        "checking",
        "connection",
        "failure",
        "flushing",
        "loop",
        "outbox",
        "pending",
        "quiet_since",
        "reader",
        "timeout",
        "watch",
        "writer",
    )

    def __init__(
        self, connection: Any, loop: asyncio.AbstractEventLoop, timeout: float | None
    ) -> None:
        self.connection = connection
        self.loop = loop
        #: The calls written, oldest first: each one's future and the time its reply is
        #: due by (the socket timeout after it was written).
        self.pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.timeout = timeout
        #: The timer that fails the connection when the oldest reply is late.
        self.watch: asyncio.TimerHandle | None = None
        #: Commands written by calls while others wait, sent together by one writer.
        self.outbox: list[bytes] = []
        self.flushing = False
        #: The writer task while it runs (a write the server does not take in blocks
        #: it: failing the connection cancels it).
        self.writer: asyncio.Task[None] | None = None
        #: The loop is given a look at the quiet connection (see the module docstring).
        self.checking = False
        #: When the last reply came (the loop's clock).
        self.quiet_since = loop.time()
        #: Why the connection can no longer be used (None while it can).
        self.failure: BaseException | None = None
        self.reader = loop.create_task(self._read_replies())

    def usable(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a call on ``loop`` may write here at once: not failed, this loop's,
        not being checked, and busy or used a moment ago."""
        if self.failure is not None or self.loop is not loop or self.checking:
            return False
        return bool(self.pending) or loop.time() - self.quiet_since < IDLE_CHECK

    async def send(self, packed: bytes) -> asyncio.Future[Any]:
        """Write ``packed``; the future of its reply (an error reply is its value).

        With no call on the wire it goes out at once. Otherwise replies are due, and
        the calls they wake will write too in this turn of the loop: it waits in the
        outbox, and one writer sends the outbox in one write (one system call and, on
        the server, one read for them all), in call order."""
        if self.failure is not None:  # nothing written
            raise _copy(self.failure)
        loop = self.loop
        future: asyncio.Future[Any] = loop.create_future()
        timeout = self.timeout
        due = float("inf") if timeout is None else loop.time() + timeout
        # A long command goes through the writer too: its write may wait for the
        # server to take it, and only the writer's wait can be cut by the timer.
        busy = bool(self.outbox or self.flushing or self.pending) or len(packed) > DIRECT_MAX
        self.pending.append((future, due))
        if busy:
            self.outbox.append(packed)
            if not self.flushing:
                self.flushing = True
                loop.call_soon(self._flush_soon)
        else:
            try:  # the bytes reach the transport before the first await
                await self.connection.send_packed_command(packed, False)
            except BaseException as exc:
                future.cancel()  # this call raises the failure itself
                self.fail(exc if isinstance(exc, redis.RedisError) else _lost(exc))
                raise
        if self.watch is None and timeout is not None:
            self.watch = loop.call_at(due, self._check_late)
        return future

    def _flush_soon(self) -> None:
        task = self.writer = self.loop.create_task(self._flush())
        task.add_done_callback(_retrieve)

    async def _flush(self) -> None:
        """The writer: send the outbox until it is empty."""
        try:
            while self.outbox and self.failure is None:
                outbox, self.outbox = self.outbox, []
                await self.connection.send_packed_command(b"".join(outbox), False)
        except BaseException as exc:
            self.fail(exc if isinstance(exc, redis.RedisError) else _lost(exc))
            raise
        finally:
            self.flushing = False
            self.writer = None

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

    def fail(self, failure: BaseException) -> None:
        """Give up the connection: every call still waiting gets a connection error,
        and it is closed."""
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
        current = asyncio.current_task()
        if self.writer is not None and self.writer is not current:
            with contextlib.suppress(RuntimeError):
                self.writer.cancel()  # a write the server stopped taking
        if self.reader is not current:
            with contextlib.suppress(RuntimeError):  # its loop is closed already
                self.reader.cancel()  # the reader closes the connection

    async def _read_replies(self) -> None:
        """Hand each reply to the oldest waiting call, until the connection fails (or
        the loop ends: ``asyncio.run`` cancels this task)."""
        connection, pending = self.connection, self.pending
        try:
            while True:
                try:
                    reply = await connection.read_response(disconnect_on_error=False)
                except (redis.ResponseError, redis.BusyLoadingError) as exc:
                    reply = exc  # an error reply: the connection is in step
                if not pending:  # bytes nothing asked for: out of step
                    raise redis.ConnectionError("a reply that no call waits for")
                future = pending.popleft()[0]
                if not future.done():  # a cancelled call's reply is dropped
                    future.set_result(reply)
                if not pending:
                    self.quiet_since = self.loop.time()
        except asyncio.CancelledError:
            self.fail(redis.ConnectionError("the connection was closed"))
            raise
        except redis.RedisError as exc:  # end of file, a protocol error, stray bytes
            self.fail(exc)
        except Exception as exc:  # OSError from the socket, or worse
            self.fail(_lost(exc))
        finally:
            with contextlib.suppress(Exception):
                await connection.disconnect()


def _lost(exc: BaseException) -> redis.ConnectionError:
    return redis.ConnectionError(f"Error on the connection: {exc!r}")


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a writer's failure as seen (the calls waiting on it received it)."""
    if not task.cancelled():
        task.exception()


def _copy(failure: BaseException) -> BaseException:
    """A new exception like ``failure``, for one call (each raises its own)."""
    if isinstance(failure, redis.RedisError):
        with contextlib.suppress(Exception):
            return type(failure)(*failure.args)
    return redis.ConnectionError(f"the connection failed: {failure}")


class AsyncLink(LinkBase[AsyncFunctions]):
    """Runs the library's functions on one server, on one pipelined connection per
    event loop made from the settings."""

    def __init__(
        self, connection_class: Any, kwargs: dict[str, Any], functions: AsyncFunctions
    ) -> None:
        super().__init__(connection_class, kwargs, functions)
        self._wire: _Wire | None = None
        self._connecting: asyncio.Task[_Wire] | None = None
        protocol = self._connection_kwargs.get("protocol")
        self._direct = protocol is None or str(protocol) == "2"
        self._timeout: float | None = self._connection_kwargs.get("socket_timeout")
        # RESP2 whatever redis-py's default, and no socket timeout: the link times
        # replies itself, so redis-py wraps no write or read in a timeout.
        self._connection_kwargs.update(protocol=2, socket_timeout=None)
        self._closed = False
        self._packer: Any = None

    async def __call__(self, script: str, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run ``script`` with ``keys`` and ``args``; its raw reply."""
        if not self._direct or self._functions.evalsha:
            return await self._functions(script, keys, args)
        command = (b"FCALL", self._names[script], len(keys), *keys, *args)
        safe = script in RESEND_SAFE
        try:
            return await self._exchange(command, safe, script)
        except redis.ResponseError as exc:
            if functions_unsupported(exc):  # switches it to EVALSHA
                return await self._functions(script, keys, args)
            if not function_missing(exc):
                raise
        await self._exchange((b"FUNCTION", b"LOAD", b"REPLACE", self._code), True)
        return await self._exchange(command, safe, script)

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
            await asyncio.gather(wire.reader, return_exceptions=True)
        else:
            wire.fail(redis.ConnectionError("the queue was closed"))

    async def _take(self) -> _Wire:
        """This loop's connection, or a new one when it has none or its connection
        failed or was closed by the server; a quiet one is looked at first. Calls that
        find none at once share one connect (or look)."""
        loop = asyncio.get_running_loop()
        wire = self._wire
        if wire is not None:
            if wire.usable(loop):
                return wire
            if wire.loop is not loop:
                self._wire = wire = None  # another loop's: that loop closes it
            elif wire.failure is not None:
                self._wire = wire = None
        connecting = self._connecting
        if connecting is None or connecting.get_loop() is not loop:
            connecting = self._connecting = loop.create_task(self._connect(loop, wire))
            connecting.add_done_callback(self._connected)
        return await asyncio.shield(connecting)

    async def _connect(self, loop: asyncio.AbstractEventLoop, quiet: _Wire | None) -> _Wire:
        """``quiet`` if its reader, given the loop a few turns, met no end of file
        (see the module docstring); else a new connection."""
        if quiet is not None:
            quiet.checking = True
            try:
                for _ in range(LOOKS):
                    await asyncio.sleep(0)
                    if quiet.failure is not None:
                        break
            finally:
                quiet.checking = False
            if quiet.failure is None:
                quiet.quiet_since = loop.time()
                return quiet
        connection = self._connection_class(**self._connection_kwargs)
        try:  # the handshake's replies are read without redis-py's timeout: bound it
            await within(connection.connect(), self._timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(Exception):
                await connection.disconnect()
            raise redis.TimeoutError("Timeout connecting to server") from None
        return _Wire(connection, loop, self._timeout)

    def _packed(self, command: tuple[Any, ...]) -> bytes:
        if self._hiredis is not None:
            packed: bytes = self._hiredis.pack_command(command)
            return packed
        if self._packer is None:  # a connection that never connects: its encoder only
            self._packer = self._connection_class(**self._connection_kwargs)
        return b"".join(self._packer.pack_command(*command))

    def _connected(self, task: asyncio.Task[_Wire]) -> None:
        if self._connecting is task:
            self._connecting = None
        if task.cancelled() or task.exception() is not None:
            return
        if self._closed:  # closed while it connected: the call fails, as it would have
            task.result().fail(redis.ConnectionError("the queue was closed"))
        else:
            self._wire = task.result()

    async def _exchange(self, command: tuple[Any, ...], resend_safe: bool, script: str = "") -> Any:
        """Send ``command`` (a call of ``script``) and wait for its reply, retried as
        the module docstring says."""
        packed = self._packed(command)
        return await call_async(lambda attempt: self._once(packed, attempt), resend_safe, script)

    async def _once(self, packed: bytes, attempt: Attempt) -> Any:
        """One attempt: hand ``packed`` to this loop's connection (``attempt.sent``
        from then on) and wait for its reply. A connection error fails the connection
        (an error reply, ``LOADING`` too, leaves it in step)."""
        wire = self._wire
        try:
            if wire is None or not wire.usable(asyncio.get_running_loop()):
                wire = await self._take()
            if wire.failure is not None:
                raise _copy(wire.failure)  # nothing written
            attempt.sent = True  # from here on it may have been, whole
            reply = await (await wire.send(packed))
        except CONNECTION_ERRORS as exc:
            if wire is not None:
                wire.fail(exc)  # a connection error the server answered, or worse
            raise
        if isinstance(reply, redis.RedisError):
            raise reply  # an error reply, LOADING too: the connection is in step
        return reply
