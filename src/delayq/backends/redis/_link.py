"""The sync face's short path to the server: one connection per thread, no pool.

A script call through ``redis.Redis`` costs 60-70 us of Python per call on top of the
round trip (pool checkout and return, argument encoding, response callbacks,
observability hooks): more than the server spends running a put. :class:`Link` keeps one
redis-py ``Connection`` per thread (and per process: a forked child opens its own), made
from the client pool's ``connection_class`` and ``connection_kwargs``: TCP or unix
socket, TLS, AUTH, SELECT, RESP version and timeouts are the URL's, as redis-py applies
them. A call is the connection's public methods only: ``can_read(0)`` (which connects
first when needed), ``send_packed_command(..., check_health=False)`` of the command
packed by hiredis (``pack_command`` without it), then ``read_response()``. Error replies
come out as redis-py's exception classes; a RESP3 push that arrives before the reply is
redis-py's parser's to handle. Since delayq makes these calls itself, it knows whether a
command was written without hooking redis-py.

Errors and retries follow the one rule of :mod:`._resend` (the loop
:func:`~._io._sync.retry.call`, the decision :func:`~._resend.again`); the link tells it
what it alone knows, whether the command was written (:class:`~._resend.Attempt`):

* a failure while connecting, or a write that failed with a connection error, means
  the server never got the whole command (Redis runs only complete commands), so the
  call is retried on a fresh connection, with backoff; but a connect that timed out
  raises at once (:func:`~._transport.unreachable`: a server that did not answer one
  connect within the connect timeout would make each retry wait as long);
* a failure after the write (reading the reply, or a write that timed out) leaves it
  unknown whether the script ran: only the scripts in :data:`~._scripts.RESEND_SAFE`
  are sent again; any other raises :class:`~delayq.errors.OutcomeUnknown`
  (``ReplyLost`` or ``ReplyTimeout``, which are redis-py's ``ConnectionError`` /
  ``TimeoutError`` too): a put, a claim, an ack... may or may not have happened;
* a connection the server closed while it sat idle (a restart) is seen before sending
  and replaced, so nothing is lost to it: ``can_read(0)`` reports its end of file (or
  stray bytes, or a push that came while idle: replaced too); a ``LOADING`` reply (a
  restarted server still reading its data) ran nothing and is retried too.

The library is loaded (``FUNCTION LOAD REPLACE``) when the server says the function is
missing, then the call is sent again (it did not run). A server without ``FCALL`` (Redis
before 7.0) hands every call to :class:`~._functions.Functions`, which runs EVALSHA.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

import redis

from ..._fork import generation
from ._functions import Functions, FunctionsBase, function_missing, functions_unsupported
from ._io._sync.retry import call
from ._resend import Attempt
from ._scripts import RESEND_SAFE, SCRIPT_NAMES, function_name, library_source
from ._transport import CONNECTION_ERRORS

__all__ = ["Link", "LinkBase", "load_hiredis"]


def load_hiredis() -> Any:
    """The hiredis module, or None when it is not installed."""
    try:
        import hiredis  # noqa: PLC0415 (optional: redis-py works without it)
    except ImportError:
        return None
    return hiredis


class _Wire:
    """One thread's connection, the process generation it was made in, and whether
    it is connected (as far as delayq knows: the server may have closed it)."""

    __slots__ = ("connected", "connection", "fork")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.fork = generation()
        self.connected = False

    def drop(self) -> None:
        """Close the connection (the next call connects again)."""
        self.connected = False
        self.connection.disconnect()


class _Local(threading.local):
    wire: _Wire | None = None


F = TypeVar("F", bound=FunctionsBase)


class LinkBase(Generic[F]):
    """What the sync and async links hold: the connection settings
    (:func:`~._transport.connection_settings`), the library's function names and code,
    hiredis, and ``functions``, redis-py's path (EVALSHA too) for calls the link does
    not take."""

    def __init__(self, connection_class: Any, kwargs: dict[str, Any], functions: F) -> None:
        self._connection_class = connection_class
        self._connection_kwargs = dict(kwargs)
        self._functions = functions
        self._names = {name: function_name(name).encode() for name in SCRIPT_NAMES}
        self._code = library_source()[1]
        self._hiredis = load_hiredis()


class Link(LinkBase[Functions]):
    """Runs the library's functions on one server, on a connection per thread made
    from the settings (a pool's ``max_connections`` does not apply to them)."""

    def __init__(self, connection_class: Any, kwargs: dict[str, Any], functions: Functions) -> None:
        super().__init__(connection_class, kwargs, functions)
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
            return self._exchange(command, safe, script)
        except redis.ResponseError as exc:
            if functions_unsupported(exc):
                return self._functions(script, keys, args)  # switches it to EVALSHA
            if not function_missing(exc):
                raise
        self._exchange((b"FUNCTION", b"LOAD", b"REPLACE", self._code), True)
        return self._exchange(command, safe, script)

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

    @staticmethod
    def _ready(wire: _Wire) -> Any:
        """The connection, connected; one that reads as ready before anything was sent
        (the server closed it while idle, or stray bytes) is replaced first. A connect
        that fails raises (once: not again at once)."""
        connection = wire.connection
        if wire.connected:
            try:
                stale = connection.can_read(0)
            except CONNECTION_ERRORS:
                stale = True
            if not stale:
                return connection
            wire.drop()
        connection.connect()
        wire.connected = True
        return connection

    def _packed(self, connection: Any, command: tuple[Any, ...]) -> Any:
        if self._hiredis is not None:
            return [self._hiredis.pack_command(command)]
        return connection.pack_command(*command)

    def _exchange(self, command: tuple[Any, ...], resend_safe: bool, script: str = "") -> Any:
        """Send ``command`` (a call of ``script``) and read its reply, retried as the
        module docstring says."""
        return call(lambda attempt: self._once(command, attempt), resend_safe, script)

    def _once(self, command: tuple[Any, ...], attempt: Attempt) -> Any:
        """One attempt: write ``command`` (``attempt.sent`` once it may have been
        written whole) and read its reply. A connection left out of step is dropped."""
        wire = self._wire()
        try:
            connection = self._ready(wire)
            packed = self._packed(connection, command)
            attempt.sent = True
            try:
                connection.send_packed_command(packed, False)
            except BaseException as exc:
                wire.drop()  # maybe a partial write: out of step
                if isinstance(exc, redis.ConnectionError):
                    attempt.sent = False  # the socket failed under the write: incomplete
                raise
            return connection.read_response()
        except redis.ResponseError:
            raise  # an error reply: the connection is in step
        except BaseException as exc:
            if attempt.sent or isinstance(exc, CONNECTION_ERRORS):
                wire.drop()  # lost, or the reply may still come: out of step
            raise
